package client

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"
)

// StateKind is what a client's connection is doing, for an app to show.
type StateKind int

const (
	// StateConnected: the relay answered a request.
	StateConnected StateKind = iota + 1
	// StateWaiting: a poll is out and the relay may hold it until
	// something arrives (Listen).
	StateWaiting
	// StateRetrying: a call failed for a passing reason and is tried
	// again after State.Delay.
	StateRetrying
	// StateUnauthorized: the credentials were refused and renewing them
	// failed (or cannot be done: a fixed token); the device must be
	// paired again or given a new token.
	StateUnauthorized
	// StateResynced: Listen's position was refused with 409 cursor_ahead
	// (State.Err) and it went on from the relay's own (State.Position).
	// The store's history went back (a failover that lost commits, a
	// restored backup) or the device was registered anew: seqs may now
	// name other envelopes than before, and envelopes may be handed over
	// again, so tell repeats by From and ID.
	StateResynced
	// StateConnecting: Listen is opening a stream (State.Transport).
	StateConnecting
	// StateStopped: Listen returned, with State.Err (nil: ctx ended).
	StateStopped
)

// Transports Listen receives over, in State.Transport.
const (
	TransportStream = "stream" // GET /v1/stream
	TransportPoll   = "poll"   // GET /v1/poll
)

func (k StateKind) String() string {
	switch k {
	case StateConnected:
		return "connected"
	case StateWaiting:
		return "waiting"
	case StateRetrying:
		return "retrying"
	case StateUnauthorized:
		return "unauthorized"
	case StateResynced:
		return "resynced"
	case StateConnecting:
		return "connecting"
	case StateStopped:
		return "stopped"
	}
	return "unknown"
}

// State is one change of a client's connection state.
type State struct {
	Kind StateKind
	// Delay is how long until the retry (StateRetrying).
	Delay time.Duration
	// Err is why (StateRetrying, StateUnauthorized, StateResynced).
	Err error
	// Position is where Listen goes on from (StateResynced).
	Position Position
	// Transport is what Listen receives over (StateConnecting,
	// StateConnected, StateWaiting): TransportStream or TransportPoll;
	// "" outside Listen.
	Transport string
}

// WithStateFunc calls f on each change of the connection state: a
// streaming Listen goes connecting, then connected (the stream's first
// event came) and stays so while the stream is open; a polling one goes
// waiting (a poll is out) and connected (it answered) with each poll;
// each says its transport. Retrying is reported on every retry, with its
// delay and reason, resynced on every resynchronisation, and stopped when
// Listen returns. f runs on the calling goroutine and must return quickly.
func WithStateFunc(f func(State)) Option {
	var (
		mu   sync.Mutex
		last State
	)
	return func(c *Client) {
		c.state = func(s State) {
			mu.Lock()
			same := s.Kind == last.Kind && s.Transport == last.Transport && s.Kind != StateRetrying && s.Kind != StateResynced
			last = s
			mu.Unlock()
			if !same {
				f(s)
			}
		}
	}
}

// do makes one request with the credential source's token and, when the
// relay refuses it with 401, asks the source once for a fresh one and
// makes the request again. It reports connected and unauthorized.
func (c *Client) do(ctx context.Context, timeout time.Duration, method, path string, in any, want int, out any) error {
	tok, err := c.creds.Token(ctx)
	if err != nil {
		if errors.Is(err, ErrUnauthorized) {
			c.state(State{Kind: StateUnauthorized, Err: err})
		}
		return err
	}
	err = c.doWith(ctx, tok, timeout, method, path, in, want, out)
	var e *Error
	if errors.As(err, &e) && e.Status == http.StatusUnauthorized {
		fresh, rerr := c.creds.Refused(ctx, tok)
		switch {
		case errors.Is(rerr, ErrUnauthorized):
			c.state(State{Kind: StateUnauthorized, Err: err})
			// The relay's 401, which retrying cannot fix, and why.
			return &refusedError{relay: e, why: rerr}
		case rerr != nil:
			return rerr // renewing failed for a passing reason: retry later
		}
		err = c.doWith(ctx, fresh, timeout, method, path, in, want, out)
		if errors.As(err, &e) && e.Status == http.StatusUnauthorized {
			c.state(State{Kind: StateUnauthorized, Err: err})
			return &refusedError{relay: e, why: ErrUnauthorized}
		}
	}
	if err == nil {
		c.state(State{Kind: StateConnected, Transport: c.transportNow()})
	}
	return err
}

// refusedError is the relay's 401 after the credential source could not
// help: it is both a *Error (errors.As) and ErrUnauthorized (errors.Is).
// It reads as the relay's answer, or, when a renewal was refused, as that
// refusal, which says what to do next.
type refusedError struct {
	relay *Error
	why   error
}

func (e *refusedError) Error() string {
	if e.why != ErrUnauthorized {
		return e.why.Error()
	}
	return e.relay.Error()
}

func (e *refusedError) Unwrap() []error { return []error{e.relay, e.why} }

// transportNow returns what Listen last received over; "" before it ran.
func (c *Client) transportNow() string {
	if t := c.transport.Load(); t != nil {
		return t.(string)
	}
	return ""
}
