package testenv

import (
	"os/exec"
	"syscall"
)

// EndWithTest has the kernel kill cmd's process when the test process
// that starts it exits, however it exits: a test binary that panics or
// is killed runs no cleanup, and a redis-server or replica it started
// would otherwise keep running, and keep its port. Call it before
// cmd.Start. (The signal goes when the thread that started the process
// ends; Go ends a thread only with a goroutine that locked itself to it,
// which the tests do not do.)
func EndWithTest(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
