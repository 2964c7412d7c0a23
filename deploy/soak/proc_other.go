//go:build !linux

package main

import "os/exec"

// endWithParent does nothing here: only Linux kills a process when the
// one that started it ends.
func endWithParent(cmd *exec.Cmd) {}
