// Package memory is everything a relay process knows of the devices it
// serves, and keeps current: where each stands (internal/position), every
// device's last removal, the envelopes committed here a moment ago, and the
// acknowledgements not yet written. It is the wake hub's observer: news of
// sends and removals, from this relay or another, reaches it before any
// poll is woken by it.
//
// What memory does not know it reads from the store, in one place (read):
// the read is marked before it starts, news that arrives meanwhile is kept,
// and the two are merged by the life they are of. The store stays the only
// truth; memory only spares it the reads it would answer the same.
package memory

import (
	"context"
	"log/slog"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/position"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/wake"
)

// Store is what memory reads and writes of the store: where devices stand
// and their acknowledgements (of store.Queue), their registrations and
// removals (of store.Directory), and pairings, which register a device
// (of store.Pairing). The methods are store.Store's.
type Store interface {
	State(ctx context.Context, household, device string) (store.DeviceState, error)
	Ack(ctx context.Context, p store.AckParams) (store.Position, error)
	AckMany(ctx context.Context, acks []store.Ack) (store.AckManyResult, error)
	Register(ctx context.Context, p store.RegisterParams) (store.Device, error)
	Removals(ctx context.Context, limit int) ([]store.Removal, error)
	Pair(ctx context.Context, p store.PairParams) (store.Grant, error)
}

// Config is what a Memory needs.
type Config struct {
	Store Store
	// AckInterval is how often acknowledgements are written at most.
	AckInterval time.Duration
	// StoreTimeout bounds one write of acknowledgements.
	StoreTimeout time.Duration
	Logger       *slog.Logger
	// OnAcks hears the outcome of every batch of acknowledgements.
	OnAcks func(res store.AckManyResult, err error)
	// Now is the clock a device's implicit registration is dated by; nil:
	// time.Now.
	Now func() time.Time
	// Hears reports whether every wake for a device reaches this process
	// (wake.Hub.Hears); memory trusts what it learned of a device only
	// then. Nil: every wake does.
	Hears func(device.Key) bool
}

// Memory is what one relay knows of devices. Start it once the hub tells
// it the news (wake.Hub.Observe), and Stop it after the last request.
type Memory struct {
	store     Store
	now       func() time.Time
	hears     func(device.Key) bool
	positions *position.Cache
	removals  *removals
	recent    recent
	acks      *acks
}

