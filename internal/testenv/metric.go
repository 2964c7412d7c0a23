package testenv

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// MetricValue reads a counter's or gauge's current value.
func MetricValue(tb testing.TB, m prometheus.Metric) float64 {
	tb.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		tb.Fatal(err)
	}
	if c := out.GetCounter(); c != nil {
		return c.GetValue()
	}
	return out.GetGauge().GetValue()
}

// CounterSum gathers g and returns the sum of the counters (or gauges) of
// family name whose labels include every one in labels.
func CounterSum(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// Histogram gathers g and returns the histogram of family name, which must
// have exactly one series.
func Histogram(tb testing.TB, g prometheus.Gatherer, name string) *dto.Histogram {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram()
		}
	}
	tb.Fatalf("no histogram %s with one series", name)
	return nil
}
