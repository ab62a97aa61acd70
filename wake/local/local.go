// Package local is the in-process wake hub, for a relay that runs as one
// process (FN_RELAY_REPLICAS=1). It holds no store or Redis connection: a
// send's Signal reaches a poll held on the same process, and nothing else.
//
// The hub maps each device to its one waiter. The map is split into shards
// by a hash of the key, so sends and polls for different devices rarely
// contend on one mutex.
package local

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/wake"
)

// shardCount is a power of two so that picking a shard is a mask.
const shardCount = 64

// Hub is the in-process wake hub. The zero value is not usable; call New.
type Hub struct {
	seed   maphash.Seed
	obs    atomic.Pointer[wake.Observer]
	pusher atomic.Pointer[wake.Pusher]
	closed atomic.Bool
	shards [shardCount]shard
}

type shard struct {
	mu      sync.Mutex
	waiters map[device.Key]*Waiter
}

var _ wake.Hub = (*Hub)(nil)

// New returns an empty hub that tells obs (which may be nil; see Observe)
// of every Signal and Remove before it wakes or ends a waiter.
func New(obs wake.Observer) *Hub {
	h := &Hub{seed: maphash.MakeSeed()}
	if obs != nil {
		h.Observe(obs)
	}
	for i := range h.shards {
		h.shards[i].waiters = make(map[device.Key]*Waiter)
	}
	return h
}

// Observe sets the observer.
func (h *Hub) Observe(o wake.Observer) { h.obs.Store(&o) }

// PushVia sets the pusher of wakes whose devices hold no waiter here.
func (h *Hub) PushVia(p wake.Pusher) { h.pusher.Store(&p) }

// Pusher returns the pusher set, or nil.
func (h *Hub) Pusher() wake.Pusher {
	if p := h.pusher.Load(); p != nil {
		return *p
	}
	return nil
}

// Observer returns the observer set, or nil.
func (h *Hub) Observer() wake.Observer { return h.observer() }

func (h *Hub) observer() wake.Observer {
	if o := h.obs.Load(); o != nil {
		return *o
	}
	return nil
}

func (h *Hub) shard(k device.Key) *shard {
	x := k.Hash(h.seed)
	return &h.shards[x&(shardCount-1)]
}

// Subscribe registers k's one waiter on this hub. An older waiter for k
// ends with wake.ErrSuperseded at once. After Close, Subscribe registers
// nothing and returns a nil waiter and wake.ErrClosed, so a draining relay
// can refuse the poll.
func (h *Hub) Subscribe(_ context.Context, k device.Key) (wake.Waiter, error) {
	w, err := h.SubscribeLocal(k)
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return w, nil
}

// SubscribeLocal is Subscribe returning the concrete waiter, for hubs that
// build on this one (wake/redis) and need its channels.
func (h *Hub) SubscribeLocal(k device.Key) (*Waiter, error) {
	s := h.shard(k)
	w := &Waiter{
		key:    k,
		shard:  s,
		signal: make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	s.mu.Lock()
	// Checked under the shard lock: Close sets the flag before it visits
	// the shards, so a waiter is either refused here or ended by Close.
	if h.closed.Load() {
		s.mu.Unlock()
		return nil, wake.ErrClosed
	}
	old := s.waiters[k]
	s.waiters[k] = w
	s.mu.Unlock()
	if old != nil {
		old.end(wake.ErrSuperseded)
	}
	return w, nil
}

// Signal tells the observer each device's new head, then wakes the waiter
// of each device held on this hub, and pushes to each device with a push
// target and no waiter. A device with no waiter costs one map lookup. It
// never fails.
func (h *Hub) Signal(ctx context.Context, wakes []wake.Wake) error {
	obs := h.observer()
	pusher := h.Pusher()
	for _, w := range wakes {
		if obs != nil {
			obs.Advanced(w)
		}
		// Whether it is held is judged as it is woken: a poll the wake
		// answers may be gone right after, and its device needs no push.
		if !h.notify(w.Key) && pusher != nil && !w.Push.Empty() {
			pusher.Push(w.Key, w.Push)
		}
	}
	wake.LocalDone(ctx)
	return nil
}

// Notify wakes k's waiter on this hub, telling the observer nothing: for
// hubs that build on this one and have told it already. It reports
// whether k had a waiter here.
func (h *Hub) Notify(k device.Key) bool { return h.notify(k) }

func (h *Hub) notify(k device.Key) bool {
	s := h.shard(k)
	s.mu.Lock()
	w := s.waiters[k]
	if w != nil {
		w.notify()
	}
	s.mu.Unlock()
	return w != nil
}

// NotifyAll wakes every waiter on this hub, so that each re-reads the
// store: for news that may have been missed.
func (h *Hub) NotifyAll() {
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		for _, w := range s.waiters {
			w.notify()
		}
		s.mu.Unlock()
	}
}

