package driver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/loadtest/internal/answer"
	"github.com/flamenet/relay/loadtest/internal/wait"
)

// streamAckEvery and streamAckSeqs are when a stream's position is
// acknowledged, as the relay's own clients do: at an event or ping once
// streamAckEvery has passed since the last ack, at once when
// streamAckSeqs seqs are unacknowledged; the next stream's cursor
// acknowledges the rest.
const (
	streamAckEvery = 60 * time.Second
	streamAckSeqs  = 1000
)

// Listen starts every recipient's polls (or streams, with [Config].Stream),
// one after another until ctx ends or stop is called: the first at t0,
// the others spread over ramp. stop returns once they have ended; it may
// be called again.
func (d *Driver) Listen(ctx context.Context, t0 time.Time, ramp time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var listeners sync.WaitGroup
	for _, p := range d.pairs {
		// Without -herd the first polls spread over one wait period, so
		// their expiries spread too, as a settled population's would.
		first := t0.Add(ramp * time.Duration(p.idx) / time.Duration(len(d.pairs)))
		if d.cfg.Stream {
			listeners.Go(func() { d.streamLoop(ctx, p, first) })
		} else {
			listeners.Go(func() { d.pollLoop(ctx, p, first) })
		}
	}
	return func() {
		cancel()
		listeners.Wait()
	}
}

// pollLoop holds the recipient's polls, one after another, until ctx ends.
func (d *Driver) pollLoop(ctx context.Context, p *pair, first time.Time) {
	if !wait.Until(ctx, first) {
		return
	}
	for ctx.Err() == nil {
		d.pollOnce(ctx, p, d.cfg.Wait)
	}
}

// hold begins one poll or stream of p's current life on the relay it
// draws (p.pollRelay, where the hold's every request goes), and returns
// the life, its client of that relay and the hold's context; done ends
// the context. A new registration starts over where it says, and the next
// life's beginning ends this one's hold, as a client given a new token
// would stop using the old.
func (d *Driver) hold(ctx context.Context, p *pair) (l *life, c *client.Client, hctx context.Context, done func()) {
	l = d.current(p)
	if l.idx != p.polled {
		p.polled, p.cursor, p.epoch, p.lostPlace, p.resync = l.idx, l.cursor, l.epoch, false, false
	}
	last := p.pollRelay
	p.pollRelay = nextRelay(p.hops, last, len(d.cfg.Targets), d.cfg.Hop)
	hctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(l.ctx, cancel)
	if p.pollRelay != last && d.cfg.Explicit && !p.lostPlace && !p.resync && p.cursor > 0 {
		// A relay answers a poll without cursor from the cursor it knows,
		// and the ack the relay before took may not have reached this one
		// yet (PROTOCOL.md: for up to an ack interval): it would hand
		// again what was acknowledged, which the checks count as
		// duplicates. Acknowledged here, it is not.
		d.ack(hctx, p, l, client.Position{Cursor: p.cursor, Epoch: p.epoch})
	}
	return l, d.clientOf(l, p.pollRelay), hctx, func() {
		stop()
		cancel()
	}
}

