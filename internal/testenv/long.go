package testenv

import (
	"runtime"
	"strings"
	"testing"
)

// Long marks a test that make test leaves out: -short skips it, and make
// test-long runs it. make test-long finds the tests it runs by this call
// (or Cases) in their own function, so it must be made there, never in a
// helper or a subtest: a test that -short skips and make test-long does
// not select would run in neither.
func Long(t *testing.T) {
	t.Helper()
	calledByTest(t, "Long")
	if testing.Short() {
		t.Skip("long: runs in make test-long")
	}
}

// Cases returns how many cases a property test runs: n, or short under
// -short. make test runs the short count, make test-long (which finds the
// test by this call, as it finds Long's) all n; with a fixed seed the
// short run is the full run's start. Call it in the test function itself.
func Cases(t *testing.T, short, n int) int {
	t.Helper()
	calledByTest(t, "Cases")
	if testing.Short() {
		return min(short, n)
	}
	return n
}

// calledByTest fails t unless the first function outside this package on
// the stack is t's own test function.
func calledByTest(t *testing.T, what string) {
	t.Helper()
	pcs := make([]uintptr, 8)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs)])
	for {
		f, more := frames.Next()
		if !strings.Contains(f.Function, "/internal/testenv.") {
			if name := f.Function[strings.LastIndex(f.Function, ".")+1:]; name != t.Name() {
				t.Fatalf("testenv.%s called from %s in %s: call it in the test function itself, where make test-long looks for it", what, name, t.Name())
			}
			return
		}
		if !more {
			return
		}
	}
}
