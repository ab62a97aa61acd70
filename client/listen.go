package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Handler processes one envelope. It returns nil once the envelope is
// processed (its effects stored, or processing is idempotent); an error
// stops Listen with the cursor just below this envelope, so it is handed
// over again when Listen runs next.
type Handler func(ctx context.Context, e Envelope) error

// Listen runs the device's receive loop until ctx ends or it fails: it
// holds a stream (GET /v1/stream) or, where streams are not available
// (an older relay, a proxy that buffers answers: detected, and tried
// again every 5 minutes; WithStreams(false); an HTTP client with a
// Timeout), polls (WithWait, 20 s by default). It hands each envelope to
// h once, in seq order, and saves the position (cursor and store epoch) in
// cursors after each h returned nil, before the next envelope. Every poll
// and stream carries the saved cursor, which acknowledges it, and its
// epoch once a relay named one; while a stream is open, the position is
// acknowledged lazily (ackEvery, ackSeqs) and when the stream ends; a
// stream whose token is due for renewal (RenewalDue) ends, and the next
// opens with a renewed one. An
// answer with more waiting is followed at once by the next poll. A stream
// that ends (its life, a drain) or is cut is opened again from the saved
// position.
//
// What it survives: no answer, a cut stream, 429, 500 and 503 (it polls
// or streams again with the same cursor after a backoff, honouring
// Retry-After); 409 cursor_ahead,
// a saved cursor above the device's head or of another store epoch, as
// after a failover to a database that lacked the last commits, the
// relay's data was restored from an older backup, or the device was
// removed and registered again: it polls once without a cursor or epoch,
// which acknowledges nothing and starts above the cursor the relay knows,
// goes on from the cursor and epoch that answer names, and reports
// StateResynced. Nothing the relay still holds is skipped, though some
// envelopes may be handed over again: after such a recovery, seqs may name
// other envelopes than before, so an app that must not process anything
// twice tells repeats by From and ID.
//
// Listen returns nil when ctx ends (also while h runs: an h that returns an
// error because ctx ended counts as stopped, not failed), the error of h
// or of cursors, a *Error for an answer that retrying cannot fix (400,
// 401, 403, 404), or a *RedirectError.
func (c *Client) Listen(ctx context.Context, cursors CursorStore, h Handler) (err error) {
	if c.wait < 1 {
		return errors.New("client: Listen needs a poll wait of at least 1 s")
	}
	if t := c.hc.Timeout; t != 0 && t < time.Duration(c.wait)*time.Second+pollMargin {
		return fmt.Errorf("client: the HTTP client's timeout %v is not longer than the poll wait %ds plus %v", t, c.wait, pollMargin)
	}
	pos, err := cursors.Load(ctx)
	if err != nil {
		return err
	}
	l := &listener{c: c, cursors: cursors, h: h, pos: pos, saved: pos, bo: c.newRetryPause()}
	// An HTTP client with a Timeout of its own would cut every stream at
	// it: such a client polls.
	l.streams = c.streams && c.hc.Timeout == 0
	defer func() { c.state(State{Kind: StateStopped, Err: err}) }()
	for {
		var err error
		switch {
		case l.streams && l.ahead == nil && !time.Now().Before(l.streamAgain):
			err = l.stream(ctx)
		default:
			err = l.poll(ctx)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			continue
		}
		if stop := l.failed(ctx, err); stop != nil {
			if errors.Is(stop, context.Canceled) && ctx.Err() != nil {
				return nil
			}
			return stop
		}
	}
}

// listener is one Listen's state.
type listener struct {
	c          *Client
	cursors    CursorStore
	h          Handler
	pos, saved Position
	bo         *retryPause
	// ahead is the cursor_ahead being recovered from: the next poll
	// leaves cursor and epoch out.
	ahead *Error
	// streams: Listen streams when it can; streamAgain is when a stream
	// found unavailable is tried again.
	streams     bool
	streamAgain time.Time
}

// streamRetry is how long Listen polls after finding streams unavailable
// before it tries one again.
const streamRetry = 5 * time.Minute

