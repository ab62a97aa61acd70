package faults

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/flamenet/relay/internal/hapg"
	"github.com/flamenet/relay/loadtest/internal/check"
	"github.com/flamenet/relay/loadtest/internal/wait"
	"github.com/flamenet/relay/loadtest/report"
)

// A -failover run puts the throwaway relays on a highly available Postgres
// of the tester's own (internal/hapg: a pg_auto_failover monitor, a
// primary and a standby), kills the primary's machine mid-run (its keeper
// and Postgres, SIGKILL) and lets the monitor promote the standby, while
// the load goes on.

// FailoverCut is how long, in async, the primary commits with its WAL
// sender stopped before it is killed: long enough that the relays answer
// sends the standby will never see.
const FailoverCut = 2 * time.Second

// failoverGrace is how long after the promotion a failed request is still
// put down to the failover: one that began against the old primary may
// fail a moment after, and a relay's pool drops its dead connections as
// it meets them.
const failoverGrace = 2 * time.Second

// Failover is a run's formation and what became of its primary.
type Failover struct {
	mode hapg.Mode
	at   time.Duration // after the first scheduled send
	f    *hapg.Formation

	// Set by the loop, read after it ended. windowEnd is when failures
	// stopped being put down to the failover.
	cut, killed, promoted, windowEnd time.Time
	primary, promotedNode            string
	err                              error
}

// StartFailover starts a formation replicating as mode (sync or async),
// whose primary [Failover.Loop] kills the time at after the first
// scheduled send.
func StartFailover(ctx context.Context, mode string, at time.Duration, logger *slog.Logger) (*Failover, error) {
	if err := hapg.Missing(); err != nil {
		return nil, fmt.Errorf("-failover: %w", err)
	}
	logger.Info("starting a pg_auto_failover formation", "mode", mode)
	f, err := hapg.Launch(ctx, hapg.Config{Mode: hapg.Mode(mode), Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("-failover: %w", err)
	}
	return &Failover{mode: hapg.Mode(mode), at: at, f: f}, nil
}

// URL returns the formation's URL, the stack's Postgres.
func (fo *Failover) URL() string { return fo.f.URL() }

// Close tears the formation down.
func (fo *Failover) Close() error { return fo.f.Close() }

// Loop kills the primary at its time after start, opens a window in w
// over every one of relays from the kill until failoverGrace after the
// promotion (requests that fail in it are retried by careful clients, and
// counted as retried), and waits for the promotion.
func (fo *Failover) Loop(ctx context.Context, start time.Time, relays int, w Windows, logger *slog.Logger) {
	if fo.mode == hapg.Async {
		if !wait.Until(ctx, start.Add(fo.at-FailoverCut)) {
			return
		}
		if _, err := fo.f.CutReplication(ctx); err != nil {
			fo.err = err
			logger.Error("failover: cut replication", "err", err)
			return
		}
		fo.cut = time.Now()
		logger.Info("failover: the primary's WAL sender is stopped")
	}
	if !wait.Until(ctx, start.Add(fo.at)) {
		return
	}
	var all []int
	for i := range relays {
		all = append(all, i)
	}
	idx := w.OpenWindow(time.Now(), all, true)
	old, err := fo.f.KillPrimary(ctx)
	fo.killed = time.Now()
	if err == nil {
		fo.primary = old.Name
		logger.Info("failover: primary killed", "node", old.Name)
		var p *hapg.Node
		p, err = fo.f.WaitPrimary(ctx, old)
		if err == nil {
			fo.promoted, fo.promotedNode = time.Now(), p.Name
			logger.Info("failover: standby promoted", "node", p.Name, "after", fo.promoted.Sub(fo.killed).Round(time.Millisecond))
		}
	}
	if err != nil {
		fo.err = err
		logger.Error("failover", "err", err)
	}
	fo.windowEnd = time.Now().Add(failoverGrace)
	w.CloseWindow(idx, fo.windowEnd, true)
}

// Summary returns the report's account of the failover: res's sends and
// deliveries, and the window's retried sends.
func (fo *Failover) Summary(res *check.Result) *report.Failover {
	s := &report.Failover{Mode: string(fo.mode), Primary: fo.primary, Promoted: fo.promotedNode, SendsRefused: map[string]int{}}
	if fo.err != nil {
		s.Error = fo.err.Error()
	}
	if fo.killed.IsZero() {
		return s
	}
	s.AtSeconds = round3(fo.killed.Sub(res.Start).Seconds())
	if !fo.cut.IsZero() {
		s.CutMS = millis(fo.killed.Sub(fo.cut))
	}
	if !fo.promoted.IsZero() {
		s.PromotedMS = millis(fo.promoted.Sub(fo.killed))
	}
	var first time.Time
	for _, p := range res.Recipients {
		for _, got := range p.Received {
			if got.Send < 0 || !res.Sends[got.Send].Started.After(fo.killed) {
				continue
			}
			if first.IsZero() || got.At.Before(first) {
				first = got.At
			}
		}
	}
	if !first.IsZero() {
		s.FirstDeliveryMS = millis(first.Sub(fo.killed))
	}
	for k, n := range res.Retried {
		if strings.HasPrefix(k, "send ") {
			s.SendsRefused[strings.TrimPrefix(k, "send ")] += n
		}
	}
	// A careful sender tries a 503 again, not a 429 (the relay's
	// admission): those sends end refused.
	for _, rec := range res.Sends {
		if rec.Outcome == check.Refused && !rec.Answered.Before(fo.killed) && !rec.Answered.After(fo.windowEnd) {
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
