package main

import (
	"slices"
	"testing"
)

// TestKeyPickerSpreadsRates: every key is drawn, at rates that span
// keySpread from the quietest to the busiest, each near its weight.
func TestKeyPickerSpreadsRates(t *testing.T) {
	const keys, draws = 500, 2_000_000
	p := newKeyPicker(keys)
	counts := make([]int, keys)
	for n := range draws {
		i := p.key(n)
		if i < 0 || i >= keys {
			t.Fatalf("key(%d) = %d, outside [0, %d)", n, i, keys)
		}
		counts[i]++
	}
	total := p.cum[keys-1]
	weights := make([]float64, keys)
	for i := range keys {
		w := p.cum[i]
		if i > 0 {
			w -= p.cum[i-1]
		}
		weights[i] = w
		want := w / total * draws
		if got := float64(counts[i]); got < 0.85*want || got > 1.15*want {
			t.Errorf("key %d drawn %d times, want about %.0f (its weight)", i, counts[i], want)
		}
	}
	lo, hi := slices.Min(weights), slices.Max(weights)
	if r := hi / lo; r < 0.95*keySpread || r > keySpread {
		t.Errorf("busiest key's weight / quietest's = %.2f, want about %d", r, keySpread)
	}
	// The same n, the same key: a run's load is reproducible.
	for n := range 1000 {
		if p.key(n) != newKeyPicker(keys).key(n) {
			t.Fatalf("key(%d) differs between two pickers", n)
		}
	}
	// Spread evenly: a quarter of the keys from the list's start carry
	// about a quarter of the weight, whatever order the plans are in.
	if share := p.cum[keys/4-1] / total; share < 0.22 || share > 0.28 {
		t.Errorf("the first quarter of the keys carry %.2f of the weight, want about 0.25", share)
	}
}
