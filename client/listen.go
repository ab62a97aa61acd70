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

// Listen runs the device's poll loop until ctx ends or it fails: it holds
// polls (WithWait, 20 s by default), hands each envelope to h once, in seq
// order, and saves the cursor in cursors after each h returned nil, before
// the next envelope. Every poll carries the saved cursor, which
// acknowledges it. An answer with more waiting is followed at once by the
// next poll.
//
// What it survives: no answer, 429, 500 and 503 (it polls again with the
// same cursor after a backoff, honouring Retry-After); 409 cursor_ahead,
// a saved cursor above the device's head, as after the relay's data was
// restored from an older backup or the device was removed and registered
// again: it polls once without a cursor, which acknowledges nothing and
// starts above the cursor the relay knows, and goes on from the cursor
// that answer names. Nothing the relay still holds is skipped, though some
// envelopes may be handed over again: after such a recovery, seqs may name
// other envelopes than before, so an app that must not process anything
// twice tells repeats by From and ID.
//
// Listen returns nil when ctx ends (also while h runs: an h that returns an
// error because ctx ended counts as stopped, not failed), the error of h
// or of cursors, a *Error for an answer that retrying cannot fix (400,
// 401, 403, 404), or a *RedirectError.
func (c *Client) Listen(ctx context.Context, cursors CursorStore, h Handler) error {
	if c.wait < 1 {
		return errors.New("client: Listen needs a poll wait of at least 1 s")
	}
	if t := c.hc.Timeout; t != 0 && t < time.Duration(c.wait)*time.Second+pollMargin {
		return fmt.Errorf("client: the HTTP client's timeout %v is not longer than the poll wait %ds plus %v", t, c.wait, pollMargin)
	}
	cursor, err := cursors.Load(ctx)
	if err != nil {
		return err
	}
	bo := c.newBackoff()
	recovering := false // the next poll leaves the cursor out
	for {
		q := PollQuery{Cursor: cursor, Wait: c.wait}
		if recovering {
			// Not held, so that the cursor is put right at once.
			q = PollQuery{OmitCursor: true}
		}
		if !recovering {
			c.state(State{Kind: StateWaiting})
		}
		started := time.Now()
		res, err := c.Poll(ctx, q)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			var e *Error
			switch {
			case errors.As(err, &e) && e.CursorAhead() && !recovering:
				c.logf("listen: cursor %d is above the device's head %d; polling without it", cursor, e.Head)
				recovering = true
				continue
			case !retryable(err):
				return err
			}
			d := bo.next(err)
			c.logf("listen: %v; polling again in %v", err, d.Round(time.Millisecond))
			c.state(State{Kind: StateRetrying, Delay: d, Err: err})
			if sleep(ctx, d) != nil {
				return nil
			}
			continue
		}
		bo.reset()
		if !recovering && len(res.Envelopes) == 0 && !res.More && time.Since(started) < spinFloor(c.wait) {
			// A held poll that ends empty at once was most likely
			// superseded by another poller of this device (a second copy
			// of the app): polling straight back would supersede that one
			// in turn, and the two would spin. Wait a little first.
			if sleep(ctx, time.Second+rand.N(time.Second/2)) != nil {
				return nil
			}
		}
		for _, e := range res.Envelopes {
			if ctx.Err() != nil {
				// Stopped: hand nothing more over.
				return nil
			}
			// With the cursor sent, the relay never answers at or below
			// it; a recovering answer starts wherever the relay stands.
			if e.Seq <= cursor && !recovering {
				continue
			}
			if err := h(ctx, e); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("client: handler at seq %d: %w", e.Seq, err)
			}
			cursor = e.Seq
			if err := cursors.Save(ctx, cursor); err != nil {
				return err
			}
		}
		if recovering {
			if len(res.Envelopes) == 0 && res.Cursor != cursor {
				cursor = res.Cursor
				if err := cursors.Save(ctx, cursor); err != nil {
					return err
				}
			}
			c.logf("listen: recovered at cursor %d", cursor)
			recovering = false
		}
	}
}

// spinFloor is how soon an empty answer to a poll held for wait seconds
// counts as "at once": well before the relay's own early answer, which
// comes in the last tenth of the wait.
func spinFloor(wait int) time.Duration {
	return min(time.Second, time.Duration(wait)*time.Second/2)
}
