package relay

import (
	"context"
	"errors"
	"sync"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/wake"
)

// Delivery by the sender. Between two events a hijacked stream's
// goroutine waits in a read of its connection. Waking it for each
// envelope costs a goroutine hand-off (the hub's callback moves the
// read's deadline, the runtime readies the goroutine, often on a core it
// must wake first), two deadline changes and a read that finds nothing,
// and delays the event by that hand-off. The send that brings the news
// is running already: when it finds its recipient's stream waiting on
// this relay, it takes the stream (its mu) before its Signal, which then
// leaves the goroutine asleep, and delivers the news itself, through the
// same woken and deliver as the goroutine would.
//
// A sender never blocks on a stream: it does only what needs no store
// call and no wait for the client, the envelope its wake carries and one
// write of what the socket takes at once. What remains (a read of the
// store, more than one batch, bytes the socket would not take, a refusal,
// the stream's end) it hands back to the goroutine, woken as before.

// handBack is what a sender left to the stream's goroutine.
type handBack uint8

const (
	backNone    handBack = iota
	backWoken            // the news is to be read (woken)
	backDeliver          // the news was read: deliver what is pending, after unsent
)

// errHandedBack: a sender left the stream's goroutine something to do.
var errHandedBack = errors.New("relay: a sender handed the stream back")

// errNeedsStore: a sender's delivery would call the store; the goroutine
// does it.
var errNeedsStore = errors.New("relay: a sender does not call the store")

// senderKey marks the context of a sender's delivery: store calls are
// refused with errNeedsStore.
type senderKey struct{}

func sendersCall(ctx context.Context) bool { return ctx.Value(senderKey{}) != nil }

// streamSet is the streams a sender may write to, by device.
type streamSet struct {
	mu sync.RWMutex
	m  map[device.Key]*stream
}

// senderMayWrite adds st to the streams senders write to, or takes it
// out.
func (s *Server) senderMayWrite(st *stream, on bool) {
	if st.raw == nil {
		return
	}
	k := st.c.Key()
	set := &s.streams
	set.mu.Lock()
	defer set.mu.Unlock()
	switch {
	case on:
		if set.m == nil {
			set.m = make(map[device.Key]*stream)
		}
		st.sctx = context.WithValue(st.ctx, senderKey{}, struct{}{})
		set.m[k] = st
	case set.m[k] == st: // not a newer stream of the device
		delete(set.m, k)
	}
}

// idleStreams takes the streams of wakes' devices that wait on this
// relay, for the sender to deliver to (deliver) once its Signal told this
// relay's waiters; nil when there are none.
func (s *Server) idleStreams(wakes []wake.Wake) *idleStreams {
	var idle *idleStreams
	set := &s.streams
	set.mu.RLock()
	for i := range wakes {
		if st := set.m[wakes[i].Key]; st != nil && st.mu.TryLock() {
			st.inline.Store(true)
			if idle == nil {
				idle = new(idleStreams)
			}
			idle.streams = append(idle.streams, st)
		}
	}
	set.mu.RUnlock()
	return idle
}

// idleStreams are the streams a sender took.
type idleStreams struct{ streams []*stream }

// deliver delivers to each stream taken and gives it back; once.
func (idle *idleStreams) deliver() {
	for _, st := range idle.streams {
		st.deliverNow()
	}
	idle.streams = nil
}

// news is the stream's waiter's callback: it ends the goroutine's read,
// unless a sender holds the stream and takes the news itself.
func (st *stream) news() {
	if !st.inline.Load() {
		st.wakeUp()
	}
}

// wakeUp ends the goroutine's read at once.
func (st *stream) wakeUp() { _ = st.conn.SetReadDeadline(aLongTimeAgo) }

// deliverNow delivers the news the sender's Signal brought to st, which
// idleStreams took, and gives st back.
func (st *stream) deliverNow() {
	defer st.mu.Unlock()
	// Cleared before the news is looked for and read: news that comes
	// after that wakes the goroutine, as it would without this sender;
	// news that came while it was set (another send's, an end) is looked
	// at here. TestSenderDeliveryNoLostWakeup goes red with it cleared
	// after the delivery.
	st.inline.Store(false)
	ready, err := st.watcher.Ready()
	switch {
	case !ready:
		return
	case err != nil:
		// Superseded, removed, drained: the goroutine ends the stream.
		// TestSenderMeetsTheEnd goes red without the wake.
		st.wakeUp()
		return
	}
	s, p := st.s, st.p
	st.sender = true
	defer func() { st.sender = false }()
	if err := s.woken(st.sctx, st.r, st.c, p); err != nil {
		st.handBack(backWoken, err)
		return
	}
	if p.pos.Pending(p.after) {
		if _, err := s.deliver(st.sctx, st.r, st.c, p, st.batch); err != nil {
			st.handBack(backDeliver, err)
			return
		}
	}
	more := p.pos.Pending(p.after) || len(st.unsent) > 0
	if s.hooks.senderDelivered != nil {
		s.hooks.senderDelivered(more)
	}
	if more {
		st.handBack(backDeliver, nil)
	}
}

// handBack leaves the rest to the goroutine and wakes it: err, unless it
// is only that the store is needed, ends the stream.
func (st *stream) handBack(b handBack, err error) {
	if !errors.Is(err, errNeedsStore) {
		st.failed = err
	}
	st.back = b
	st.wakeUp()
}

// takeBack is what a sender left, taken.
func (st *stream) takeBack() (handBack, error) {
	b, err := st.back, st.failed
	st.back, st.failed = backNone, nil
	return b, err
}

// writeNow is a sender's write: what the socket takes at once, the rest
// kept for the goroutine.
func (st *stream) writeNow(b []byte) (int, error) {
	n := len(b)
	if len(st.unsent) == 0 {
		w, err := writeNonblocking(st.raw, b)
		st.bytes += int64(w)
		if err != nil {
			return w, err
		}
		b = b[w:]
	}
	st.unsent = append(st.unsent, b...)
	return n, nil
}

// writeUnsent writes what a sender could not, as the goroutine writes an
// event: under its deadline.
func (st *stream) writeUnsent() error {
	b := st.unsent
	st.unsent = nil
	st.deadline(int64(len(b)))
	_, err := st.Write(b)
	return err
}
