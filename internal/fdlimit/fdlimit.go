// Package fdlimit raises the process's open-file limit and works out how
// many held polls it leaves room for. A held poll costs one file descriptor
// (its socket) with one relay, and two (plus a Redis connection) with
// several; past the limit, accepting connections fails hard.
package fdlimit

import (
	"fmt"
	"syscall"
)

// Raise sets the soft open-file limit to the hard limit and returns the
// soft limit in force afterwards.
func Raise() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("fdlimit: getrlimit: %w", err)
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			return lim.Cur, fmt.Errorf("fdlimit: setrlimit: %w", err)
		}
		lim = raised
	}
	return lim.Cur, nil
}

// Budget says what a relay's settings need besides held polls.
type Budget struct {
	PerPoll  int // descriptors one held poll costs: 1 alone, 2 with Redis wake-ups
	Reserved int // store and Redis pools, sends in flight, listeners, logs
}

// HeldPolls is how many held polls fit in limit descriptors.
func (b Budget) HeldPolls(limit uint64) int {
	if limit <= uint64(b.Reserved) {
		return 0
	}
	return int((limit - uint64(b.Reserved)) / uint64(b.PerPoll))
}

// Need is the open-file limit that n held polls need.
func (b Budget) Need(n int) uint64 {
	return uint64(b.Reserved) + uint64(n)*uint64(b.PerPoll)
}
