//go:build unix

package testenv

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time this process has used so far, user and
// system, in all its threads (so the garbage collector's too).
func ProcessCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
