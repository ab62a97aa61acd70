package memory

import (
	"context"
	"log/slog"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/position"
)

// removals keeps the list of every device's last removal (see
// position.Removals) read: once at start, after the hub became the
// relay's observer, so that no removal committed after the read is missed,
// and again whenever the hub says news may have been lost. Until a read
// succeeds, a token check of a device this relay has not met reads the
// store, as it would without the list.
type removals struct {
	list  *position.Removals
	store Store
	log   *slog.Logger

	kick   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// removalsMax is the most removed devices a relay keeps in memory (about
// a hundred bytes each). Past it the list stays incomplete and first
// requests read the store.
const removalsMax = 1 << 20

// removalsTimeout bounds one read of the list.
const removalsTimeout = 30 * time.Second

// newRemovals returns the list, not read until start.
func newRemovals(st Store, log *slog.Logger) *removals {
	ctx, cancel := context.WithCancel(context.Background())
	return &removals{
		list: position.NewRemovals(), store: st, log: log,
		kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{}),
	}
}

// start reads the list, and again after every lost. The caller has made
// the hub tell this list of removals first.
func (r *removals) start() {
	r.kick <- struct{}{}
	go r.run(r.ctx)
}

// get returns k's current life (begun by its last removal) and true, or
// false while the list is not known in full.
func (r *removals) get(k device.Key) (device.Life, bool) { return r.list.Get(k) }

// removed is the hub's news of a removal, which began life.
func (r *removals) removed(k device.Key, life device.Life) { r.list.Removed(k, life) }

// lost is the hub's news that news may have been missed: the list is read
// again.
func (r *removals) lost() {
	r.list.Lost()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// close stops the reading; start must have been called.
func (r *removals) close() {
	r.cancel()
	<-r.done
}

func (r *removals) run(ctx context.Context) {
	defer close(r.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
		for backoff := time.Second; !r.read(ctx); backoff = min(2*backoff, 30*time.Second) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
		}
		// While Redis is in trouble the hub may say news was lost every
		// second; the list, read whole, is read at most this often (until
		// then first requests read the store, as without it).
		select {
		case <-ctx.Done():
			return
		case <-time.After(removalsEvery):
		}
	}
}

// removalsEvery is the least time between two reads of the list.
const removalsEvery = 5 * time.Second

// read reads the list once; false means it should be tried again. A read
// that Lost overtook is not kept, and Lost's kick reads again.
func (r *removals) read(ctx context.Context) bool {
	gen := r.list.Begin()
	rctx, cancel := context.WithTimeout(ctx, removalsTimeout)
	rs, err := r.store.Removals(rctx, removalsMax+1)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("reading removed devices failed; first requests read the store until it works", "err", err)
		}
		return false
	}
	if len(rs) > removalsMax {
		r.log.Warn("too many removed devices to keep in memory; first requests read the store", "max", removalsMax)
		return true
	}
	read := make(map[device.Key]device.Life, len(rs))
	for _, rm := range rs {
		read[device.KeyOf(rm.Household, rm.Device)] = device.LifeAfter(rm.At)
	}
	r.list.Fill(gen, read)
	return true
}