// pollOnce makes one poll, waiting up to waitSecs, with the recipient's
// latest life and records what it returned. It reports whether the relay
// has more waiting. With -ack explicit it polls without a cursor and
// acknowledges what it received with POST /v1/ack.
func (d *Driver) pollOnce(ctx context.Context, p *pair, waitSecs int) (more bool, err error) {
	l, c, ctx, done := d.hold(ctx, p)
	defer done()
	d.tally.Holding()
	// With explicit acks the poll leaves the cursor out, so the relay
	// answers from the cursor it has stored; so does a client that lost
	// its place, and one resynchronising after a 409 cursor_ahead. The
	// epoch goes with the cursor the client keeps, whether it sends the
	// cursor or not; the last two have none.
	q := client.PollQuery{Cursor: p.cursor, OmitCursor: d.cfg.Explicit || p.lostPlace || p.resync, Wait: waitSecs}
	if !p.lostPlace && !p.resync {
		q.Epoch = p.epoch
	}
	from := time.Now()
	resp, err := c.Poll(ctx, q)
	d.tally.Released()
	at := time.Now()
	if err != nil {
		return false, d.listenFailed(ctx, p, l, "poll", q.Epoch, err, from, at)
	}
	// An answer without envelopes is no failure, a superseded poll's
	// either (200, the device held on another relay since): the next poll
	// goes on from its cursor.
	d.record(p, l, resp, from, at)
	p.lostPlace, p.resync = false, false
	crashed := len(resp.Envelopes) > 0 && d.crashClient(ctx, p)
	if d.cfg.Explicit && len(resp.Envelopes) > 0 && !crashed {
		d.ack(ctx, p, l, client.Position{Cursor: resp.Cursor, Epoch: p.epoch})
	}
	return resp.More, nil
}

// streamLoop holds the recipient's streams, one after another, until ctx
// ends.
func (d *Driver) streamLoop(ctx context.Context, p *pair, first time.Time) {
	if !wait.Until(ctx, first) {
		return
	}
	for ctx.Err() == nil {
		d.streamOnce(ctx, p)
	}
}

// streamOnce holds one stream with the recipient's latest life and
// records each batch it carries, as pollOnce records a poll's answer.
// It acknowledges lazily (streamAckEvery, streamAckSeqs), or each batch
// with -ack explicit.
func (d *Driver) streamOnce(ctx context.Context, p *pair) error {
	l, c, ctx, done := d.hold(ctx, p)
	defer done()
	d.tally.Holding()
	defer d.tally.Released()
	q := client.StreamQuery{Cursor: p.cursor, OmitCursor: d.cfg.Explicit || p.lostPlace || p.resync}
	if !p.lostPlace && !p.resync {
		q.Epoch = p.epoch
	}
	from := time.Now()
	s, err := c.Stream(ctx, q)
	if err != nil {
		return d.listenFailed(ctx, p, l, "stream", q.Epoch, err, from, time.Now())
	}
	defer s.Close()
	acked, ackedAt := p.cursor, time.Now()
	ack := func() {
		if p.cursor != acked && !p.lostPlace {
			d.ack(ctx, p, l, client.Position{Cursor: p.cursor, Epoch: p.epoch})
			acked, ackedAt = p.cursor, time.Now()
		}
	}
	for {
		ev, err := s.Next()
		at := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			d.tally.Failure("stream", p.pollRelay, err, from, at)
			wait.For(ctx, 200*time.Millisecond)
			return err
		}
		switch ev.Kind {
		case "ready", "envelopes":
			// Every batch counts as asked for when the stream opened: the
			// earliest the relay can have written it.
			d.record(p, l, ev.Result, from, at)
			p.lostPlace, p.resync = false, false
			if len(ev.Result.Envelopes) > 0 && d.crashClient(ctx, p) {
				return nil
			}
			if d.cfg.Explicit || time.Since(ackedAt) >= streamAckEvery || p.cursor-acked >= streamAckSeqs {
				ack()
			}
		case "ping":
			if time.Since(ackedAt) >= streamAckEvery {
				ack()
			}
		case "end":
			switch ev.End.Reason {
			case "superseded", "drained", "expired":
				// No failure: the next stream, on whichever relay it
				// draws, goes on from the cursor.
				return nil
			}
			if ev.End.Err != nil {
				return d.listenFailed(ctx, p, l, "stream", q.Epoch, ev.End.Err, from, at)
			}
			err := fmt.Errorf("stream ended with %q", ev.End.Reason)
			d.tally.Failure("stream", p.pollRelay, err, from, at)
			return err
		}
	}
}

