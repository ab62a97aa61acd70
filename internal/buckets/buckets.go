// Package buckets is a token bucket for each key (a household's sends, a
// device's polls, a client address's pairing attempts), bounded by the
// keys active now rather than every key ever seen.
package buckets

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Buckets holds a token bucket for each key. A bucket that has filled up
// again is the same as a new one, so idle keys are forgotten whenever the
// map grows past Sweep: memory follows the keys active now, not every key
// ever seen. (A device's poll bucket forgotten so starts full, and its next
// poll is not free.)
type Buckets[K comparable] struct {
	rate  rate.Limit
	burst int

	mu sync.Mutex
	m  map[K]*bucket
}

type bucket struct {
	*rate.Limiter
	// cursor is the highest cursor a poll of the device stood at.
	cursor int64
}

// Sweep is the map size past which idle buckets are dropped.
const Sweep = 4096

// New returns buckets that hold burst tokens each, refilled at r a second.
func New[K comparable](r float64, burst int) *Buckets[K] {
	return &Buckets[K]{rate: rate.Limit(r), burst: burst, m: make(map[K]*bucket)}
}

// Allow takes a token from key's bucket.
func (b *Buckets[K]) Allow(key K, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	bk, _ := b.get(key, now)
	return bk.AllowN(now, 1)
}

// Take takes a token from key's bucket, or reports how long until there
// is one.
func (b *Buckets[K]) Take(key K, now time.Time) (ok bool, wait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	bk, _ := b.get(key, now)
	return TakeAt(bk.Limiter, now)
}

// TakeAt takes a token from l at now, or reports how long until there is
// one (and takes none).
func TakeAt(l *rate.Limiter, now time.Time) (ok bool, wait time.Duration) {
	r := l.ReserveN(now, 1)
	if !r.OK() {
		return false, time.Minute
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// AllowProgress lets through for free a poll whose cursor is above every
// earlier one's of its device, and takes a token for any other.
func (b *Buckets[K]) AllowProgress(key K, cursor int64, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	bk, fresh := b.get(key, now)
	switch {
	case fresh:
		bk.cursor = cursor
	case cursor > bk.cursor:
		bk.cursor = cursor
		return true
	}
	return bk.AllowN(now, 1)
}

// get returns key's bucket, made (fresh) if there was none; b.mu is held.
func (b *Buckets[K]) get(key K, now time.Time) (bk *bucket, fresh bool) {
	if bk, ok := b.m[key]; ok {
		return bk, false
	}
	if len(b.m) >= Sweep {
		for k, v := range b.m {
			if v.TokensAt(now) >= float64(b.burst) {
				delete(b.m, k)
			}
		}
	}
	bk = &bucket{Limiter: rate.NewLimiter(b.rate, b.burst)}
	b.m[key] = bk
	return bk, true
}
