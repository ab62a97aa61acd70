// Package backoff paces retries: a wait that doubles with each retry up to
// a cap, jittered so that those refused together do not come back
// together, and never shorter than what the server asked for.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy is one caller's backoff. Base and Cap are positive; with either
// not, only the floor makes a wait.
type Policy struct {
	// Base is the first wait before its jitter; each retry doubles it.
	Base time.Duration
	// Cap bounds the doubling and everything added at random: no wait is
	// longer, unless its floor is.
	Cap time.Duration
	// Rand returns a random number in [0, n), n > 0; nil is
	// math/rand/v2's Int64N. Tests set it to see a wait's least and most.
	Rand func(n int64) int64
}

// Wait returns the wait before retry n (0 for the first): Base doubled n
// times, at most Cap, plus a random extra of up to as much again, the sum
// at most Cap. It is never less than floor, a server's Retry-After (0 for
// none). A floor that decides the wait gets up to a tenth more, within
// Cap, so that those told the same instant do not all come back at it; a
// floor above Cap is waited exactly, since nothing random may pass Cap.
func (p Policy) Wait(n int, floor time.Duration) time.Duration {
	draw := p.Rand
	if draw == nil {
		draw = rand.Int64N
	}
	var w time.Duration
	if p.Base > 0 && p.Cap > 0 {
		d := p.Base
		for i := 0; i < n && d < p.Cap; i++ {
			if d > p.Cap/2 {
				d = p.Cap // doubling would pass it, or overflow
			} else {
				d *= 2
			}
		}
		d = min(d, p.Cap)
		w = p.Cap
		if d < p.Cap {
			// Compared, not added, so that a Cap near the largest
			// Duration cannot overflow.
			if extra := time.Duration(draw(int64(d) + 1)); extra < p.Cap-d {
				w = d + extra
			}
		}
	}
	switch {
	case floor <= w:
		return w
	case floor >= p.Cap:
		return floor
	}
	if extra := time.Duration(draw(int64(floor/10) + 1)); extra < p.Cap-floor {
		return floor + extra
	}
	return p.Cap
}
