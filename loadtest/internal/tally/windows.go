package tally

import (
	"math"
	"slices"
	"time"

	"github.com/flamenet/relay/loadtest/internal/answer"
	"github.com/flamenet/relay/loadtest/report"
)

// window is a span in which relays were down for a fault the tester
// caused.
type window struct {
	from, to time.Time
	relays   []int
	// retryableOnly: only failures a careful client retries (no answer, or
	// 503) are put down to the window; a campaign's faults leave the
	// relays able to answer everything else as they should.
	retryableOnly bool
}

// OpenWindow starts a window over relays, from the time given until it is
// closed, in which failures are put down to a fault the tester caused
// (only those a careful client retries, if retryableOnly); it returns its
// index.
func (t *Tally) OpenWindow(from time.Time, relays []int, retryableOnly bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.windows = append(t.windows, window{from: from, to: time.Unix(math.MaxInt32, 0), relays: relays, retryableOnly: retryableOnly})
	return len(t.windows) - 1
}

// CloseWindow ends window i at to; from then on it excuses only failures
// a careful client retries if retryableOnly.
func (t *Tally) CloseWindow(i int, to time.Time, retryableOnly bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.windows[i].to = to
	t.windows[i].retryableOnly = retryableOnly
}

// InCrashWindow reports whether a request to relay that ran over
// [from, to] and failed with err overlaps a window of that relay that
// explains err.
func (t *Tally) InCrashWindow(relay int, from, to time.Time, err error) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inCrashWindow(relay, from, to, err)
}

func (t *Tally) inCrashWindow(relay int, from, to time.Time, err error) bool {
	for _, w := range t.windows {
		if w.retryableOnly && !answer.Retryable(err) {
			continue
		}
		if slices.Contains(w.relays, relay) && !from.After(w.to) && !to.Before(w.from) {
			return true
		}
	}
	return false
}

// WindowsEnd returns the latest end of the windows of relay that overlap
// [from, to], or from when none does.
func (t *Tally) WindowsEnd(relay int, from, to time.Time) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	end := from
	for _, w := range t.windows {
		if slices.Contains(w.relays, relay) && !from.After(w.to) && !to.Before(w.from) && w.to.After(end) {
			end = w.to
		}
	}
	return end
}

// AcksBetween returns how many acknowledgements the relay answered in
// (from, to].
func (t *Tally) AcksBetween(from, to time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, a := range t.acked {
		if a.After(from) && !a.After(to) {
			n++
		}
	}
	return n
}

// Crashed records a crash of relays the tester caused, the first killed
// at killed.
func (t *Tally) Crashed(c report.Crash, killed time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.crashes = append(t.crashes, c)
	t.kills = append(t.kills, killed)
}

// Killed records that a relay was killed at the time given: what it had
// not yet written of its acks is lost.
func (t *Tally) Killed(at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.kills = append(t.kills, at)
}
