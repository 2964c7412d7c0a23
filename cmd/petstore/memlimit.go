package main

import (
	"bytes"
	"io/fs"
	"strconv"
)

// memoryLimitShare is the part of the container's memory limit given to the
// Go runtime as its soft limit (GOMEMLIMIT): the rest is headroom for what
// the runtime does not count (thread stacks outside the heap, the binary,
// the kernel's socket buffers charged to the container).
const memoryLimitShare = 0.9

// memoryLimit returns the soft memory limit the Go runtime should keep to
// and where it comes from. GOMEMLIMIT, when set, is the runtime's own and
// is left alone ("GOMEMLIMIT", 0). Otherwise the container's memory limit
// is read from the cgroup files a container sees as its own (cgroup v2's
// memory.max, or v1's memory.limit_in_bytes) and nine tenths of it are
// returned, with the file's name; with no limit there is nothing to set
// ("", 0).
//
// Without a soft limit the collector lets the heap double past what is
// live before it runs, whatever the container allows, so a burst of
// allocation can end in an OOM kill that collecting sooner would have
// avoided; with one, it collects harder as the limit nears instead.
func memoryLimit(getenv func(string) string, root fs.FS) (limit int64, source string) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, "GOMEMLIMIT"
	}
	for _, name := range []string{"sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := fs.ReadFile(root, name)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
		if err != nil || n <= 0 || n >= unlimitedCgroupV1 {
			// "max" (v2), or v1's page-rounded largest value: no limit.
			return 0, ""
		}
		return int64(float64(n) * memoryLimitShare), "/" + name
	}
	return 0, ""
}

// unlimitedCgroupV1 is where cgroup v1's "no limit" values start (the
// kernel reports the largest int64 rounded down to a page).
const unlimitedCgroupV1 = 1 << 62
