package chartest

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Prometheus operator's monitoring.coreos.com/v1 kinds are not in
// k8s.io/api, and its Go module pulls in far more than these tests need.
// These structs hold the subset of the operator's schema that the chart may
// use; decoding is strict, so a field outside it (a typo, or a field the
// chart starts to use) fails until it is added here from the operator's CRD.

type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              serviceMonitorSpec `json:"spec"`
}

type serviceMonitorSpec struct {
	JobLabel          string                `json:"jobLabel,omitempty"`
	Selector          metav1.LabelSelector  `json:"selector"`
	NamespaceSelector *namespaceSelector    `json:"namespaceSelector,omitempty"`
	Endpoints         []serviceMonitorPoint `json:"endpoints"`
}

type namespaceSelector struct {
	Any        bool     `json:"any,omitempty"`
	MatchNames []string `json:"matchNames,omitempty"`
}

type serviceMonitorPoint struct {
	Port          string `json:"port,omitempty"`
	Path          string `json:"path,omitempty"`
	Scheme        string `json:"scheme,omitempty"`
	Interval      string `json:"interval,omitempty"`
	ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
	HonorLabels   bool   `json:"honorLabels,omitempty"`
}

type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ruleFile `json:"spec"`
}

// ruleFile is also the shape of a plain Prometheus rules file (groups:).
type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []rule `json:"rules"`
}

type rule struct {
	Alert         string            `json:"alert,omitempty"`
	Record        string            `json:"record,omitempty"`
	Expr          string            `json:"expr"`
	For           string            `json:"for,omitempty"`
	KeepFiringFor string            `json:"keep_firing_for,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}