// New returns an empty memory; Start begins its background work.
func New(cfg Config) *Memory {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	onAcks := cfg.OnAcks
	if onAcks == nil {
		onAcks = func(store.AckManyResult, error) {}
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	hears := cfg.Hears
	if hears == nil {
		hears = func(device.Key) bool { return true }
	}
	return &Memory{
		store:     cfg.Store,
		now:       now,
		hears:     hears,
		positions: position.New(0),
		removals:  newRemovals(cfg.Store, log),
		acks:      newAcks(cfg.Store, cfg.AckInterval, cfg.StoreTimeout, onAcks),
	}
}

// Start reads the list of removals, and again whenever news was lost, and
// starts writing acknowledgements. Call it after the hub tells this memory
// its news: a removal committed after the list's read is then heard, and
// merged into the list (TestRemovalsHeardDuringRead).
func (m *Memory) Start() {
	m.removals.start()
	m.acks.start()
}

// Stop writes the acknowledgements still pending and stops.
func (m *Memory) Stop() {
	m.acks.close()
	m.removals.close()
}

// Advanced is the hub's news that a send committed for w.Key in its life
// w.Life: the envelope it may carry, then the device's head.
func (m *Memory) Advanced(w wake.Wake) {
	if !w.Life.IsZero() {
		// A send stored after a removal tells of that removal too, which
		// this relay may not have heard of yet.
		m.removals.removed(w.Key, w.Life)
	}
	if w.Envelope != nil {
		if e, err := decodeEnvelope(w.Envelope); err == nil {
			m.recent.put(w.Key, e, w.Life, time.Now())
		}
	}
	m.positions.Advanced(w.Key, w.Life, w.Head)
}

// Removed is the hub's news that k was removed at the time given.
func (m *Memory) Removed(k device.Key, at time.Time) {
	life := device.LifeAfter(at)
	m.recent.forget(k)
	m.positions.Removed(k, life)
	m.removals.removed(k, life)
}

// Lost is the hub's news that news may have been missed, or the store
// watch's that the store changed: what is known is read again. The
// acknowledgements not yet written stay, and every read of the store
// merges those of its life and epoch (read), so that a device polling
// without a cursor is not handed again what it acknowledged.
func (m *Memory) Lost() {
	m.positions.Lost()
	m.removals.lost()
}

// Forget is the hub's news that k's wakes may have been missed until now:
// what is known of k's position is read again. Its removals are not
// forgotten: every relay hears every removal.
func (m *Memory) Forget(k device.Key) { m.positions.Forget(k) }

// EpochChanged is the store watch's news that the store's epoch is now
// epoch: its history may have gone back. What is known is read again, the
// envelopes kept from recent sends are dropped (their seqs may name other
// envelopes now), and the acknowledgements pending of another epoch are
// dropped (the store would skip them); it reports how many.
func (m *Memory) EpochChanged(epoch string) int {
	n := m.acks.dropEpochs(epoch)
	m.recent.clear()
	m.Lost()
	return n
}

var _ wake.Observer = (*Memory)(nil)

// Known is what memory knows of k, if it was read from the store since news
// was last lost and every wake for k reaches this process.
func (m *Memory) Known(k device.Key) (position.State, bool) {
	if !m.hears(k) {
		return position.State{}, false
	}
	return m.positions.Get(k)
}

// KnownLife is k's current life, if memory knows it: what is known of the
// device, or the list of every removal.
func (m *Memory) KnownLife(k device.Key) (device.Life, bool) {
	pos, known := m.positions.Get(k)
	listed, ok := m.removals.get(k)
	if !known && !ok {
		return device.Life{}, false
	}
	return listed.Later(pos.Life), true
}

// Listed is k's current life from the list of every removal, once it is
// read in full.
func (m *Memory) Listed(k device.Key) (device.Life, bool) { return m.removals.get(k) }

// Life is k's current life: from memory, or, while memory does not know,
// read from the store (without registering the device: a sender need not
// be registered).
func (m *Memory) Life(ctx context.Context, k device.Key) (device.Life, error) {
	if life, ok := m.KnownLife(k); ok {
		return life, nil
	}
	pos, err := m.read(k, func() (store.DeviceState, error) { return m.store.State(ctx, k.Household, k.Device) })
	return pos.Life, err
}

// Position is where k stands: from memory if it knows the device
// registered (and the epoch its knowledge is of), or else read from the
// store (see Read).
func (m *Memory) Position(ctx context.Context, k device.Key, issuedAt time.Time) (position.State, error) {
	if pos, ok := m.Known(k); ok && pos.Exists && pos.Epoch != "" {
		return pos, nil
	}
	return m.Read(ctx, k, issuedAt)
}

// Read reads where k stands from the store, registering a device that
// polls or acks before it ever registered, unless the credential issued at
// issuedAt is older than its last removal (store.ErrRemoved: the store
// judges it, in the statement that would register the device).
func (m *Memory) Read(ctx context.Context, k device.Key, issuedAt time.Time) (position.State, error) {
	return m.read(k, func() (store.DeviceState, error) {
		st, err := m.store.State(ctx, k.Household, k.Device)
		if err != nil || st.Exists {
			return st, err
		}
		p, err := m.store.Ack(ctx, store.AckParams{Household: k.Household, Device: k.Device, Cursor: -1, Now: m.now(), IssuedAt: issuedAt})
		if err != nil {
			return st, err
		}
		return store.DeviceState{Exists: true, Cursor: p.Cursor, Head: p.Head, Life: st.Life, Epoch: p.Epoch}, nil
	})
}

// read is every read of a device's state from the store: marked before it
// starts (Begin), so that news arriving meanwhile is merged with it (Fill).
// The store's cursor lags the acknowledgements not yet written: those of
// the read's life and epoch are merged in, as they were before the read
// (a batch may commit while it runs, after its snapshot) and after it.
func (m *Memory) read(k device.Key, fn func() (store.DeviceState, error)) (position.State, error) {
	ticket := m.positions.Begin(k)
	before := m.acks.snapshot(k)
	st, err := fn()
	if err != nil {
		return position.State{}, err
	}
	if st.Exists {
		for _, p := range append(before, m.acks.snapshot(k)...) {
			if p.Life.Compare(st.Life) == 0 && p.Epoch == st.Epoch {
				st.Cursor = max(st.Cursor, min(p.Cursor, st.Head))
			}
		}
	}
	return m.positions.Fill(k, ticket, position.State{Exists: st.Exists, Cursor: st.Cursor, Head: st.Head, Life: st.Life, Epoch: st.Epoch}), nil
}

// Register registers the device (store.Register) and keeps what the
// registration read, so that its first poll need not read it again. The
// cursor returned counts acknowledgements not yet written.
func (m *Memory) Register(ctx context.Context, p store.RegisterParams) (store.Device, error) {
	k := device.KeyOf(p.Household, p.Device)
	ticket := m.positions.Begin(k)
	d, err := m.store.Register(ctx, p)
	if err != nil {
		return store.Device{}, err
	}
	// Kept only with the device's life known: a registration does not
	// read it.
	if life, ok := m.KnownLife(k); ok {
		m.positions.Fill(k, ticket, position.State{Exists: true, Cursor: d.Cursor, Head: d.Head, Life: life, Epoch: d.Epoch})
	}
	m.positions.Registered(k, p.Now)
	if pos, ok := m.positions.Get(k); ok && pos.Epoch == d.Epoch {
		d.Cursor = max(d.Cursor, pos.Cursor)
	}
	return d, nil
}

// Pair redeems an invitation (store.Store.Pair) and records the
// registration it made, as Register does.
func (m *Memory) Pair(ctx context.Context, p store.PairParams) (store.Grant, error) {
	g, err := m.store.Pair(ctx, p)
	if err != nil {
		return store.Grant{}, err
	}
	k := device.KeyOf(g.Household, g.Device)
	if g.Replaced {
		// The removal first: after the registration it would take the
		// new device for gone.
		m.Removed(k, g.RemovedAt)
	}
	m.positions.Registered(k, p.Now)
	return g, nil
}

// lastSeenEvery is how often a device's activity is written at most.
const lastSeenEvery = time.Minute

// Acknowledge records that k, standing at pos, acknowledged up to cursor
// at now (a cursor not above pos.Cursor records only activity, at most
// once every lastSeenEvery), for the background writer; it returns the
// position with the cursor moved.
func (m *Memory) Acknowledge(k device.Key, pos position.State, cursor int64, now time.Time) position.State {
	seen := time.Time{}
	if m.positions.Touch(k, now, lastSeenEvery) {
		seen = now
	}
	if cursor > pos.Cursor {
		m.positions.Acked(k, pos.Life, cursor)
		pos.Cursor = cursor
		m.acks.add(k, cursor, seen, pos.Life, pos.Epoch)
	} else if !seen.IsZero() {
		m.acks.add(k, -1, seen, pos.Life, pos.Epoch)
	}
	return pos
}

// HeadRead records that the store said at now that k's head in its life
// life is head, to a cursor above it (position.State.AheadOf).
func (m *Memory) HeadRead(k device.Key, life device.Life, head int64, now time.Time) {
	m.positions.HeadRead(k, life, head, now)
}

// Empty records that a read of k, in the life given, found nothing stored above
// its cursor up to upTo.
func (m *Memory) Empty(k device.Key, life device.Life, upTo int64) {
	m.positions.Empty(k, life, upTo)
}

// Recent returns the envelope with seq committed for k, in the life given,
// a moment ago, if it is still kept.
func (m *Memory) Recent(k device.Key, seq int64, life device.Life) (store.Envelope, bool) {
	return m.recent.get(k, seq, life, time.Now())
}

// AckMark marks the acknowledgements written so far; take it before a
// store call that FlushHousehold may have to follow.
func (m *Memory) AckMark() uint64 { return m.acks.mark() }

// FlushHousehold writes now the acknowledgements pending for household's
// devices, and reports whether any were written since mark (AckMark): the
// store's pending counts, which lag them, may have fallen.
func (m *Memory) FlushHousehold(ctx context.Context, household string, mark uint64) bool {
	return m.acks.flushHousehold(ctx, household, mark)
}
