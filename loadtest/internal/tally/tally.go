// Package tally keeps a run's record while the load is offered: every send
// as its sender saw it, what each recipient received in each of its lives,
// the polls held, and every request that did not get the answer it wanted,
// counted as retried (a fault the tester caused explains it), refused
// (admission) or as an error. It prints the progress lines, and it keeps
// the windows in which the tester's faults excuse failures.
package tally

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/loadtest/internal/answer"
	"github.com/flamenet/relay/loadtest/internal/check"
	"github.com/flamenet/relay/loadtest/internal/wait"
	"github.com/flamenet/relay/loadtest/report"
)

// Config is what a tally is told of the run.
type Config struct {
	Logger   *slog.Logger
	Progress time.Duration // between two progress lines
	Late     time.Duration // a send that starts later than this after its time is late
	Payload  int           // bytes of each send's payload, which arrivals must match
	Tag      string        // the prefix of the run's send ids
	// Lives: recipients may be removed and registered again (a fault
	// campaign), so what is owed is judged by their lives.
	Lives bool
}

// Tally is one run's record. Its methods may be called from any goroutine.
type Tally struct {
	cfg Config
	// held is how many polls or streams are in flight, peak the most.
	held, peak atomic.Int64

	mu         sync.Mutex
	sends      []check.Send
	recipients []*check.Recipient
	devices    []string // each pair's recipient device
	pending    int      // accepted and not yet delivered
	counts     counts
	progress   []time.Duration // accepted -> returned so far, for progress lines: the summary's figure
	// windows are the spans in which a relay was down for a fault the
	// tester caused.
	windows []window
	crashes []report.Crash
	kills   []time.Time
	// acked are the times of the acknowledgements the relay answered
	// (-ack explicit), to tell which a crash may have lost.
	acked []time.Time
}

type counts struct {
	started, accepted, delivered, late int
	refused, errors, retried           map[string]int
	// removal are answers a campaign's removal explains, by kind: sends
	// to the removed device, its old token's polls and acks.
	removal map[string]int
	// householdRefused are the load's own sends refused by their
	// household's limit, which no pair's modest rate should reach.
	householdRefused int
	// cursorAhead are the 409 cursor_ahead answers to polls and acks;
	// resyncs, the polls without cursor and epoch that answered after.
	cursorAhead, resyncs int
}

// New returns an empty tally.
func New(cfg Config) *Tally {
	return &Tally{cfg: cfg, counts: counts{refused: map[string]int{}, errors: map[string]int{},
		retried: map[string]int{}, removal: map[string]int{}}}
}

// AddPair begins the record of the next pair, whose sender and recipient
// are the devices named, with its recipient's first life; it returns the
// pair's index.
func (t *Tally) AddPair(sender, recipient string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := len(t.recipients)
	t.recipients = append(t.recipients, &check.Recipient{Idx: i, Sender: sender, Lives: []*check.Life{{}}})
	t.devices = append(t.devices, recipient)
	return i
}

// Plan makes the record of n sends, before any is due.
func (t *Tally) Plan(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sends = make([]check.Send, n)
}

// Schedule names each send's pair and time, once they are known.
func (t *Tally) Schedule(pairOf func(i int) int, at func(i int) time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.sends {
		t.sends[i].Pair = pairOf(i)
		t.sends[i].Scheduled = at(i)
	}
}

// SendID returns the id send i goes under.
func (t *Tally) SendID(i int) string { return t.cfg.Tag + "-" + strconv.Itoa(i) }

// sendIndex returns the send whose id is given, or -1 for one not of
// this run's; the caller holds mu.
func (t *Tally) sendIndex(id string) int {
	rest, ok := strings.CutPrefix(id, t.cfg.Tag+"-")
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= len(t.sends) {
		return -1
	}
	return i
}

// Holding counts one more poll or stream in flight and keeps the peak.
func (t *Tally) Holding() {
	held := t.held.Add(1)
	for {
		peak := t.peak.Load()
		if held <= peak || t.peak.CompareAndSwap(peak, held) {
			return
		}
	}
}

// Released counts a poll or stream ended.
func (t *Tally) Released() { t.held.Add(-1) }

// Held returns how many polls or streams are in flight.
func (t *Tally) Held() int { return int(t.held.Load()) }

// HeldAfter returns how many polls are in flight as the sends end. A poll
// just answered (the last sends' recipients' most likely) is between its
// answer and the next poll for a moment, so the count is the highest seen
// over a short while, or the population as soon as it is seen whole.
func (t *Tally) HeldAfter(ctx context.Context) int {
	t.mu.Lock()
	pairs := int64(len(t.recipients))
	t.mu.Unlock()
	most := t.held.Load()
	deadline := time.Now().Add(250 * time.Millisecond)
	for most < pairs && time.Now().Before(deadline) && wait.For(ctx, 5*time.Millisecond) {
		most = max(most, t.held.Load())
	}
	return int(most)
}

