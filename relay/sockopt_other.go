//go:build !linux

package relay

import (
	"errors"
	"net"
	"syscall"
)

// setSendLowWater does nothing here: the kernel takes as much of an
// answer as its send buffer holds, and only the rest meets the deadline.
func setSendLowWater(*net.TCPConn, int) error { return nil }

// sendersWrite: only the stream's goroutine writes to it (inline.go).
const sendersWrite = false

func writeNonblocking(syscall.RawConn, []byte) (int, error) { return 0, errors.ErrUnsupported }
