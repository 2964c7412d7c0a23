package testenv

import (
	"runtime"
	"strings"
	"testing"
)

// Long marks a test that make test leaves out: -short skips it, and make
// test-long runs it. make test-long finds the tests it runs by this call
// in their source, so it must be made first in the test function itself,
// never in a helper or a subtest: a test that -short skips and make
// test-long does not select would run in neither.
func Long(t *testing.T) {
	t.Helper()
	pcs := make([]uintptr, 2)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs)])
	frames.Next() // Long
	f, _ := frames.Next()
	if name := f.Function[strings.LastIndex(f.Function, ".")+1:]; name != t.Name() {
		t.Fatalf("testenv.Long called from %s in %s: call it in the test function itself, where make test-long looks for it", name, t.Name())
	}
	if testing.Short() {
		t.Skip("long: runs in make test-long")
	}
}
