package relay

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// setSendLowWater bounds the bytes the kernel holds unsent for c: past
// them a write waits (and so meets its deadline) until the client reads.
func setSendLowWater(c *net.TCPConn, n int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, n)
	}); err != nil {
		return err
	}
	return serr
}

// sendersWrite: a send may write to a stream's socket itself (inline.go).
const sendersWrite = true

// writeNonblocking writes what c's socket takes of b at once, without
// waiting for room: fewer bytes than b's, and no error, when it is full.
func writeNonblocking(c syscall.RawConn, b []byte) (int, error) {
	var n int
	var werr error
	if err := c.Control(func(fd uintptr) {
		for {
			n, werr = unix.Write(int(fd), b)
			if werr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return 0, err
	}
	if werr == unix.EAGAIN {
		return 0, nil
	}
	if werr != nil {
		return 0, werr
	}
	return n, nil
}
