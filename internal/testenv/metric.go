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
