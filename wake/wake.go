// Package wake tells a held poll that an envelope for its device was
// committed. The relay registers a waiter before a poll's first read and
// signals after a send's commit; a hub must keep a signal that lands between
// the two so that no wake-up is lost.
package wake

import (
	"context"
	"errors"
)

var (
	// ErrSuperseded: a newer poll for the same device took the waiter's
	// place on this process. The older poll answers at once.
	ErrSuperseded = errors.New("wake: superseded by a newer poll")
	// ErrClosed: the hub is draining for shutdown.
	ErrClosed = errors.New("wake: hub closed")
)

// Key names one device.
type Key struct {
	Household string
	Device    string
}

// Hub connects senders to held polls.
type Hub interface {
	// Subscribe registers the device's one waiter on this process,
	// superseding any older one. The caller must Close the waiter.
	Subscribe(ctx context.Context, k Key) (Waiter, error)
	// Signal wakes each device's waiter, wherever it is held. It is called
	// after the store commits; an error means only that a held poll may
	// notice late (by its own timeout or fallback), never that data is lost.
	Signal(ctx context.Context, keys []Key) error
	// Held reports whether a poll for the device is held on this process.
	Held(k Key) bool
	// Close makes every current and future Wait return ErrClosed at once.
	Close() error
}

// Waiter is one held poll's registration.
type Waiter interface {
	// Wait blocks until a signal arrives (nil), the waiter is superseded
	// (ErrSuperseded), the hub closes (ErrClosed) or ctx ends (ctx.Err()).
	// A signal sent after Subscribe and before Wait is not lost.
	Wait(ctx context.Context) error
	// Close unregisters the waiter; it is safe to call more than once.
	Close()
}
