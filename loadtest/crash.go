package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/flamenet/relay/loadtest/report"
)

// window is a span in which relays were down for a crash the tester
// caused.
type window struct {
	from, to time.Time
	relays   []int
	// retryableOnly: only failures a careful client retries (no answer, or
	// 503) are put down to the window; a campaign's faults leave the
	// relays able to answer everything else as they should.
	retryableOnly bool
}

// crashGrace is how long after a restarted relay first answers that a
// failed request is still put down to the crash: a request sent on a
// connection to the old process may fail a moment after the new one is up.
const crashGrace = time.Second

// crashLoop kills and restarts the relays at each -crash point after
// start, and records each crash.
func (r *runner) crashLoop(ctx context.Context, start time.Time) {
	ackInterval := r.cfg.relay.AckInterval
	var targets []int
	if r.cfg.crashReplica >= 0 {
		targets = []int{r.cfg.crashReplica}
	} else {
		for i := range r.stack.replicas() {
			targets = append(targets, i)
		}
	}
	for _, at := range slices.Sorted(slices.Values(r.cfg.crashes)) {
		if !sleepUntil(ctx, start.Add(at)) {
			return
		}
		// Open before the kill, so that nothing failing from it on is
		// taken for a fault; closed once the relay answers again.
		idx := r.openWindow(time.Now(), targets)
		killed := make([]time.Time, len(targets))
		ready := make([]time.Time, len(targets))
		errs := make([]error, len(targets))
		var wg sync.WaitGroup
		for j, i := range targets {
			wg.Go(func() { killed[j], ready[j], errs[j] = r.stack.crash(ctx, i, r.cfg.crashDown) })
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
			r.logger.Error("relay did not come back after a crash", "err", c.Error)
		}
		r.mu.Lock()
		r.windows[idx].to = last.Add(crashGrace)
		c.AcksAtRisk = countBetween(r.acked, first.Add(-ackInterval), first)
		r.crashes = append(r.crashes, c)
		r.kills = append(r.kills, first)
		r.mu.Unlock()
		r.logger.Info("crash", "at", c.AtSeconds, "replicas", c.Replicas, "down_ms", c.DownMS)
	}
}

// openWindow starts a crash window that lasts until closed; it returns
// its index.
func (r *runner) openWindow(from time.Time, relays []int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.windows = append(r.windows, window{from: from, to: time.Unix(math.MaxInt32, 0), relays: relays})
	return len(r.windows) - 1
}

// inCrashWindow reports whether a request to relay that ran over
// [from, to] and failed with err overlaps a window of that relay that
// explains err; the caller holds mu.
func (r *runner) inCrashWindow(relay int, from, to time.Time, err error) bool {
	for _, w := range r.windows {
		if w.retryableOnly && !retryable(err) {
			continue
		}
		if slices.Contains(w.relays, relay) && !from.After(w.to) && !to.Before(w.from) {
			return true
		}
	}
	return false
}

// windowsEnd is the latest end of the windows of relay that overlap
// [from, to], or from when none does; the caller holds mu.
func (r *runner) windowsEnd(relay int, from, to time.Time) time.Time {
	end := from
	for _, w := range r.windows {
		if slices.Contains(w.relays, relay) && !from.After(w.to) && !to.Before(w.from) && w.to.After(end) {
			end = w.to
		}
	}
	return end
}

// countBetween counts the times in (from, to].
func countBetween(times []time.Time, from, to time.Time) int {
	n := 0
	for _, t := range times {
		if t.After(from) && !t.After(to) {
			n++
		}
	}
	return n
}

func joinMsg(a, b string) string {
	if a == "" {
		return b
	}
	return fmt.Sprintf("%s; %s", a, b)
}
