package relay

import (
	"context"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/token"
	"github.com/flamenet/relay/wake"
)

type envelopeJSON struct {
	Seq     int64  `json:"seq" msgpack:"seq"`
	ID      string `json:"id" msgpack:"id"`
	From    string `json:"from" msgpack:"from"`
	SentAt  string `json:"sent_at" msgpack:"sent_at"`
	Payload []byte `json:"payload" msgpack:"payload"`
}

type pollResponse struct {
	Cursor    int64          `json:"cursor" msgpack:"cursor"`
	More      bool           `json:"more" msgpack:"more"`
	Envelopes []envelopeJSON `json:"envelopes" msgpack:"envelopes"`
}

var errOverloaded = &httpError{Status: http.StatusServiceUnavailable, Code: codeOverloaded, Message: "Too many polls are held; try again."}

// poll is GET /v1/poll: acknowledge up to cursor, answer what is waiting,
// or hold until a send commits for this device, the wait runs out, a newer
// poll for the device arrives, or the relay drains.
func (s *Server) poll(w http.ResponseWriter, r *http.Request, c token.Claims) error {
	q, err := parseQuery(r)
	if err != nil {
		return err
	}
	cursor, err := q.int("cursor", -1, 0, math.MaxInt64)
	if err != nil {
		return err
	}
	waitSecs, err := q.int("wait", 0, 0, int64(s.cfg.MaxWait/time.Second))
	if err != nil {
		return err
	}
	limit, err := q.int("limit", 1000, 1, 1000)
	if err != nil {
		return err
	}
	if s.draining.Load() {
		return errDraining
	}
	ctx := r.Context()
	key := wake.Key{Household: c.Household, Device: c.Device}

	// The waiter is registered BEFORE the first read, so an envelope that
	// commits between the read and the wait still wakes this poll at once.
	// TestPollNoLostWakeup guards this ordering.
	var waiter wake.Waiter
	if waitSecs > 0 {
		n := s.held.Add(1)
		defer s.held.Add(-1)
		if s.cfg.MaxHeldPolls > 0 && n > int64(s.cfg.MaxHeldPolls) {
			s.metrics.refusals.WithLabelValues(refusedHeldPolls).Inc()
			return errOverloaded
		}
		waiter, err = s.hub.Subscribe(ctx, key)
		if err != nil {
			return &httpError{Status: http.StatusServiceUnavailable, Code: codeUnavailable, Message: "Polls cannot be held right now; try again.", Cause: err}
		}
		defer waiter.Close()
	}

	pos, err := offload(func() (store.Position, error) {
		sctx, cancel := s.storeCtx(ctx)
		defer cancel()
		return s.store.Ack(sctx, store.AckParams{Household: c.Household, Device: c.Device, Cursor: cursor, Now: s.now()})
	})
	if err != nil {
		return err
	}
	s.metrics.acked.Add(float64(pos.Acked))
	if s.afterFirstRead != nil {
		s.afterFirstRead(key)
	}
	deadline := time.Now().Add(time.Duration(waitSecs) * time.Second)
	// The ack read the head in the same snapshot as the cursor: at or below
	// it nothing is waiting, and the first fetch can be skipped.
	pending := pos.Head > pos.Cursor
	for {
		var batch store.Batch
		if pending {
			if batch, err = s.fetch(ctx, c, pos.Cursor, int(limit)); err != nil {
				return err
			}
		}
		pending = true // after a wake-up, always read
		if len(batch.Envelopes) > 0 {
			// A removal this relay has not heard of must not hand a
			// re-registered device's envelopes to an older token.
			if err := s.recheckRemoval(ctx, r, c); err != nil {
				return err
			}
		}
		if len(batch.Envelopes) > 0 || waiter == nil {
			s.metrics.polls.WithLabelValues(outcome(len(batch.Envelopes) > 0, pollEmpty)).Inc()
			writePoll(w, r, pos.Cursor, batch)
			return nil
		}
		werr := s.wait(ctx, waiter, deadline)
		switch {
		case werr == nil:
			s.metrics.received.Inc()
			continue // woken: read again
		case ctx.Err() != nil:
			s.metrics.polls.WithLabelValues(pollHangup).Inc()
			return nil // the client hung up; nobody to answer
		case errors.Is(werr, wake.ErrRemoved):
			// The device was removed while its poll was held: the token
			// that holds it is no longer good.
			s.metrics.polls.WithLabelValues(pollRemoved).Inc()
			return s.refuseToken(r, refusedRemoved, nil)
		case errors.Is(werr, wake.ErrSuperseded):
			s.metrics.polls.WithLabelValues(pollSuperseded).Inc()
		case errors.Is(werr, wake.ErrClosed):
			s.metrics.polls.WithLabelValues(pollDrained).Inc()
		default:
			s.metrics.polls.WithLabelValues(pollEmpty).Inc()
		}
		// Out of time, superseded by a newer poll, or draining: answer
		// with what we have, which is nothing.
		writePoll(w, r, pos.Cursor, store.Batch{})
		return nil
	}
}

// recheckRemoval asks the store whether the token's device was removed
// after the token was issued.
func (s *Server) recheckRemoval(ctx context.Context, r *http.Request, c token.Claims) error {
	removed, err := offload(func() (time.Time, error) {
		ctx, cancel := s.storeCtx(ctx)
		defer cancel()
		return s.store.RemovedAt(ctx, c.Household, c.Device)
	})
	if err != nil {
		return err
	}
	if refusedByRemoval(c, removed) {
		s.metrics.polls.WithLabelValues(pollRemoved).Inc()
		return s.refuseToken(r, refusedRemoved, nil)
	}
	return nil
}

func (s *Server) fetch(ctx context.Context, c token.Claims, after int64, limit int) (store.Batch, error) {
	return offload(func() (store.Batch, error) {
		ctx, cancel := s.storeCtx(ctx)
		defer cancel()
		return s.store.Fetch(ctx, store.FetchParams{
			Household: c.Household, Device: c.Device, After: after, Limit: limit, Budget: s.cfg.PollBudgetBytes,
		})
	})
}

// wait blocks on the waiter until deadline. It returns nil on a wake-up.
func (s *Server) wait(ctx context.Context, waiter wake.Waiter, deadline time.Time) error {
	if !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := waiter.Wait(wctx)
	if err == nil || errors.Is(err, wake.ErrSuperseded) || errors.Is(err, wake.ErrClosed) {
		return err
	}
	if wctx.Err() != nil {
		return wctx.Err()
	}
	return err
}

func outcome(delivered bool, otherwise string) string {
	if delivered {
		return pollDelivered
	}
	return otherwise
}

func writePoll(w http.ResponseWriter, r *http.Request, stored int64, b store.Batch) {
	out := pollResponse{Cursor: stored, More: b.More, Envelopes: make([]envelopeJSON, len(b.Envelopes))}
	for i, e := range b.Envelopes {
		out.Envelopes[i] = envelopeJSON{Seq: e.Seq, ID: e.ID, From: e.From, SentAt: timestamp(e.SentAt), Payload: e.Payload}
		out.Cursor = e.Seq
	}
	writeBody(w, r, http.StatusOK, out)
}
