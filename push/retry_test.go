package push

import (
	"testing"
	"time"
)

// TestRetryWait: the push's settings of the backoff (internal/backoff):
// from the default base, retry n waits within the upper half of 0.5 s
// doubled n-1 times, at most 30 s, and never less than the provider's
// Retry-After, plus up to a tenth of it.
func TestRetryWait(t *testing.T) {
	const s = time.Second
	for _, tc := range []struct {
		attempt int
		after   time.Duration
		lo, hi  time.Duration
	}{
		{1, 0, s / 4, s / 2},
		{2, 0, s / 2, s},
		{3, 0, s, 2 * s},
		{7, 0, 16 * s, 30 * s},
		{100, 0, 30 * s, 30 * s},
		{1, 10 * s, 10 * s, 11 * s},
		{3, 1500 * time.Millisecond, 1500 * time.Millisecond, 2 * s}, // the draw decides whether it counts
		{1, time.Minute, time.Minute, time.Minute},                   // past the cap: exactly
	} {
		p := retryPolicy(DefaultRetryBase)
		p.Rand = func(int64) int64 { return 0 }
		lo := p.Wait(tc.attempt-1, tc.after)
		p.Rand = func(n int64) int64 { return n - 1 }
		hi := p.Wait(tc.attempt-1, tc.after)
		if lo != tc.lo || hi != tc.hi {
			t.Errorf("attempt %d, Retry-After %v: [%v, %v], want [%v, %v]", tc.attempt, tc.after, lo, hi, tc.lo, tc.hi)
		}
	}
}
