package relay

import (
	"sync"
	"time"

	"github.com/flamenet/relay/token"
)

// A device sends the same token with every poll and send, and checking its
// Ed25519 signature is the largest single cost of a request. verified
// remembers tokens whose signature and claims were good, until they expire.
// Only a byte-identical token hits.
type verified struct {
	mu sync.Mutex
	m  map[string]token.Claims
}

// verifiedMax bounds the cache; past it the cache starts over.
const verifiedMax = 1 << 17

func (v *verified) get(raw string, now time.Time) (token.Claims, bool) {
	v.mu.Lock()
	c, ok := v.m[raw]
	v.mu.Unlock()
	// Expiry is checked on every use; nbf was checked when it was added
	// and only moves further into the past.
	if !ok || now.After(c.Expires.Add(token.Skew)) {
		return token.Claims{}, false
	}
	return c, true
}

func (v *verified) put(raw string, c token.Claims) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil || len(v.m) >= verifiedMax {
		v.m = make(map[string]token.Claims)
	}
	v.m[raw] = c
}

// removals remembers, for a short while, what the store said about a
// device's removal, so that its requests do not each ask. A removal made
// through this relay takes effect here at once; one made through another
// replica, within removalTTL.
type removals struct {
	mu sync.Mutex
	m  map[deviceKey]removal
}

type deviceKey struct{ household, device string }

type removal struct {
	checked time.Time // when the store was asked
	at      time.Time // the last removal; zero if none
}

// removalTTL is how long an answer from the store is trusted.
const removalTTL = 2 * time.Second

func (r *removals) get(k deviceKey, now time.Time) (at time.Time, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.m[k]
	if !ok || now.Sub(e.checked) >= removalTTL {
		return time.Time{}, false
	}
	return e.at, true
}

func (r *removals) put(k deviceKey, at, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil || len(r.m) >= verifiedMax {
		r.m = make(map[deviceKey]removal)
	}
	r.m[k] = removal{checked: now, at: at}
}

func (r *removals) forget(k deviceKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, k)
}
