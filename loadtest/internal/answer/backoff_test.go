package answer

import (
	"testing"
	"time"
)

// TestCarefulBackoff: the load tester's settings of the backoff
// (internal/backoff): 25 to 50 ms at first, doubling up to a second, and a
// relay's Retry-After, at a second or more, waited exactly.
func TestCarefulBackoff(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		attempt int
		after   time.Duration
		lo, hi  time.Duration
	}{
		{0, 0, 25 * ms, 50 * ms},
		{4, 0, 400 * ms, 800 * ms},
		{5, 0, 800 * ms, time.Second},
		{6, 0, time.Second, time.Second},
		{0, time.Second, time.Second, time.Second},
		{6, 3 * time.Second, 3 * time.Second, 3 * time.Second},
	} {
		p := Backoff
		p.Rand = func(int64) int64 { return 0 }
		lo := p.Wait(tc.attempt, tc.after)
		p.Rand = func(n int64) int64 { return n - 1 }
		hi := p.Wait(tc.attempt, tc.after)
		if lo != tc.lo || hi != tc.hi {
			t.Errorf("attempt %d, Retry-After %v: [%v, %v], want [%v, %v]", tc.attempt, tc.after, lo, hi, tc.lo, tc.hi)
		}
	}
}
