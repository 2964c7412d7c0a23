// Package testenv gives integration tests the addresses of the real services
// they need. A test asks for a service; when its variable is unset the test
// is skipped with a message saying how to run it, except under CI (CI set to
// a true value), where a missing service fails the test so that a green run
// always means the integration tests ran.
package testenv

import (
	"os"
	"strconv"
	"testing"
)

// Environment variables read by integration tests.
const (
	PostgresVar = "PETSTORE_TEST_DATABASE_URL"
	RedisVar    = "PETSTORE_TEST_REDIS_ADDR"
)

// PostgresURL returns the PostgreSQL URL for integration tests.
func PostgresURL(tb testing.TB) string {
	tb.Helper()
	return require(tb, PostgresVar, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// RedisAddr returns the host:port of a Redis for integration tests.
func RedisAddr(tb testing.TB) string {
	tb.Helper()
	return require(tb, RedisVar, "127.0.0.1:6379")
}

// InCI reports whether the tests run under CI, where nothing may be skipped.
func InCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

func require(tb testing.TB, name, example string) string {
	tb.Helper()
	if v := os.Getenv(name); v != "" {
		return v
	}
	if InCI() {
		tb.Fatalf("%s is not set: CI must provide this service (e.g. %s=%s)", name, name, example)
	}
	tb.Skipf("%s not set; set it to run this integration test (e.g. %s=%s)", name, name, example)
	return ""
}
