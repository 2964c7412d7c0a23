package main

import (
	"os/exec"
	"syscall"
)

// endWithParent has the kernel kill cmd's process when the soak's
// ends, however it ends, so that a soak killed outright leaves no Redis
// behind. (The signal goes when the thread that started the process
// ends; Go ends a thread only with a goroutine locked to it, which the
// soak never does.)
func endWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