// Remove tells the observer that k was removed, then ends k's waiter on
// this hub with wake.ErrRemoved. It never fails.
func (h *Hub) Remove(_ context.Context, k device.Key, at time.Time) error {
	if obs := h.observer(); obs != nil {
		obs.Removed(k, at)
	}
	h.End(k, wake.ErrRemoved)
	return nil
}

// End ends k's waiter on this hub with err, telling the observer nothing.
func (h *Hub) End(k device.Key, err error) {
	s := h.shard(k)
	s.mu.Lock()
	w := s.waiters[k]
	s.mu.Unlock()
	if w != nil {
		w.end(err)
	}
}

// Held reports whether a waiter for k is registered on this hub.
func (h *Hub) Held(k device.Key) bool {
	s := h.shard(k)
	s.mu.Lock()
	_, ok := s.waiters[k]
	s.mu.Unlock()
	return ok
}

// Hears reports true: every wake of a process's only relay is its own.
func (h *Hub) Hears(device.Key) bool { return true }

// Close ends every registered waiter with wake.ErrClosed and refuses new
// ones. Waiters stay registered (Held stays true) until their polls Close
// them. It is safe to call more than once.
func (h *Hub) Close() error {
	h.closed.Store(true)
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		for _, w := range s.waiters {
			w.end(wake.ErrClosed)
		}
		s.mu.Unlock()
	}
	return nil
}

// Waiter is one held poll's registration. Wait is meant to be called by one
// goroutine at a time (the poll's own); Close may be called from any.
type Waiter struct {
	key   device.Key
	shard *shard
	// signal has room for one wake, so a Signal that lands between
	// Subscribe and Wait is kept; more wakes before the Wait collapse into
	// that one.
	signal chan struct{}
	// done is closed once, after err is set, when the waiter is superseded,
	// the hub closes or the waiter itself is closed.
	done chan struct{}
	once sync.Once
	err  error
	// watch is told of every signal and of the end (see Watch).
	watch atomic.Pointer[func()]
}

var _ wake.Watcher = (*Waiter)(nil)

// Watch calls f on every signal and at the end, and at once if either
// came already.
func (w *Waiter) Watch(f func()) {
	w.watch.Store(&f)
	if len(w.signal) > 0 || w.Err() != nil {
		f()
	}
}

// Ready reports a signal (taking it) or the end, without blocking; the end
// comes first, as in Wait.
func (w *Waiter) Ready() (bool, error) {
	select {
	case <-w.done:
		return true, w.err
	default:
	}
	select {
	case <-w.signal:
		return true, nil
	default:
		return false, nil
	}
}

func (w *Waiter) watched() {
	if f := w.watch.Load(); f != nil {
		(*f)()
	}
}

// Wait blocks until a signal (nil), supersession (wake.ErrSuperseded),
// removal (wake.ErrRemoved), hub Close (wake.ErrClosed) or the end of ctx
// (ctx.Err()). After the waiter's
// own Close it returns wake.ErrClosed.
func (w *Waiter) Wait(ctx context.Context) error {
	// An ended waiter answers with its reason even if a signal is also
	// pending, so a superseded or draining poll never waits again.
	select {
	case <-w.done:
		return w.err
	default:
	}
	select {
	case <-w.signal:
		return nil
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Signaled receives one value per wake (collapsed to one while unreceived).
// Receiving consumes the wake.
func (w *Waiter) Signaled() <-chan struct{} { return w.signal }

// Done returns a channel closed when the waiter ends; Err then says why.
func (w *Waiter) Done() <-chan struct{} { return w.done }

// Err returns nil while the waiter is live, then wake.ErrSuperseded or
// wake.ErrClosed.
func (w *Waiter) Err() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

// Key returns the device this waiter was registered for.
func (w *Waiter) Key() device.Key { return w.key }

// Close unregisters the waiter if it is still the one registered for its
// key; a superseded waiter must not remove its successor. Safe to call more
// than once.
func (w *Waiter) Close() {
	s := w.shard
	s.mu.Lock()
	if s.waiters[w.key] == w {
		delete(s.waiters, w.key)
	}
	s.mu.Unlock()
	w.end(wake.ErrClosed)
}

func (w *Waiter) notify() {
	select {
	case w.signal <- struct{}{}:
	default: // a wake is already pending; one is enough
	}
	w.watched()
}

func (w *Waiter) end(err error) {
	w.once.Do(func() {
		w.err = err
		close(w.done)
		w.watched()
	})
}
