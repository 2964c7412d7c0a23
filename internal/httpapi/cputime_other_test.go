//go:build !unix

package httpapi

import "time"

// processCPU reports that this system's CPU time is not read.
func processCPU() (time.Duration, bool) { return 0, false }
