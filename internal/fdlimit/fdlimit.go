// Package fdlimit raises the process's open-file limit and works out how
// many held polls it leaves room for. A held poll costs one file descriptor
// (its socket), with one relay or several: the Redis subscriber connections
// are shared by every held poll. Past the limit, accepting connections fails
// hard.
package fdlimit

import (
	"fmt"
	"syscall"

	"github.com/flamenet/relay/internal/procstat"
)

// Raise sets the soft open-file limit to the hard limit and returns the
// soft limit in force afterwards.
func Raise() (uint64, error) {
	soft, _, err := RaiseTo(0)
	return soft, err
}

// RaiseTo is Raise that first lifts the hard limit to need when it is
// lower and the process may (as root, up to fs.nr_open). Calling
// setrlimit, rather than relying on the Go runtime's own raise, makes child
// processes inherit the raised limits. It returns the limits in force
// afterwards.
func RaiseTo(need uint64) (soft, hard uint64, err error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, fmt.Errorf("fdlimit: getrlimit: %w", err)
	}
	if lim.Max < need {
		up := lim
		up.Max = need
		if n, err := procstat.SysctlInts("fs/nr_open"); err == nil && len(n) == 1 {
			up.Max = min(up.Max, uint64(n[0]))
		}
		up.Cur = up.Max
		// Refused without the privilege; the soft limit still goes up below.
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &up) == nil {
			lim = up
		}
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			return lim.Cur, lim.Max, fmt.Errorf("fdlimit: setrlimit: %w", err)
		}
		lim = raised
	}
	return lim.Cur, lim.Max, nil
}

// Current returns the open-file limit in force: soft and hard.
func Current() (soft, hard uint64, err error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, fmt.Errorf("fdlimit: getrlimit: %w", err)
	}
	return lim.Cur, lim.Max, nil
}

// Budget says what a relay's settings need besides held polls.
type Budget struct {
	PerPoll  int // descriptors one held poll costs: its socket
	Reserved int // store and Redis pools, sends in flight, listeners, logs
}

// HeldPolls returns how many held polls fit in limit descriptors.
func (b Budget) HeldPolls(limit uint64) int {
	if limit <= uint64(b.Reserved) {
		return 0
	}
	return int((limit - uint64(b.Reserved)) / uint64(b.PerPoll))
}

// Need returns the open-file limit that n held polls need.
func (b Budget) Need(n int) uint64 {
	return uint64(b.Reserved) + uint64(n)*uint64(b.PerPoll)
}