// A stream acknowledges nothing itself: Listen acknowledges its position
// at an event or ping once ackEvery has passed since the last ack, at once
// when ackSeqs seqs are unacknowledged, and when the stream ends; the next
// stream's cursor acknowledges the rest. A lazy ack costs the relay little
// (it keeps what is unacknowledged a little longer, well inside its
// pending limits) and saves it a request for nearly every envelope of a
// device that receives a few a minute.
const (
	ackEvery = 60 * time.Second
	ackSeqs  = 1000
)

func (l *listener) save(ctx context.Context) error {
	if l.pos == l.saved {
		return nil
	}
	if err := l.cursors.Save(ctx, l.pos); err != nil {
		return err
	}
	l.saved = l.pos
	return nil
}

// failed handles a poll's or stream's failure: it returns the error that
// ends Listen, or nil once it is ready to go on (after a backoff).
func (l *listener) failed(ctx context.Context, err error) error {
	c := l.c
	var e *Error
	switch {
	case errors.As(err, &e) && e.CursorAhead() && l.ahead == nil:
		if e.Epoch != "" && l.pos.Epoch != "" && e.Epoch != l.pos.Epoch {
			c.logf("listen: the store's epoch is %s, not %q of cursor %d; polling without them", e.Epoch, l.pos.Epoch, l.pos.Cursor)
		} else {
			c.logf("listen: cursor %d is above the device's head %d; polling without it", l.pos.Cursor, e.Head)
		}
		l.ahead = e
		return nil
	case errors.Is(err, errHandler):
		return errors.Unwrap(err)
	case !retryable(err):
		return err
	}
	d := l.bo.next(err)
	c.logf("listen: %v; trying again in %v", err, d.Round(time.Millisecond))
	c.state(State{Kind: StateRetrying, Delay: d, Err: err})
	return sleep(ctx, d)
}

// errHandler wraps an error of the handler or the cursor store: Listen
// returns it as it is.
var errHandler = errors.New("client: listen stopped")

type stopError struct{ err error }

func (e *stopError) Error() string        { return e.err.Error() }
func (e *stopError) Unwrap() error        { return e.err }
func (e *stopError) Is(target error) bool { return target == errHandler }

// hand gives res's envelopes to the handler in order, saving the position
// after each.
func (l *listener) hand(ctx context.Context, res PollResult, recovering bool) error {
	if recovering || res.Epoch != "" {
		// The answer's seqs are of its epoch, so the cursors saved below
		// are too; a recovering answer names the whole position.
		l.pos.Epoch = res.Epoch
	}
	for _, e := range res.Envelopes {
		if ctx.Err() != nil {
			// Stopped: hand nothing more over.
			return ctx.Err()
		}
		// With the cursor sent, the relay never answers at or below it; a
		// recovering answer starts wherever the relay stands.
		if e.Seq <= l.pos.Cursor && !recovering {
			continue
		}
		if err := l.h(ctx, e); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return &stopError{fmt.Errorf("client: handler at seq %d: %w", e.Seq, err)}
		}
		l.pos.Cursor = e.Seq
		if err := l.save(ctx); err != nil {
			return &stopError{err}
		}
	}
	if recovering && len(res.Envelopes) == 0 {
		l.pos.Cursor = res.Cursor
	}
	// A recovery without envelopes, or an epoch learned.
	if err := l.save(ctx); err != nil {
		return &stopError{err}
	}
	return nil
}

