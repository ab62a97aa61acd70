// Package position is what a relay process knows, in memory, of each
// device it serves: whether it exists, its cursor, its head and its last
// removal. A poll whose cursor is current and for which nothing is pending
// parks on that knowledge without asking the store.
//
// The knowledge is filled from the store on a device's first use and kept
// current by the wake hub (through the relay's observer): every send
// committed anywhere advances the head before any poll is woken by it, and
// a removal resets the device. When the hub may have missed news (a
// reconnect, an outage) it calls Lost, and everything is read again.
//
// Heads only grow within a device's life, and every source (the store, a
// wake) reports a true lower bound of the head, so merging news of one life
// by maximum is safe. Every piece of news says which life it is of (a
// device.Life): news of an earlier life than the one known is dropped, and
// news of a later one replaces what was known, as the removal that began
// it would have. What could go wrong besides is a store read that started
// before news arrived and finishes after it, carrying an older picture.
// Begin and Fill close that window: Begin marks the entry before the read,
// news applies to the marked entry, and Fill merges into it, or gives up
// when the entry was replaced (a removal) or forgotten (Lost, eviction) in
// between.
package position

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flamenet/relay/device"
)

// State is what the relay knows of one device.
type State struct {
	Exists bool        // registered (a sender need not be)
	Cursor int64       // highest seq acknowledged, as far as known here
	Head   int64       // highest seq ever given, as far as known here
	Life   device.Life // the life this knowledge is of: the device's last removal
	// Epoch is the store's epoch the knowledge was read in; "" until a
	// store read filled it. Memory is dropped (Lost) when the epoch
	// changes; a read of another epoch than the one kept replaces it.
	Epoch string
	// Floor: a read found nothing stored above the cursor up to Floor, so
	// there is nothing to fetch unless Head passes it (envelopes that
	// expired unread leave the head above the cursor for good).
	Floor int64
	// Seen is when this relay last recorded the device's activity.
	Seen time.Time
	// HeadRead is when the store last said the head is Head, to a cursor
	// above it; zero once news moved the head.
	HeadRead time.Time
}

// Pending reports whether envelopes above after may be waiting.
func (s State) Pending(after int64) bool { return s.Head > max(after, s.Floor) }

// AheadOf reports whether cursor is known to be above the head: the store
// said so less than AheadFor before now, and no news moved the head since.
// Until then memory may simply not have heard of a send yet.
func (s State) AheadOf(cursor int64, now time.Time) bool {
	return cursor > s.Head && !s.HeadRead.IsZero() && now.Sub(s.HeadRead) < AheadFor
}

// AheadFor is how long the store's word that a cursor is above the head
// holds without news: a client that repeats such a cursor in a loop costs
// a store read this often at most.
const AheadFor = time.Second

const shardCount = 64

// DefaultMax is the default bound on the devices a Cache remembers.
const DefaultMax = 200_000

// Cache is safe for concurrent use. The zero value is not; call New.
type Cache struct {
	seed     maphash.Seed
	gen      atomic.Uint64 // bumped by Lost: entries of older generations are stale
	perShard int
	shards   [shardCount]shard
}

type shard struct {
	mu sync.Mutex
	m  map[device.Key]*entry
}

type entry struct {
	State
	gen    uint64
	filled bool // State came from the store; until then only news is kept
}

// New returns an empty cache that remembers about max devices (0:
// DefaultMax); past that it forgets some, which only costs them a read.
func New(max int) *Cache {
	if max <= 0 {
		max = DefaultMax
	}
	c := &Cache{seed: maphash.MakeSeed(), perShard: (max + shardCount - 1) / shardCount}
	for i := range c.shards {
		c.shards[i].m = make(map[device.Key]*entry)
	}
	return c
}

func (c *Cache) shard(k device.Key) *shard {
	x := k.Hash(c.seed)
	return &c.shards[x&(shardCount-1)]
}

// Get returns what is known of k, if it was read from the store in the
// current generation.
func (c *Cache) Get(k device.Key) (State, bool) {
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if e == nil || !e.filled || e.gen != c.gen.Load() {
		return State{}, false
	}
	return e.State, true
}

// Ticket marks a store read in flight; see Begin.
type Ticket struct {
	e   *entry
	gen uint64
}

// Begin is called before reading k's state from the store; news that
// arrives meanwhile is kept and merged by Fill.
func (c *Cache) Begin(k device.Key) Ticket {
	gen := c.gen.Load()
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if e == nil || e.gen != gen {
		c.evict(s)
		e = &entry{gen: gen}
		s.m[k] = e
	}
	return Ticket{e: e, gen: gen}
}

// Fill merges a store read begun with t and returns what is now known. If
// the entry was replaced or went stale since Begin, nothing is kept and
// the read is returned as it is: it is still the truth as of its snapshot.
func (c *Cache) Fill(k device.Key, t Ticket, st State) State {
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if e != t.e || e.gen != t.gen || c.gen.Load() != t.gen {
		return st
	}
	switch st.Life.Compare(e.Life) {
	case -1:
		// The read is of a life the news already left behind: it is no
		// picture of the device now.
		return State{Life: e.Life}
	case 1:
		// The read is of a later life than the news kept meanwhile (a
		// removal not heard of here): the news was of the earlier one.
		e.State = State{Life: st.Life, Seen: e.Seen}
	}
	if e.Epoch != st.Epoch {
		if e.Epoch != "" {
			// Another history of the store than the one kept: nothing
			// kept of it holds.
			e.State = State{Life: st.Life, Seen: e.Seen}
		}
		e.Epoch = st.Epoch
	}
	e.Exists = e.Exists || st.Exists // within one life of a device, it only comes into being
	e.Cursor = max(e.Cursor, st.Cursor)
	e.advance(st.Head)
	e.filled = true
	return e.State
}

