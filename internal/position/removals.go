package position

import (
	"sync"

	"github.com/flamenet/relay/device"
)

// Removals is every device's last removal, known in full once loaded: a
// device it does not name was never removed. With it a token check needs
// no store read for a device this relay has not met yet (a sender's first
// send).
//
// The list is read from the store while the hub's news of removals is
// already being kept: a removal committed after the read's snapshot is
// news that arrives before or after Fill, and both merge by the latest
// time, so neither order loses it. When the hub may have missed news
// (Lost), the list is no longer complete until it is read again; a read
// that began before Lost is not trusted.
type Removals struct {
	mu       sync.RWMutex
	m        map[device.Key]device.Life
	gen      uint64 // bumped by Lost
	complete bool
}

// NewRemovals returns an empty list, not complete until its first Fill.
func NewRemovals() *Removals {
	return &Removals{m: make(map[device.Key]device.Life)}
}

// Get returns k's current life (begun by its last removal) and true, or
// false while the list is not complete.
func (r *Removals) Get(k device.Key) (device.Life, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if !r.complete {
		return device.Life{}, false
	}
	return r.m[k], true
}

// Removed is the hub's news that k was removed, which began life.
func (r *Removals) Removed(k device.Key, life device.Life) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[k] = r.m[k].Later(life)
}

// Lost is the hub's news that news may have been missed: the list must be
// read again before it is trusted.
func (r *Removals) Lost() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	r.complete = false
}

// Begin is called before the list is read from the store; its result goes
// to Fill.
func (r *Removals) Begin() uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.gen
}

// Fill merges a full read begun with Begin's gen and makes the list
// complete. It reports false, keeping nothing, when Lost came in between.
func (r *Removals) Fill(gen uint64, read map[device.Key]device.Life) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if gen != r.gen {
		return false
	}
	for k, life := range read {
		r.m[k] = r.m[k].Later(life)
	}
	r.complete = true
	return true
}

// Len returns the number of removed devices known.
func (r *Removals) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.m)
}
