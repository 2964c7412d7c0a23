package main

import (
	"testing"
	"testing/fstest"
)

func TestMemoryLimit(t *testing.T) {
	const (
		v2 = "sys/fs/cgroup/memory.max"
		v1 = "sys/fs/cgroup/memory/memory.limit_in_bytes"
	)
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		name   string
		getenv func(string) string
		files  map[string]string
		limit  int64
		source string
	}{
		{"v2 limit", noEnv, map[string]string{v2: "536870912\n"}, 483183820, "/" + v2},
		{"v2 without a limit", noEnv, map[string]string{v2: "max\n"}, 0, ""},
		{"v1 limit", noEnv, map[string]string{v1: "268435456\n"}, 241591910, "/" + v1},
		{"v1 without a limit", noEnv, map[string]string{v1: "9223372036854771712\n"}, 0, ""},
		{"v2 is read before v1", noEnv, map[string]string{v2: "max\n", v1: "268435456\n"}, 0, ""},
		{"no cgroup files", noEnv, nil, 0, ""},
		{"unreadable value", noEnv, map[string]string{v2: "lots\n"}, 0, ""},
		{"zero", noEnv, map[string]string{v2: "0\n"}, 0, ""},
		{"GOMEMLIMIT wins", func(k string) string {
			if k == "GOMEMLIMIT" {
				return "300MiB"
			}
			return ""
		}, map[string]string{v2: "536870912\n"}, 0, "GOMEMLIMIT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fstest.MapFS{}
			for name, data := range tc.files {
				root[name] = &fstest.MapFile{Data: []byte(data)}
			}
			limit, source := memoryLimit(tc.getenv, root)
			if limit != tc.limit || source != tc.source {
				t.Fatalf("memoryLimit = %d, %q; want %d, %q", limit, source, tc.limit, tc.source)
			}
		})
	}
}