// poll makes one poll and hands over what it answered.
func (l *listener) poll(ctx context.Context) error {
	c := l.c
	recovering := l.ahead != nil
	q := PollQuery{Cursor: l.pos.Cursor, Epoch: l.pos.Epoch, Wait: c.wait}
	if recovering {
		// Not held, so that the position is put right at once.
		q = PollQuery{OmitCursor: true}
	} else {
		c.state(State{Kind: StateWaiting, Transport: TransportPoll})
	}
	c.transport.Store(TransportPoll)
	started := time.Now()
	res, err := c.Poll(ctx, q)
	if err != nil {
		return err
	}
	l.bo.reset()
	if !recovering && len(res.Envelopes) == 0 && !res.More && time.Since(started) < spinFloor(c.wait) {
		// A held poll that ends empty at once was most likely superseded
		// by another poller of this device (a second copy of the app):
		// polling straight back would supersede that one in turn, and the
		// two would spin. Wait a little first.
		if err := sleep(ctx, time.Second+rand.N(time.Second/2)); err != nil {
			return err
		}
	}
	if err := l.hand(ctx, res, recovering); err != nil {
		return err
	}
	if recovering {
		c.logf("listen: resynchronised at cursor %d, epoch %q", l.pos.Cursor, l.pos.Epoch)
		c.state(State{Kind: StateResynced, Err: l.ahead, Position: l.pos})
		l.ahead = nil
	}
	return nil
}

// stream opens a stream from the saved position and hands over its
// batches until it ends. It acknowledges lazily (ackEvery); the next
// stream's cursor acknowledges the rest.
func (l *listener) stream(ctx context.Context) error {
	c := l.c
	c.state(State{Kind: StateConnecting, Transport: TransportStream})
	c.transport.Store(TransportStream)
	s, err := c.Stream(ctx, StreamQuery{Cursor: l.pos.Cursor, Epoch: l.pos.Epoch})
	if errors.Is(err, ErrStreamUnavailable) {
		c.logf("listen: %v; polling instead for %v", err, streamRetry)
		l.streamAgain = time.Now().Add(streamRetry)
		return nil
	}
	if err != nil {
		return err
	}
	defer s.Close()
	acked, ackedAt := l.pos, time.Now()
	ack := func() {
		if l.pos == acked || ctx.Err() != nil {
			return
		}
		if err := c.Ack(ctx, l.pos); err != nil {
			// The error last: its own words end with the step that helps.
			c.logf("listen: could not acknowledge %d (the next stream's cursor will): %v", l.pos.Cursor, err)
			return
		}
		acked, ackedAt = l.pos, time.Now()
	}
	defer ack()
	for {
		ev, err := s.Next()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, ErrStreamUnavailable):
			c.logf("listen: %v; polling instead for %v", err, streamRetry)
			l.streamAgain = time.Now().Add(streamRetry)
			return nil
		case err != nil:
			return err
		}
		switch ev.Kind {
		case "ready":
			l.bo.reset()
			c.state(State{Kind: StateConnected, Transport: TransportStream})
			if err := l.hand(ctx, ev.Result, false); err != nil {
				return err
			}
		case "envelopes":
			if err := l.hand(ctx, ev.Result, false); err != nil {
				return err
			}
			if time.Since(ackedAt) >= ackEvery || l.pos.Cursor-acked.Cursor >= ackSeqs {
				ack()
			}
		case "ping":
			if time.Since(ackedAt) >= ackEvery {
				ack()
			}
		case "end":
			switch ev.End.Reason {
			case "superseded":
				// Another copy of the app, most likely: do not take
				// the device straight back (see poll).
				return sleep(ctx, time.Second+rand.N(time.Second/2))
			case "drained", "expired":
				return nil
			}
			if ev.End.Err != nil {
				return ev.End.Err
			}
			return fmt.Errorf("%w: it ended with %q", ErrStreamCut, ev.End.Reason)
		}
		if l.tokenDue() {
			// The next stream renews as it opens.
			c.logf("listen: the token is due for renewal; opening the stream again")
			return nil
		}
	}
}

// tokenDue reports whether the credentials are due for renewal.
func (l *listener) tokenDue() bool {
	d, ok := l.c.creds.(RenewalDue)
	return ok && d.Due()
}

// spinFloor returns how soon an empty answer to a poll held for wait seconds
// counts as "at once": well before the relay's own early answer, which
// comes in the last tenth of the wait.
func spinFloor(wait int) time.Duration {
	return min(time.Second, time.Duration(wait)*time.Second/2)
}
