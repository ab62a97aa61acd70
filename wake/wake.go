// Package wake tells a held poll that an envelope for its device was
// committed. The relay registers a waiter before a poll's first read and
// signals after a send's commit; a hub must keep a signal that lands between
// the two so that no wake-up is lost.
//
// A hub also carries what relays learn about devices between them: a
// device's new head with each wake, and a device's removal. It tells its
// Observer before it wakes any waiter, so a woken poll always finds the
// news in memory.
package wake

import (
	"context"
	"errors"
	"time"

	"github.com/flamenet/relay/device"
)

var (
	// ErrSuperseded: a newer poll for the same device took the waiter's
	// place on this process. The older poll answers at once.
	ErrSuperseded = errors.New("wake: superseded by a newer poll")
	// ErrClosed: the hub is draining for shutdown.
	ErrClosed = errors.New("wake: hub closed")
	// ErrRemoved: the device was removed; its held polls end at once.
	ErrRemoved = errors.New("wake: device removed")
	// ErrDegraded: a hub's own wake-ups flow, but it was told to fall
	// back (another relay's do not).
	ErrDegraded = errors.New("wake: wake-ups degraded on request")
)

// Wake says that an envelope for Key committed in the device's life Life
// and that the device's head in that life (the highest seq it was ever
// given) is now at least Head.
type Wake struct {
	Key  device.Key
	Life device.Life
	Head int64
	// Envelope, when not nil, is the envelope itself, encoded by the relay
	// that committed it (hubs carry it opaquely), so that a relay holding
	// the device's poll can hand it over from memory rather than read it
	// back from the store. Relays attach it only to small envelopes.
	Envelope []byte
	// Push is where the device takes a push (empty: nowhere). A hub hands
	// it to its Pusher when no relay holds the device's poll.
	Push device.PushTarget
}

// Pusher sends a content-free push to a device whose poll no relay holds.
// Its method is called from the hub's goroutines and must not block.
type Pusher interface {
	Push(k device.Key, t device.PushTarget)
}

// PushFunc is a function that is a Pusher.
type PushFunc func(k device.Key, t device.PushTarget)

// Push calls f.
func (f PushFunc) Push(k device.Key, t device.PushTarget) { f(k, t) }

// Observer learns what a hub hears, before any waiter is woken by it. Its
// methods are called from the hub's goroutines and must not block.
type Observer interface {
	// Advanced: a send committed for w.Key in its life w.Life; its head
	// in that life is now at least w.Head, and w.Envelope may carry the
	// envelope. A wake may arrive after a removal that followed its send.
	Advanced(w Wake)
	// Removed: k was removed at the time given.
	Removed(k device.Key, at time.Time)
	// Lost: news may have been missed (a reconnect, an outage). Forget
	// what was learned; every held poll is woken right after, so that it
	// reads the store again.
	Lost()
	// Forget: news of k may have been missed, because this process did
	// not listen for it until now. Forget what was learned of k; a read
	// of the store begun before the call is not kept.
	Forget(k device.Key)
}

// Hub connects senders to held polls.
type Hub interface {
	// Observe sets the observer told of every wake and removal, sent from
	// here or received, before any waiter is woken by it. The relay calls
	// it once, before it serves.
	Observe(o Observer)
	// Subscribe registers the device's one waiter on this process,
	// superseding any older one. The caller must Close the waiter.
	Subscribe(ctx context.Context, k device.Key) (Waiter, error)
	// Signal tells every relay each device's new head and wakes its
	// waiter, wherever it is held, and has each wake with a Push target
	// whose device no relay holds pushed, once. It is called after the
	// store commits; an error means only that a held poll may notice late
	// (by its own timeout or fallback), never that data is lost. It calls
	// LocalDone(ctx) once this process's waiters were told, before it
	// reaches other relays.
	Signal(ctx context.Context, wakes []Wake) error
	// PushVia sets the Pusher of wakes whose devices no relay holds. The
	// relay calls it once, before it serves; without one nothing is
	// pushed.
	PushVia(p Pusher)
	// Remove tells every relay that k was removed at the time given and ends its
	// waiters with ErrRemoved. It is called after the store committed the
	// removal.
	Remove(ctx context.Context, k device.Key, at time.Time) error
	// Held reports whether a poll for the device is held on this process.
	Held(k device.Key) bool
	// Hears reports whether every wake for k, sent from any relay, reaches
	// this process: what it learned of k from wakes is current. A process
	// that listens only for the devices it holds reads the store for the
	// rest.
	Hears(k device.Key) bool
	// NotifyAll wakes every waiter on this process, telling the observer
	// nothing, so that each reads its position again: the relay's memory
	// was dropped (a new epoch of the store).
	NotifyAll()
	// Close makes every current and future Wait return ErrClosed at once.
	Close() error
}

// localDoneKey carries the function of WithLocalDone.
type localDoneKey struct{}

// WithLocalDone returns ctx carrying fn, for Signal: fn runs on Signal's
// goroutine as soon as this process's waiters were told of the wakes, so
// that the sender can go on with them (the relay delivers to the streams
// it holds) without waiting for other relays to be told.
func WithLocalDone(ctx context.Context, fn func()) context.Context {
	return context.WithValue(ctx, localDoneKey{}, fn)
}

// LocalDone calls the function ctx carries (WithLocalDone), if any. A hub's
// Signal calls it once this process's waiters were told.
func LocalDone(ctx context.Context) {
	if fn, ok := ctx.Value(localDoneKey{}).(func()); ok {
		fn()
	}
}

// Watcher is a Waiter that can be watched without a goroutine blocked in
// Wait: a held poll that gave its goroutine up (parked) is told of news by
// a callback, and then asks what it was.
type Watcher interface {
	Waiter
	// Watch calls f when a signal arrives or the waiter ends, and at once
	// if either happened already. f runs on the caller of Signal, End or
	// Close, so it must not block; it may run more than once.
	Watch(f func())
	// Ready reports, without blocking, that a signal arrived (true, nil;
	// the signal is taken, as Wait takes it), that the waiter ended
	// (true, its error), or neither (false, nil).
	Ready() (bool, error)
}

// Waiter is one held poll's registration.
type Waiter interface {
	// Wait blocks until a signal arrives (nil), the waiter is superseded
	// (ErrSuperseded), its device is removed (ErrRemoved), the hub closes
	// (ErrClosed) or ctx ends (ctx.Err()). A signal sent after Subscribe
	// and before Wait is not lost.
	Wait(ctx context.Context) error
	// Close unregisters the waiter; it is safe to call more than once.
	Close()
}
