package backoff

import (
	"math"
	"testing"
	"time"
)

const ms = time.Millisecond

// least and most stand in for the randomness: the smallest and the largest
// draw, so that a wait's bounds are seen exactly.
func least(int64) int64  { return 0 }
func most(n int64) int64 { return n - 1 }

// bounds is p's least and most wait before retry n.
func bounds(p Policy, n int, floor time.Duration) (lo, hi time.Duration) {
	p.Rand = least
	lo = p.Wait(n, floor)
	p.Rand = most
	return lo, p.Wait(n, floor)
}

// TestJitter: retry n waits Base doubled n times plus a random extra of up
// to as much again, both ends reached; the default randomness stays within
// them and varies.
func TestJitter(t *testing.T) {
	p := Policy{Base: 100 * ms, Cap: time.Hour}
	for n, want := range []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms} {
		if lo, hi := bounds(p, n, 0); lo != want || hi != 2*want {
			t.Errorf("retry %d: [%v, %v], want [%v, %v]", n, lo, hi, want, 2*want)
		}
	}
	seen := map[time.Duration]bool{}
	for range 1000 {
		d := p.Wait(2, 0)
		if d < 400*ms || d > 800*ms {
			t.Fatalf("retry 2: %v outside [400ms, 800ms]", d)
		}
		seen[d] = true
	}
	if len(seen) < 2 {
		t.Fatalf("1000 waits, all %v: no jitter", p.Wait(2, 0))
	}
}

// TestCap: the doubling stops at Cap, and the random extra never takes a
// wait past it; near the largest Duration neither overflows.
func TestCap(t *testing.T) {
	p := Policy{Base: time.Second, Cap: 5 * time.Second}
	for _, tc := range []struct {
		n      int
		lo, hi time.Duration
	}{
		{1, 2 * time.Second, 4 * time.Second},
		{2, 4 * time.Second, 5 * time.Second}, // the extra cut at Cap
		{3, 5 * time.Second, 5 * time.Second}, // at Cap: nothing random left
		{1000, 5 * time.Second, 5 * time.Second},
	} {
		if lo, hi := bounds(p, tc.n, 0); lo != tc.lo || hi != tc.hi {
			t.Errorf("retry %d: [%v, %v], want [%v, %v]", tc.n, lo, hi, tc.lo, tc.hi)
		}
	}
	p.Rand = func(n int64) int64 { return n / 2 }
	if d := p.Wait(2, 0); d != 5*time.Second {
		t.Errorf("retry 2, a middle draw: %v, want 5s", d)
	}
	huge := Policy{Base: time.Second, Cap: math.MaxInt64}
	for _, tc := range []struct {
		n      int
		lo, hi time.Duration
	}{
		{33, time.Second << 33, math.MaxInt64}, // the extra would overflow
		{34, math.MaxInt64, math.MaxInt64},     // the doubling would
		{1 << 20, math.MaxInt64, math.MaxInt64},
	} {
		if lo, hi := bounds(huge, tc.n, 0); lo != tc.lo || hi != tc.hi {
			t.Errorf("largest Cap, retry %d: [%v, %v], want [%v, %v]", tc.n, lo, hi, tc.lo, tc.hi)
		}
	}
}

// TestRetryAfter: a wait is never shorter than its floor; a floor that
// decides it gets up to a tenth more, within Cap; a floor above Cap is
// waited exactly.
func TestRetryAfter(t *testing.T) {
	p := Policy{Base: 100 * ms, Cap: 10 * time.Second}
	for _, tc := range []struct {
		name   string
		n      int
		floor  time.Duration
		lo, hi time.Duration
	}{
		{"none", 0, 0, 100 * ms, 200 * ms},
		{"below the wait", 0, 50 * ms, 100 * ms, 200 * ms},
		{"above the least draw only", 0, 150 * ms, 150 * ms, 200 * ms},
		{"met by the most draw", 0, 200 * ms, 200 * ms, 200 * ms},
		{"above the wait", 0, 3 * time.Second, 3 * time.Second, 3300 * ms},
		{"above a later wait", 3, 3 * time.Second, 3 * time.Second, 3300 * ms},
		{"its tenth cut at Cap", 0, 9500 * ms, 9500 * ms, 10 * time.Second},
		{"at Cap", 0, 10 * time.Second, 10 * time.Second, 10 * time.Second},
		{"just above Cap", 0, 10*time.Second + 1, 10*time.Second + 1, 10*time.Second + 1},
		{"above Cap", 0, time.Minute, time.Minute, time.Minute},
		{"above Cap, at Cap", 1000, time.Minute, time.Minute, time.Minute},
	} {
		if lo, hi := bounds(p, tc.n, tc.floor); lo != tc.lo || hi != tc.hi {
			t.Errorf("%s: [%v, %v], want [%v, %v]", tc.name, lo, hi, tc.lo, tc.hi)
		}
	}
	p.Rand = func(n int64) int64 { return n / 2 }
	if d := p.Wait(0, 9600*ms); d != 10*time.Second {
		t.Errorf("a twentieth more than 9.6s, a middle draw: %v, want it cut at 10s", d)
	}
}

// TestNotPositive: without a positive Base or Cap only the floor counts,
// and Rand is only ever asked for a number below a positive n, which
// math/rand/v2 panics without.
func TestNotPositive(t *testing.T) {
	for _, tc := range []struct {
		p      Policy
		floor  time.Duration
		lo, hi time.Duration
	}{
		{Policy{}, 0, 0, 0},
		{Policy{}, 2 * time.Second, 2 * time.Second, 2 * time.Second},
		{Policy{Base: -time.Second, Cap: 10 * time.Second}, 2 * time.Second, 2 * time.Second, 2200 * ms},
		{Policy{Base: time.Second, Cap: -time.Second}, 2 * time.Second, 2 * time.Second, 2 * time.Second},
	} {
		if lo, hi := bounds(tc.p, 3, tc.floor); lo != tc.lo || hi != tc.hi {
			t.Errorf("%+v, floor %v: [%v, %v], want [%v, %v]", tc.p, tc.floor, lo, hi, tc.lo, tc.hi)
		}
	}
	for _, p := range []Policy{{}, {Base: 1, Cap: 1}, {Base: 1, Cap: 2}, {Base: time.Second, Cap: math.MaxInt64}} {
		p.Rand = func(n int64) int64 {
			if n <= 0 {
				t.Fatalf("%v, %v: Rand asked for a number below %d", p.Base, p.Cap, n)
			}
			return n - 1
		}
		for n := range 70 {
			for _, floor := range []time.Duration{0, 1, 9, time.Second, math.MaxInt64} {
				p.Wait(n, floor)
			}
		}
	}
}