// update changes a filled, current entry; it reports whether there was one.
func (c *Cache) update(k device.Key, fn func(e *entry)) bool {
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if e == nil || !e.filled || e.gen != c.gen.Load() {
		return false
	}
	fn(e)
	return true
}

// updateLife is update for news of one life only: fn runs when k's entry
// is of that life.
func (c *Cache) updateLife(k device.Key, life device.Life, fn func(e *entry)) {
	c.update(k, func(e *entry) {
		if e.Life.Compare(life) == 0 {
			fn(e)
		}
	})
}

// Acked records that k acknowledged up to cursor in the life given (never
// moving it down).
func (c *Cache) Acked(k device.Key, life device.Life, cursor int64) {
	c.updateLife(k, life, func(e *entry) { e.Cursor = max(e.Cursor, cursor) })
}

// Registered records that k registered at now (a registration does not
// move its cursor or head, and records the device's activity itself).
func (c *Cache) Registered(k device.Key, now time.Time) {
	c.update(k, func(e *entry) {
		e.Exists = true
		if now.After(e.Seen) {
			e.Seen = now
		}
	})
}

// Empty records that a read of k, in the life given, found nothing stored above
// after up to upTo.
func (c *Cache) Empty(k device.Key, life device.Life, upTo int64) {
	c.updateLife(k, life, func(e *entry) { e.Floor = max(e.Floor, upTo) })
}

// Touch records that k's activity was recorded at seen, and reports whether
// it is due: the last record is older than every (or there was none).
func (c *Cache) Touch(k device.Key, seen time.Time, every time.Duration) bool {
	due := true
	c.update(k, func(e *entry) {
		if !e.Seen.IsZero() && seen.Sub(e.Seen) < every {
			due = false
			return
		}
		e.Seen = seen
	})
	return due
}

// Advanced is the hub's news that a send committed for k in the life given:
// its head is now at least head. A device nobody asked about is not
// remembered (its first use reads the store, which already holds that
// send); one whose read is in flight keeps the news for Fill. News of an
// earlier life than the one known is dropped (a wake that arrives after
// the removal it preceded); news of a later life tells of a removal not
// heard of here, and is taken as that removal.
func (c *Cache) Advanced(k device.Key, life device.Life, head int64) {
	gen := c.gen.Load()
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if e == nil || e.gen != gen {
		return
	}
	switch life.Compare(e.Life) {
	case -1:
		return
	case 1:
		if e.filled {
			// Which seqs the new life holds is for the store to say.
			s.m[k] = &entry{gen: gen, filled: true, State: State{Life: life}}
			return
		}
		e.State = State{Life: life, Seen: e.Seen}
	}
	e.advance(head)
	e.Exists = true // only a registered device is sent to
}

// advance moves the head up to head; the caller holds the shard's lock.
func (e *entry) advance(head int64) {
	if head > e.Head {
		e.Head = head
		e.HeadRead = time.Time{}
	}
}

// HeadRead records that the store said at now that k's head in its life
// life is head, to a cursor above it (see State.AheadOf); kept only if
// memory's head is the same.
func (c *Cache) HeadRead(k device.Key, life device.Life, head int64, now time.Time) {
	c.updateLife(k, life, func(e *entry) {
		if e.Head == head {
			e.HeadRead = now
		}
	})
}

// Removed is the hub's news that k was removed, which began the life given:
// it no longer exists, and a registration after this starts again from seq
// 1. The entry is replaced, so that a read begun before the removal is not
// merged into it; news of an earlier removal than the one known changes
// nothing.
func (c *Cache) Removed(k device.Key, life device.Life) {
	gen := c.gen.Load()
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.m[k]
	if old != nil && old.gen == gen && old.Life.Compare(life) >= 0 && (old.filled || old.Life.Compare(life) > 0) {
		return
	}
	if old == nil {
		c.evict(s)
	}
	s.m[k] = &entry{gen: gen, filled: true, State: State{Life: life}}
}

// Lost is the hub's news that news may have been missed: everything known
// is stale, and reads in flight are not kept.
func (c *Cache) Lost() { c.gen.Add(1) }

// Forget drops what is known of k, so that its next use reads the store:
// news of it may have been missed. A read begun before is not kept.
func (c *Cache) Forget(k device.Key) {
	s := c.shard(k)
	s.mu.Lock()
	delete(s.m, k)
	s.mu.Unlock()
}

// Len returns the number of devices remembered, stale ones included.
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// evict makes room in a full shard (the caller holds its lock): stale
// entries go first, then about a quarter of the rest, in the map's own
// random order. A forgotten device only costs one read at its next use.
func (c *Cache) evict(s *shard) {
	if len(s.m) < c.perShard {
		return
	}
	gen := c.gen.Load()
	for k, e := range s.m {
		if e.gen != gen {
			delete(s.m, k)
		}
	}
	drop := len(s.m) - c.perShard*3/4
	for k := range s.m {
		if drop <= 0 {
			break
		}
		delete(s.m, k)
		drop--
	}
}
