package relay

import (
	"net"

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
