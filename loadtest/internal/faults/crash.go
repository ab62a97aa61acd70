package faults

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/flamenet/relay/loadtest/internal/wait"
	"github.com/flamenet/relay/loadtest/report"
)

// Relays are the throwaway stack's relays, which a fault kills and
// restarts, or pauses.
type Relays interface {
	// Replicas returns how many relays there are.
	Replicas() int
	// Crash kills relay i, starts it again after down, and says when it
	// was killed and when the new one was ready.
	Crash(ctx context.Context, i int, down time.Duration) (killed, ready time.Time, err error)
	// Pause stops relay i for hold, then continues it.
	Pause(ctx context.Context, i int, hold time.Duration) error
}

// Windows are the spans, kept by the run's tally, in which failures are
// put down to a fault the tester caused.
type Windows interface {
	// OpenWindow starts a window over relays, from the time given until
	// it is closed (excusing only the failures a careful client retries,
	// if retryableOnly), and returns its index.
	OpenWindow(from time.Time, relays []int, retryableOnly bool) int
	// CloseWindow ends window i at to.
	CloseWindow(i int, to time.Time, retryableOnly bool)
}

// CrashTally is what the crash loop needs of the run's tally: windows,
// the acknowledgements a kill may have lost, and the record of crashes.
type CrashTally interface {
	Windows
	// AcksBetween returns how many acknowledgements the relay answered in
	// (from, to].
	AcksBetween(from, to time.Time) int
	// Crashed records a crash, the first relay killed at killed.
	Crashed(c report.Crash, killed time.Time)
}

// CrashPlan is -crash's: when the relays are killed, which, and for how
// long.
type CrashPlan struct {
	At      []time.Duration // after the first scheduled send
	Replica int             // the one killed; -1: every one
	Down    time.Duration   // how long a killed relay stays down
	// AckInterval is how long the relays keep acks before they write
	// them: the acks a kill may lose.
	AckInterval time.Duration
}

// crashGrace is how long after a restarted relay first answers that a
// failed request is still put down to the crash: a request sent on a
// connection to the old process may fail a moment after the new one is up.
const crashGrace = time.Second

// CrashLoop kills and restarts relays at each of plan's points after
// start, and records each crash in t.
func CrashLoop(ctx context.Context, start time.Time, plan CrashPlan, relays Relays, t CrashTally, logger *slog.Logger) {
	var targets []int
	if plan.Replica >= 0 {
		targets = []int{plan.Replica}
	} else {
		for i := range relays.Replicas() {
			targets = append(targets, i)
		}
	}
	for _, at := range slices.Sorted(slices.Values(plan.At)) {
		if !wait.Until(ctx, start.Add(at)) {
			return
		}
		// Open before the kill, so that nothing failing from it on is
		// taken for a fault; closed once the relay answers again.
		idx := t.OpenWindow(time.Now(), targets, false)
		killed := make([]time.Time, len(targets))
		ready := make([]time.Time, len(targets))
		errs := make([]error, len(targets))
		var wg sync.WaitGroup
		for j, i := range targets {
			wg.Go(func() { killed[j], ready[j], errs[j] = relays.Crash(ctx, i, plan.Down) })
		}
		wg.Wait()

		c := report.Crash{Replicas: targets}
		first, last := killed[0], ready[0]
		var down time.Duration
		for j := range targets {
			if killed[j].Before(first) {
				first = killed[j]
			}
			if errs[j] != nil {
				c.Error = joinMsg(c.Error, errs[j].Error())
				continue
			}
			down = max(down, ready[j].Sub(killed[j]))
			if ready[j].After(last) {
				last = ready[j]
			}
		}
		c.AtSeconds = round3(first.Sub(start).Seconds())
		c.DownMS = math.Round(float64(down)/float64(time.Microsecond)) / 1000
		if c.Error != "" {
			// A relay that did not come back is no excuse for what fails
			// after: the window closes now.
			last = time.Now()
			logger.Error("relay did not come back after a crash", "err", c.Error)
		}
		t.CloseWindow(idx, last.Add(crashGrace), false)
		c.AcksAtRisk = t.AcksBetween(first.Add(-plan.AckInterval), first)
		t.Crashed(c, first)
		logger.Info("crash", "at", c.AtSeconds, "replicas", c.Replicas, "down_ms", c.DownMS)
	}
}

func joinMsg(a, b string) string {
	if a == "" {
		return b
	}
	return fmt.Sprintf("%s; %s", a, b)
}

// round3 rounds to the thousandth, as the report's seconds are.
func round3(v float64) float64 {
	return math.Round(v*1000) / 1000
}
