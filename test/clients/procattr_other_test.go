//go:build !linux

package clients

import "os/exec"

func dieWithTest(*exec.Cmd) {}
