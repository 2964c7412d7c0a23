//go:build !unix

package testenv

import "time"

// ProcessCPU reports that this system's CPU time is not read.
func ProcessCPU() (time.Duration, bool) { return 0, false }