// Started records the start of send i, late if more than [Config].Late
// after due.
func (t *Tally) Started(i int, started, due time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sends[i].Started = started
	t.counts.started++
	if started.Sub(due) > t.cfg.Late {
		t.counts.late++
	}
}

// Answered records how the relay answered send i, to relay, the last try
// of which went at from: res, or err. A send whose ctx ended got no
// answer.
func (t *Tally) Answered(ctx context.Context, i, relay int, res client.SendResult, err error, from, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec := &t.sends[i]
	rec.Answered = at
	var se *client.Error
	switch {
	case err == nil:
		rec.Outcome = check.Accepted
		if !rec.FirstAt.IsZero() { // a poll carried it before its 202 came
			t.progress = append(t.progress, rec.FirstAt.Sub(at))
		}
		rec.Seq = -1
		for _, d := range res.Deliveries {
			if d.Device == t.devices[rec.Pair] {
				rec.Seq = d.Seq
			}
		}
		if res.ID != t.SendID(i) || len(res.Deliveries) != 1 || rec.Seq < 1 {
			t.counts.errors["send answer does not match the request"]++
		}
		t.counts.accepted++
		if rec.Delivered == 0 {
			t.pending++
		}
	case ctx.Err() != nil:
		rec.Outcome = check.Unknown
	case errors.As(err, &se) && se.Status == http.StatusNotFound && se.Code == "unknown_device" &&
		check.AbsentDuring(t.recipients[rec.Pair].Lives, from, at):
		// The recipient was removed meanwhile: the answer the protocol
		// gives.
		rec.Outcome = check.Failed
		t.counts.removal["send "+answer.Kind(se)]++
	case errors.As(err, &se) && answer.TurnedAway(se):
		rec.Outcome = check.Refused
		t.failureLocked("send", relay, err, from, at)
	case errors.As(err, &se):
		rec.Outcome = check.Failed
		t.failureLocked("send", relay, err, from, at)
	default:
		rec.Outcome = check.Unknown
		t.failureLocked("send", relay, err, from, at)
	}
}

// Arrived records what a poll (or a stream's batch) of life li of pair
// brought: asked is when it was sent, at when it came; resyncs is how many
// times the recipient had resynchronised by then, and resynced, that this
// is the answer of a resync.
func (t *Tally) Arrived(pair, li, resyncs int, resynced bool, res client.PollResult, asked, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.recipients[pair]
	for _, e := range res.Envelopes {
		got := check.Arrival{Send: t.sendIndex(e.ID), ID: e.ID, Seq: e.Seq, From: e.From, At: at, Asked: asked, Life: li, Resyncs: resyncs}
		if got.Send >= 0 {
			rec := &t.sends[got.Send]
			got.Payload = string(e.Payload) == string(check.Payload(e.ID, t.cfg.Payload))
			if rec.Delivered == 0 {
				if rec.Outcome == check.Accepted {
					t.pending--
				}
				t.counts.delivered++
				rec.FirstAt = at
				if rec.Outcome == check.Accepted { // else when its 202 comes
					t.progress = append(t.progress, at.Sub(rec.Answered))
				}
			}
			rec.Delivered++
		}
		p.Received = append(p.Received, got)
	}
	if resynced {
		t.counts.resyncs++
	}
}

// Failure counts a request of op to relay that did not get the answer it
// wanted, from..to: as retried when that relay was down meanwhile for a
// fault the tester caused, as refused for 429 and 503, else as an error.
func (t *Tally) Failure(op string, relay int, err error, from, to time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failureLocked(op, relay, err, from, to)
}

func (t *Tally) failureLocked(op string, relay int, err error, from, to time.Time) {
	var se *client.Error
	switch {
	case t.inCrashWindow(relay, from, to, err):
		t.counts.retried[answer.ErrKind(op, err)]++
	case errors.As(err, &se) && answer.TurnedAway(se):
		t.counts.refused[op+" "+answer.Kind(se)]++
		if op == "send" && se.Limit == "household_send_rate" {
			t.counts.householdRefused++
		}
	default:
		t.counts.errors[answer.ErrKind(op, err)]++
	}
}

