//go:build !linux

package testenv

import "os/exec"

// EndWithTest does nothing here: only Linux kills a process when the one
// that started it ends (Pdeathsig).
func EndWithTest(cmd *exec.Cmd) {}
