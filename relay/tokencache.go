package relay

import (
	"sync"
	"time"

	"github.com/flamenet/relay/token"
)

// A device sends the same token with every poll and send, and checking its
// Ed25519 signature is the largest single cost of a request. verified
// remembers tokens whose signature and claims were good, until they expire.
// The claims it hands out are shared: nobody may change them.
// Only a byte-identical token hits.
type verified struct {
	mu sync.Mutex
	m  map[string]*token.Claims
}

// verifiedMax bounds the cache; past it the cache starts over.
const verifiedMax = 1 << 17

func (v *verified) get(raw string, now time.Time) (*token.Claims, bool) {
	v.mu.Lock()
	c, ok := v.m[raw]
	v.mu.Unlock()
	// Expiry is checked on every use; nbf was checked when it was added
	// and only moves further into the past.
	if !ok || now.After(c.Expires.Add(token.Skew)) {
		return nil, false
	}
	return c, true
}

func (v *verified) put(raw string, c *token.Claims) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil || len(v.m) >= verifiedMax {
		v.m = make(map[string]*token.Claims)
	}
	v.m[raw] = c
}
