package memory

import (
	"context"
	"sync"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

// acks takes acknowledgements and activity off the request path: a poll or
// an ack records them here and answers; a background loop writes what
// gathered in one store call per batch, at least every interval, and once
// more at shutdown.
//
// Nothing a poll returns depends on these writes: the relay answers from
// the cursor the client sent and from its own memory. A crash may lose the
// last interval's acks (the envelopes are delivered again, and the client's
// next cursor acknowledges them again) and activity, never an envelope.
type acks struct {
	store    Store
	interval time.Duration
	timeout  time.Duration
	onDone   func(res store.AckManyResult, err error)

	mu      sync.Mutex
	pending map[device.Key]store.Ack
	// writing is the batch being written: taken out of pending, not yet
	// in the store. A read of the store merges both (cursorOf).
	writing map[device.Key]store.Ack
	written uint64        // batches written so far
	kick    chan struct{} // a batch grew past ackBatch: write it now

	// writeMu is held while a batch is written, so that flushHousehold can
	// wait for acks the loop has taken but not yet written.
	writeMu sync.Mutex

	stop chan struct{}
	done chan struct{}
}

// ackBatch is the most acks one store call carries. A batch holds its
// devices' rows while it runs, and a send to one of them waits for it:
// batches stay small so that the wait does.
const ackBatch = 256

// newAcks returns the writer, not started; onDone hears the outcome of
// every batch.
func newAcks(st Store, interval, timeout time.Duration, onDone func(res store.AckManyResult, err error)) *acks {
	return &acks{
		store: st, interval: interval, timeout: timeout, onDone: onDone,
		pending: make(map[device.Key]store.Ack),
		writing: make(map[device.Key]store.Ack),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
}

// start starts the writing loop.
func (a *acks) start() { go a.run() }

// add records that k acknowledged up to cursor (a negative cursor records
// only activity) at seen (zero: no activity to record), in the life and
// the store's epoch given, as the caller knew them: the store skips the
// ack if k was removed since, so an ack of a device's old life never
// reaches a new registration of the same name, and if the epoch changed,
// so that a cursor of one history never acknowledges another's envelopes.
func (a *acks) add(k device.Key, cursor int64, seen time.Time, life device.Life, epoch string) {
	a.mu.Lock()
	a.merge(store.Ack{Household: k.Household, Device: k.Device, Cursor: cursor, Seen: seen, Life: life, Epoch: epoch})
	full := len(a.pending) >= ackBatch
	a.mu.Unlock()
	if full {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
}

// merge folds n into what is pending for its device; the caller holds mu.
func (a *acks) merge(n store.Ack) {
	k := device.KeyOf(n.Household, n.Device)
	p, ok := a.pending[k]
	switch {
	case !ok || n.Life.Compare(p.Life) > 0:
		a.pending[k] = n // a later life of the device replaces the older one
	case p.Epoch != n.Epoch:
		a.pending[k] = n // taken in the epoch read last
	case p.Life.Compare(n.Life) == 0:
		p.Cursor = max(p.Cursor, n.Cursor)
		if n.Seen.After(p.Seen) {
			p.Seen = n.Seen
		}
		a.pending[k] = p
	}
}

func (a *acks) run() {
	defer close(a.done)
	t := time.NewTicker(a.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-a.kick:
		case <-a.stop:
			a.flush()
			return
		}
		a.flush()
	}
}

// flush writes what is pending, a batch at a time.
func (a *acks) flush() {
	for {
		a.writeMu.Lock()
		a.mu.Lock()
		if len(a.pending) == 0 {
			a.mu.Unlock()
			a.writeMu.Unlock()
			return
		}
		batch := make([]store.Ack, 0, min(len(a.pending), ackBatch))
		for k, p := range a.pending {
			batch = append(batch, p)
			delete(a.pending, k)
			a.writing[k] = p
			if len(batch) == ackBatch {
				break
			}
		}
		a.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
		err := a.write(ctx, batch)
		cancel()
		a.writeMu.Unlock()
		if err != nil {
			return // back in line for the next round, not retried in a loop
		}
	}
}

// write writes one batch; a batch the store refuses goes back to wait,
// merged with what came meanwhile (without a kick).
func (a *acks) write(ctx context.Context, batch []store.Ack) error {
	res, err := a.store.AckMany(ctx, batch)
	a.onDone(res, err)
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(a.writing)
	if err != nil {
		for _, p := range batch {
			a.merge(p)
		}
		return err
	}
	a.written++
	return nil
}

// mark is how many batches have been written: taken before a store call
// whose answer the acks may have changed, and given to flushHousehold.
func (a *acks) mark() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.written
}

// flushHousehold writes now what is pending for household's devices, after
// any batch the loop is writing, and reports whether any batch was written
// since before (a mark): one of the loop's may have held the household's
// acks, also while the caller's store call ran, so the store's pending
// counts may have fallen.
func (a *acks) flushHousehold(ctx context.Context, household string, before uint64) bool {
	a.writeMu.Lock()
	defer a.writeMu.Unlock()
	a.mu.Lock()
	var batch []store.Ack
	for k, p := range a.pending {
		if k.Household == household && p.Cursor >= 0 {
			batch = append(batch, p)
			delete(a.pending, k)
			a.writing[k] = p
		}
	}
	a.mu.Unlock()
	if len(batch) > 0 {
		_ = a.write(ctx, batch) // a failed batch is back in pending
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.written != before
}

// snapshot is what k acknowledged that may not be in the store yet: the
// ack pending, and the one in the batch being written.
func (a *acks) snapshot(k device.Key) []store.Ack {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []store.Ack
	for _, m := range []map[device.Key]store.Ack{a.pending, a.writing} {
		if p, ok := m[k]; ok {
			out = append(out, p)
		}
	}
	return out
}

// dropEpochs drops the pending acks taken in another epoch than epoch, and
// reports how many: the store would skip them (their cursors count seqs of
// a history it no longer holds).
func (a *acks) dropEpochs(epoch string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for k, p := range a.pending {
		if p.Epoch != epoch {
			delete(a.pending, k)
			n++
		}
	}
	return n
}

// close writes what is pending and stops the loop.
func (a *acks) close() {
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
	<-a.done
}