// CursorAhead reports whether err is a 409 cursor_ahead to a poll or ack
// of op that carried epoch, and counts it: every one, and as a failure as
// well one that names no other epoch than the one sent (a head behind the
// cursor with the store's history intact, or a relay without epochs).
func (t *Tally) CursorAhead(op string, relay int, epoch string, err error, from, to time.Time) bool {
	var se *client.Error
	if !errors.As(err, &se) || !se.CursorAhead() {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.counts.cursorAhead++
	if se.Epoch == "" || se.Epoch == epoch {
		t.failureLocked(op, relay, err, from, to)
	}
	return true
}

// RemovalAnswer reports whether err, to a request of op made with life li
// of pair, is the 401 that a removal of that life, begun before at,
// explains; it counts it as such.
func (t *Tally) RemovalAnswer(pair, li int, op string, err error, at time.Time) bool {
	var se *client.Error
	if !errors.As(err, &se) || se.Status != http.StatusUnauthorized {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.recipients[pair].Lives[li]
	if !l.Ended() || at.Before(l.Removing) {
		return false
	}
	t.counts.removal[op+" "+answer.Kind(se)]++
	return true
}

// CountRemoval counts an answer of kind that a campaign's removal
// explains.
func (t *Tally) CountRemoval(kind string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.counts.removal[kind]++
}

// Acked records an acknowledgement the relay answered, at.
func (t *Tally) Acked(at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.acked = append(t.acked, at)
}

// ClientCrashed records that pair's recipient's client crashed at the
// time given, and lost its place.
func (t *Tally) ClientCrashed(pair int, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.recipients[pair]
	p.Crashes = append(p.Crashes, at)
}

// ClientCrashes returns how many times recipients' clients crashed.
func (t *Tally) ClientCrashes() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, p := range t.recipients {
		n += len(p.Crashes)
	}
	return n
}

// Registered records that life li of pair was registered over
// [began, at].
func (t *Tally) Registered(pair, li int, began, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.recipients[pair].Lives[li]
	l.Registering, l.Registered = began, at
}

// BeginLife adds l, registered already, as pair's recipient's next life.
func (t *Tally) BeginLife(pair int, l *check.Life) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.recipients[pair]
	p.Lives = append(p.Lives, l)
}

// BeginRemoval records that the removal of pair's recipient's latest life
// began at the time given; it returns that life's index.
func (t *Tally) BeginRemoval(pair int, at time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	lives := t.recipients[pair].Lives
	lives[len(lives)-1].Removing = at
	return len(lives) - 1
}

// RemovalAnswered records that the removal of life li of pair was
// answered at the time given, or given up on; refused: the relay refused it, and the
// life goes on.
func (t *Tally) RemovalAnswered(pair, li int, at time.Time, refused bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.recipients[pair].Lives[li]
	l.Removed = at
	if refused {
		l.Removing, l.Removed = time.Time{}, time.Time{}
	}
}

// RemovedAt returns when the removal of life li of pair was answered;
// zero while it lasts.
func (t *Tally) RemovedAt(pair, li int) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.recipients[pair].Lives[li].Removed
}

// Owed returns how many accepted sends have not arrived and must: with lives,
// those to a life that was never removed.
func (t *Tally) Owed() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.owedLocked()
}

func (t *Tally) owedLocked() int {
	if !t.cfg.Lives {
		return t.pending
	}
	n := 0
	for _, rec := range t.sends {
		if rec.Outcome == check.Accepted && rec.Delivered == 0 && check.FateOf(rec, t.recipients[rec.Pair].Lives) == check.Owed {
			n++
		}
	}
	return n
}

// Fill puts the record into res, once the load has stopped: the sends,
// the arrivals and the counts.
func (t *Tally) Fill(res *check.Result) {
	t.mu.Lock()
	defer t.mu.Unlock()
	res.Sends = t.sends
	res.Recipients = t.recipients
	res.PeakHeld = int(t.peak.Load())
	res.Late = t.counts.late
	res.Refused = t.counts.refused
	res.Errors = t.counts.errors
	res.Retried = t.counts.retried
	res.HouseholdRefused = t.counts.householdRefused
	res.CursorAhead, res.Resyncs = t.counts.cursorAhead, t.counts.resyncs
	res.Crashes = t.crashes
	res.Kills = t.kills
	res.Removal = t.counts.removal
}

// ProgressLoop logs a progress line every [Config].Progress until ctx
// ends; t0 is when the run began.
func (t *Tally) ProgressLoop(ctx context.Context, t0 time.Time) {
	tick := time.NewTicker(t.cfg.Progress)
	defer tick.Stop()
	lastAccepted, last := 0, time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			t.mu.Lock()
			c := t.counts
			sorted := slices.Clone(t.progress)
			pending := t.owedLocked()
			refused, errs := report.Total(c.refused), report.Total(c.errors)
			t.mu.Unlock()
			p50, p99 := progressLatencies(sorted)
			rate := float64(c.accepted-lastAccepted) / now.Sub(last).Seconds()
			lastAccepted, last = c.accepted, now
			t.cfg.Logger.Info("progress",
				"t", now.Sub(t0).Round(time.Second).String(),
				"held", t.held.Load(), "peak_held", t.peak.Load(),
				"sends_per_s", fmt.Sprintf("%.1f", rate),
				"accepted", c.accepted, "delivered", c.delivered, "owed", pending,
				"accepted_to_returned_p50", p50, "accepted_to_returned_p99", p99,
				"late", c.late, "refused", refused, "errors", errs)
		}
	}
}

// progressLatencies returns a progress line's p50 and p99 of samples (sorted
// here), "" for none: computed and printed as the summary's are, so that
// the two show the same figure for the same samples.
func progressLatencies(samples []time.Duration) (p50, p99 string) {
	if len(samples) == 0 {
		return "", ""
	}
	s := report.Summarize(samples)
	return report.FormatMS(s.P50), report.FormatMS(s.P99)
}
