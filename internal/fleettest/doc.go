// Package fleettest holds the system tests of the fleet as users run it:
// several `petstore serve` processes built from this module, a private
// redis-server and HAProxy in front, all real processes on free loopback
// ports, each owned by the test that starts it and stopped by PID.
//
// The tests inject real faults (SIGTERM for a rollout, SIGKILL for a lost
// replica, SIGSTOP/SIGCONT and SIGKILL for a stalled or crashed Redis, a
// maxmemory under what Redis uses for a full one) and
// assert what clients see: status codes, latencies against the configured
// Redis timeout, and admissions per window judged soundly from the
// client's send and receive times (see windowCount), read on the wall
// clock that Redis's TIME follows. Each scenario logs
// what it measured; run them with
//
//	go test -count=1 -v ./internal/fleettest/
//
// make test passes -short, which leaves the longest scenarios (each calls
// testenv.Long) to make test-long.
//
// They need redis-server and haproxy on PATH (.ci/services installs them).
// Without them the package is skipped with a message, except under CI,
// where a missing tool fails the run. The package has no non-test code.
package fleettest
