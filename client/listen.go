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
// order, and saves the position (cursor and store epoch) in cursors after
// each h returned nil, before the next envelope. Every poll carries the
// saved cursor, which acknowledges it, and its epoch once a relay named
// one. An answer with more waiting is followed at once by the next poll.
//
// What it survives: no answer, 429, 500 and 503 (it polls again with the
// same cursor after a backoff, honouring Retry-After); 409 cursor_ahead,
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
func (c *Client) Listen(ctx context.Context, cursors CursorStore, h Handler) error {
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
	saved := pos
	save := func() error {
		if pos == saved {
			return nil
		}
		if err := cursors.Save(ctx, pos); err != nil {
			return err
		}
		saved = pos
		return nil
	}
	bo := c.newBackoff()
	var ahead *Error // the cursor_ahead being recovered from: the next poll leaves cursor and epoch out
	for {
		recovering := ahead != nil
		q := PollQuery{Cursor: pos.Cursor, Epoch: pos.Epoch, Wait: c.wait}
		if recovering {
			// Not held, so that the position is put right at once.
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
				if e.Epoch != "" && pos.Epoch != "" && e.Epoch != pos.Epoch {
					c.logf("listen: the store's epoch is %s, not %q of cursor %d; polling without them", e.Epoch, pos.Epoch, pos.Cursor)
				} else {
					c.logf("listen: cursor %d is above the device's head %d; polling without it", pos.Cursor, e.Head)
				}
				ahead = e
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
		if recovering || res.Epoch != "" {
			// The answer's seqs are of its epoch, so the cursors saved
			// below are too; a recovering answer names the whole position.
			pos.Epoch = res.Epoch
		}
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
			if e.Seq <= pos.Cursor && !recovering {
				continue
			}
			if err := h(ctx, e); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("client: handler at seq %d: %w", e.Seq, err)
			}
			pos.Cursor = e.Seq
			if err := save(); err != nil {
				return err
			}
		}
		if recovering && len(res.Envelopes) == 0 {
			pos.Cursor = res.Cursor
		}
		// A recovery without envelopes, or an epoch learned.
		if err := save(); err != nil {
			return err
		}
		if recovering {
			c.logf("listen: resynchronised at cursor %d, epoch %q", pos.Cursor, pos.Epoch)
			c.state(State{Kind: StateResynced, Err: ahead, Position: pos})
			ahead = nil
		}
	}
}

// spinFloor is how soon an empty answer to a poll held for wait seconds
// counts as "at once": well before the relay's own early answer, which
// comes in the last tenth of the wait.
func spinFloor(wait int) time.Duration {
	return min(time.Second, time.Duration(wait)*time.Second/2)
}
