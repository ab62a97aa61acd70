//go:build !linux

package relay

import "net"

// setSendLowWater does nothing here: the kernel takes as much of an
// answer as its send buffer holds, and only the rest meets the deadline.
func setSendLowWater(*net.TCPConn, int) error { return nil }
