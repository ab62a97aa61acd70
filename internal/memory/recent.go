package memory

import (
	"encoding/binary"
	"errors"
	"sync"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

// recent keeps the envelopes this relay committed in the last moments, so
// that a poll woken by a send here hands the envelope over from memory
// instead of reading back from the store what it has just written: the
// common case of a live device costs the store the send and nothing more.
//
// It holds exactly what the store holds (the same seq, id, sender, time to
// the microsecond, payload), only for recentFor and within recentBytes; a
// poll that finds nothing here, or more than the one envelope here, reads
// the store as before. A removal drops the device's entries, so a name
// registered again never sees its earlier life's envelopes.
type recent struct {
	mu    sync.Mutex
	m     map[recentKey]*recentEntry
	order []*recentEntry // oldest first
	bytes int
}

type recentKey struct {
	device.Key
	seq int64
}

type recentEntry struct {
	key  recentKey
	env  store.Envelope
	life device.Life // the device's life the send was stored in
	at   time.Time
}

const (
	// recentFor is how long an envelope is kept: a woken poll reads it
	// within milliseconds.
	recentFor = 5 * time.Second
	// recentBytes bounds the payload bytes kept.
	recentBytes = 16 << 20
)

// put keeps e, committed for k in the life given.
func (r *recent) put(k device.Key, e store.Envelope, life device.Life, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[recentKey]*recentEntry)
	}
	r.expire(now)
	rk := recentKey{k, e.Seq}
	if _, ok := r.m[rk]; ok {
		return
	}
	ent := &recentEntry{key: rk, env: e, life: life, at: now}
	r.m[rk] = ent
	r.order = append(r.order, ent)
	r.bytes += len(e.Payload)
	for r.bytes > recentBytes && len(r.order) > 0 {
		r.drop()
	}
}

// get returns the envelope with seq for k, if it is still kept and was
// committed in the device's life that the caller knows. (A name removed
// and registered again gives its seqs anew.)
func (r *recent) get(k device.Key, seq int64, life device.Life, now time.Time) (store.Envelope, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ent, ok := r.m[recentKey{k, seq}]
	if !ok || now.Sub(ent.at) > recentFor || ent.life.Compare(life) != 0 {
		return store.Envelope{}, false
	}
	return ent.env, true
}

// forget drops every envelope kept for k.
func (r *recent) forget(k device.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for rk := range r.m {
		if rk.Key == k {
			delete(r.m, rk) // the entry stays in order until it ages out
		}
	}
}

// clear drops every envelope kept: the store's history changed, and a seq
// kept here may name another envelope there now.
func (r *recent) clear() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.m)
	r.order, r.bytes = nil, 0
}

// expire drops entries older than recentFor; the caller holds mu.
func (r *recent) expire(now time.Time) {
	for len(r.order) > 0 && now.Sub(r.order[0].at) > recentFor {
		r.drop()
	}
}

// drop removes the oldest entry; the caller holds mu.
func (r *recent) drop() {
	ent := r.order[0]
	r.order[0] = nil
	r.order = r.order[1:]
	r.bytes -= len(ent.env.Payload)
	if r.m[ent.key] == ent {
		delete(r.m, ent.key)
	}
}

// WakeEnvelopeMax is the largest payload a wake carries to other relays:
// messages on the hub stay small, and a larger envelope is read from the
// store by the relay that holds the poll.
const WakeEnvelopeMax = 4 << 10

// EncodeEnvelope is how a wake carries an envelope to the relays holding
// polls (the wake itself carries the life it was stored in).
func EncodeEnvelope(e store.Envelope) []byte {
	b := make([]byte, 0, 32+len(e.ID)+len(e.From)+len(e.Payload))
	b = binary.AppendVarint(b, e.Seq)
	b = binary.AppendVarint(b, e.SentAt.UnixMicro())
	for _, s := range []string{e.ID, e.From} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return append(b, e.Payload...)
}

var errBadEnvelope = errors.New("devices: malformed envelope in a wake")

func decodeEnvelope(b []byte) (e store.Envelope, err error) {
	next := func() int64 {
		v, n := binary.Varint(b)
		if n <= 0 {
			err = errBadEnvelope
			return 0
		}
		b = b[n:]
		return v
	}
	nextString := func() string {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			err = errBadEnvelope
			return ""
		}
		s := string(b[n : n+int(l)])
		b = b[n+int(l):]
		return s
	}
	e.Seq = next()
	sent := next()
	e.ID = nextString()
	e.From = nextString()
	if err != nil {
		return store.Envelope{}, err
	}
	e.SentAt = time.UnixMicro(sent).UTC()
	e.Payload = b
	return e, nil
}
