package clients

import (
	"os/exec"
	"syscall"
)

// dieWithTest has the kernel kill cmd when the test process dies, even on a
// panic or a timeout that skips the cleanups.
func dieWithTest(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
