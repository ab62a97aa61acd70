package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/flamenet/relay/internal/hapg"
	"github.com/flamenet/relay/loadtest/report"
)

// A -failover run puts the throwaway relays on a highly available Postgres
// of the tester's own (internal/hapg: a pg_auto_failover monitor, a
// primary and a standby), kills the primary's machine mid-run (its keeper
// and Postgres, SIGKILL) and lets the monitor promote the standby, while
// the load goes on.

// failoverCut is how long, in async, the primary commits with its WAL
// sender stopped before it is killed: long enough that the relays answer
// sends the standby will never see.
const failoverCut = 2 * time.Second

// failoverGrace is how long after the promotion a failed request is still
// put down to the failover: one that began against the old primary may
// fail a moment after, and a relay's pool drops its dead connections as
// it meets them.
const failoverGrace = 2 * time.Second

// failover is a run's formation and what became of its primary.
type failover struct {
	mode hapg.Mode
	at   time.Duration // after the first scheduled send
	f    *hapg.Formation

	// Set by the loop, read after it ended. windowEnd is when failures
	// stopped being put down to the failover.
	cut, killed, promoted, windowEnd time.Time
	primary, promotedNode            string
	err                              error
}

// validateFailover checks what -failover needs: a throwaway stack on a
// Postgres it owns, and no other fault.
func (c *config) validateFailover() []error {
	if c.failover == "" {
		return nil
	}
	var errs []error
	if c.failover != string(hapg.Sync) && c.failover != string(hapg.Async) {
		errs = append(errs, fmt.Errorf("-failover %q: want sync or async", c.failover))
	}
	if len(c.urls) > 0 {
		errs = append(errs, errors.New("-failover needs a throwaway stack: it starts the Postgres whose primary it kills"))
	}
	switch c.store {
	case "":
		c.store = "postgres"
	case "postgres":
	default:
		errs = append(errs, errors.New("-failover needs -store postgres"))
	}
	if c.faults != nil || len(c.crashes) > 0 {
		errs = append(errs, errors.New("-failover cannot be given with -faults or -crash"))
	}
	if c.failoverAt < 0 || c.failoverAt >= c.duration {
		errs = append(errs, fmt.Errorf("-failover-at %s: must fall inside the offered duration (0 to %s)", c.failoverAt, c.duration))
	}
	if c.failoverAt == 0 {
		c.failoverAt = c.duration / 3
	}
	if c.failover == string(hapg.Async) && c.failoverAt < failoverCut {
		errs = append(errs, fmt.Errorf("-failover-at %s: async cuts replication %s before the kill, after the first send", c.failoverAt, failoverCut))
	}
	return errs
}

// startFailover starts the formation; its URL is the stack's -pg.
func startFailover(ctx context.Context, cfg *config, logger *slog.Logger) (*failover, error) {
	if err := hapg.Missing(); err != nil {
		return nil, fmt.Errorf("-failover: %w", err)
	}
	logger.Info("starting a pg_auto_failover formation", "mode", cfg.failover)
	f, err := hapg.Launch(ctx, hapg.Config{Mode: hapg.Mode(cfg.failover), Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("-failover: %w", err)
	}
	return &failover{mode: hapg.Mode(cfg.failover), at: cfg.failoverAt, f: f}, nil
}

// failoverLoop kills the primary at its time, opens a window over every
// relay from the kill until failoverGrace after the promotion (requests
// that fail in it are retried by careful clients, and counted as
// retried), and waits for the promotion.
func (r *runner) failoverLoop(ctx context.Context, start time.Time) {
	fo := r.failover
	if fo.mode == hapg.Async {
		if !sleepUntil(ctx, start.Add(fo.at-failoverCut)) {
			return
		}
		if _, err := fo.f.CutReplication(ctx); err != nil {
			fo.err = err
			r.logger.Error("failover: cut replication", "err", err)
			return
		}
		fo.cut = time.Now()
		r.logger.Info("failover: the primary's WAL sender is stopped")
	}
	if !sleepUntil(ctx, start.Add(fo.at)) {
		return
	}
	var all []int
	for i := range r.targets {
		all = append(all, i)
	}
	idx := r.openWindow(time.Now(), all)
	r.mu.Lock()
	r.windows[idx].retryableOnly = true
	r.mu.Unlock()
	old, err := fo.f.KillPrimary(ctx)
	fo.killed = time.Now()
	if err == nil {
		fo.primary = old.Name
		r.logger.Info("failover: primary killed", "node", old.Name)
		var p *hapg.Node
		p, err = fo.f.WaitPrimary(ctx, old)
		if err == nil {
			fo.promoted, fo.promotedNode = time.Now(), p.Name
			r.logger.Info("failover: standby promoted", "node", p.Name, "after", fo.promoted.Sub(fo.killed).Round(time.Millisecond))
		}
	}
	if err != nil {
		fo.err = err
		r.logger.Error("failover", "err", err)
	}
	fo.windowEnd = time.Now().Add(failoverGrace)
	r.mu.Lock()
	r.windows[idx].to = fo.windowEnd
	r.mu.Unlock()
}

// summary is the report's account of the failover: res's sends and
// deliveries, and the window's retried sends.
func (fo *failover) summary(res *result) *report.Failover {
	s := &report.Failover{Mode: string(fo.mode), Primary: fo.primary, Promoted: fo.promotedNode, SendsRefused: map[string]int{}}
	if fo.err != nil {
		s.Error = fo.err.Error()
	}
	if fo.killed.IsZero() {
		return s
	}
	s.AtSeconds = round3(fo.killed.Sub(res.start).Seconds())
	if !fo.cut.IsZero() {
		s.CutMS = millis(fo.killed.Sub(fo.cut))
	}
	if !fo.promoted.IsZero() {
		s.PromotedMS = millis(fo.promoted.Sub(fo.killed))
	}
	var first time.Time
	for _, p := range res.pairs {
		for _, got := range p.received {
			if got.send < 0 || !res.sends[got.send].started.After(fo.killed) {
				continue
			}
			if first.IsZero() || got.at.Before(first) {
				first = got.at
			}
		}
	}
	if !first.IsZero() {
		s.FirstDeliveryMS = millis(first.Sub(fo.killed))
	}
	for k, n := range res.retried {
		if strings.HasPrefix(k, "send ") {
			s.SendsRefused[strings.TrimPrefix(k, "send ")] += n
		}
	}
	// A careful sender tries a 503 again, not a 429 (the relay's
	// admission): those sends end refused.
	for _, rec := range res.sends {
		if rec.outcome == refused && !rec.answered.Before(fo.killed) && !rec.answered.After(fo.windowEnd) {
			s.SendsRefused[refusedNotRetried]++
		}
	}
	return s
}

// refusedNotRetried counts the sends of a failover's window that ended
// refused: 429s, which the tester does not try again.
const refusedNotRetried = "429, not tried again"

func millis(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}