// record hands what a poll of life l returned (sent at asked, answered
// at the time given) to the tally, and moves the recipient's place. Only
// the recipient's goroutine calls it.
func (d *Driver) record(p *pair, l *life, resp client.PollResult, asked, at time.Time) {
	d.accepted(p, l, "poll", asked)
	d.tally.Arrived(p.idx, l.idx, p.resyncs, p.resync, resp, asked, at)
	// The relay's cursor is the last seq returned, or the stored cursor
	// when nothing was; either way it is where the next poll acknowledges,
	// in the answer's epoch. A resynchronising answer names both.
	p.cursor = resp.Cursor
	if p.resync || resp.Epoch != "" {
		p.epoch = resp.Epoch
	}
}

// accepted tells the campaign, if there is one, that relay accepted op of
// life l, asked at asked.
func (d *Driver) accepted(p *pair, l *life, op string, asked time.Time) {
	if d.cfg.Removals != nil {
		d.cfg.Removals.Accepted(p.idx, l.idx, p.recipient, op, p.pollRelay, asked)
	}
}

// listenFailed sorts out a poll's or stream's failure, from..at: a
// removal's 401 waits for the next life, a cursor_ahead resynchronises,
// anything else is counted and waited out before the next try. It
// returns err.
func (d *Driver) listenFailed(ctx context.Context, p *pair, l *life, op, epoch string, err error, from, at time.Time) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if d.tally.RemovalAnswer(p.idx, l.idx, op, err, at) {
		d.awaitLife(ctx, p, l.idx)
		return err
	}
	if d.cursorAhead(p, op, epoch, err, from, at) {
		return err
	}
	d.tally.Failure(op, p.pollRelay, err, from, at)
	var se *client.Error
	switch {
	case errors.As(err, &se) && answer.TurnedAway(se):
		wait.For(ctx, max(se.RetryAfter, 100*time.Millisecond))
	case errors.As(err, &se):
		wait.For(ctx, time.Second) // a faulty relay must not be hammered
	default:
		wait.For(ctx, 200*time.Millisecond)
	}
	return err
}

// cursorAhead handles a 409 cursor_ahead to a poll or ack that carried
// epoch: the recipient resynchronises, polling once without cursor and
// epoch and taking that answer's, as PROTOCOL.md says a client does. The
// tally counts it.
func (d *Driver) cursorAhead(p *pair, op, epoch string, err error, from, to time.Time) bool {
	if !d.tally.CursorAhead(op, p.pollRelay, epoch, err, from, to) {
		return false
	}
	if !p.resync {
		p.resync = true
		p.resyncs++
	}
	return true
}

// ack acknowledges up to pos with life l at the relay of the recipient's
// latest hold, again and again while no definitive answer comes, as a
// client that must not lose its place would.
func (d *Driver) ack(ctx context.Context, p *pair, l *life, pos client.Position) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		from := time.Now()
		err := d.clientOf(l, p.pollRelay).Ack(ctx, pos)
		if err == nil {
			d.tally.Acked(time.Now())
			d.accepted(p, l, "ack", from)
			return
		}
		if ctx.Err() != nil || d.tally.RemovalAnswer(p.idx, l.idx, "ack", err, time.Now()) || d.cursorAhead(p, "ack", pos.Epoch, err, from, time.Now()) {
			return
		}
		d.tally.Failure("ack", p.pollRelay, err, from, time.Now())
		if !answer.Retryable(err) {
			return
		}
		wait.For(ctx, answer.RetryWait(attempt, err))
	}
}

// crashClient crashes the recipient's client if a crash is armed: it has
// received envelopes and dies before it acknowledges them, so that it
// restarts without its place and asks the relay, which hands them again.
// It reports whether it crashed.
func (d *Driver) crashClient(ctx context.Context, p *pair) bool {
	select {
	case down := <-p.crash:
		d.tally.ClientCrashed(p.idx, time.Now())
		p.lostPlace = true
		wait.For(ctx, down)
		return true
	default:
		return false
	}
}
