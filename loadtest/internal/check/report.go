package check

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/flamenet/relay/loadtest/report"
)

// Result is what a run measured, before it becomes a report.
type Result struct {
	// What the run was asked for.
	ExplicitAck bool          // -ack explicit
	Herd        bool          // -herd
	Rate        float64       // the offered rate
	Duration    time.Duration // how long sends were offered
	LateAfter   time.Duration // a send that started later than this was late

	Sends      []Send
	Recipients []*Recipient
	PeakHeld   int
	HeldEnd    int
	Start, End time.Time
	Late       int
	Refused    map[string]int
	Errors     map[string]int
	Retried    map[string]int
	Relay      report.Relay
	// Undelivered were still owed when the drain ended.
	Undelivered int
	HerdHeld    time.Duration

	HouseholdRefused int
	// CursorAhead are the 409 cursor_ahead answers, Resyncs the
	// resynchronisations after them.
	CursorAhead, Resyncs int
	Removal              map[string]int
	Campaign             *report.Campaign
	Crashes              []report.Crash
	Kills                []time.Time
	Steady               *report.Steady
	Hostile              *report.Hostile
	Renewals             *report.Renewals
	// Wakes are each relay's Redis wake-ups over the window of Relay.
	Wakes []report.RelayWakes
	// Filled from the stack, after the relays stopped.
	Exits  []string
	Memory *report.Memory
	Redis  *report.Redis
}

// Fill turns the result into the report's figures and verdict.
func (res *Result) Fill(rep *report.Report) {
	explicit := res.ExplicitAck
	v := Check(res.Sends, res.Recipients, Opts{ExplicitAck: explicit, Kills: res.Kills})
	rep.HeldPolls = res.PeakHeld
	rep.HeldPollsEnd = res.HeldEnd
	if res.Herd {
		rep.HerdHeldMS = float64(res.HerdHeld.Microseconds()) / 1000
	}
	rep.Steady = res.Steady
	rep.Crashes = res.Crashes
	rep.Hostile = res.Hostile
	rep.Renewals = res.Renewals
	rep.Memory = res.Memory
	rep.Redis = res.Redis
	rep.Wakes = res.Wakes
	rep.Redelivered = v.Redelivered
	rep.CursorAhead, rep.Resyncs = res.CursorAhead, res.Resyncs
	if len(res.Retried) > 0 {
		rep.Retried = res.Retried
	}
	if explicit && len(res.Crashes) > 0 && v.Redelivered == 0 {
		rep.RedeliveryNote = redeliveryNote(res.Crashes)
	}
	rep.OfferedRate = res.Rate
	rep.Scheduled = len(res.Sends)
	rep.LateSends = res.Late
	rep.LateThresholdMS = float64(res.LateAfter) / float64(time.Millisecond)
	rep.Refused = res.Refused
	rep.Errors = res.Errors
	for k, n := range v.Errors {
		rep.Errors[k] += n
	}
	if res.Undelivered > 0 {
		rep.Errors["owed when the drain ended"] += res.Undelivered
	}
	rep.Delivered = v.Delivered
	rep.Lost = v.Lost
	rep.Duplicates = v.Duplicates
	rep.Reordered = v.Reordered
	rep.Unexpected = v.Unexpected
	rep.Unconfirmed = v.Unconfirmed
	rep.WindowSeconds = round3(res.End.Sub(res.Start).Seconds())
	rep.Relay = res.Relay

	var a2r, s2r, req []time.Duration
	first := make([]bool, len(res.Sends))
	var lastAccepted time.Time
	for _, rec := range res.Sends {
		if rec.Outcome != Accepted {
			continue
		}
		rep.Accepted++
		req = append(req, rec.Answered.Sub(rec.Started))
		if rec.Answered.After(lastAccepted) {
			lastAccepted = rec.Answered
		}
	}
	for _, p := range res.Recipients {
		for _, got := range p.Received {
			if got.Send < 0 || first[got.Send] || res.Sends[got.Send].Pair != p.Idx {
				continue
			}
			first[got.Send] = true
			rec := res.Sends[got.Send]
			if rec.Outcome != Accepted {
				continue
			}
			a2r = append(a2r, got.At.Sub(rec.Answered))
			s2r = append(s2r, got.At.Sub(rec.Started))
		}
	}
	if rep.Accepted > 0 {
		// Over the offered window, or longer when the relay answered late:
		// a relay that falls behind shows a lower rate, never a higher one.
		if span := max(res.Duration, lastAccepted.Sub(res.Start)).Seconds(); span > 0 {
			rep.AchievedRate = math.Round(float64(rep.Accepted)/span*100) / 100
		}
	}
	rep.LatencyMS = report.Latencies{
		AcceptedToReturned: report.Summarize(a2r),
		StartedToReturned:  report.Summarize(s2r),
		SendRequest:        report.Summarize(req),
	}

	var fails []string
	if rep.Accepted == 0 {
		fails = append(fails, "no send was accepted, so nothing was measured")
	}
	if v.Lost > 0 {
		fails = append(fails, fmt.Sprintf("%d accepted sends were never delivered", v.Lost))
	}
	if v.Duplicates > 0 {
		fails = append(fails, fmt.Sprintf("%d envelopes were delivered more than once", v.Duplicates))
	}
	if v.Reordered > 0 {
		fails = append(fails, fmt.Sprintf("%d envelopes arrived out of seq order", v.Reordered))
	}
	// Those at another life of their recipient have a line of their own.
	if n := v.Unexpected - v.Elsewhere; n > 0 {
		fails = append(fails, fmt.Sprintf("%d envelopes arrived that were not accepted sends to their recipient", n))
	}
	if n := report.Total(rep.Errors); n > 0 {
		fails = append(fails, fmt.Sprintf("%d unexpected errors: %v", n, rep.Errors))
	}
	if res.HouseholdRefused > 0 {
		fails = append(fails, fmt.Sprintf("%d sends of the load's households were refused by their household's limit, which their rate never reaches", res.HouseholdRefused))
	}
	for _, c := range res.Crashes {
		if c.Error != "" {
			fails = append(fails, fmt.Sprintf("the relay did not come back after the crash at %.1f s: %s", c.AtSeconds, c.Error))
		}
	}
	if v.Homeless > 0 {
		fails = append(fails, fmt.Sprintf("%d sends were accepted while their recipient was removed and not yet registered again", v.Homeless))
	}
	if v.Elsewhere > 0 {
		fails = append(fails, fmt.Sprintf("%d envelopes arrived at a registration of their recipient that did not last while they were sent", v.Elsewhere))
	}
	if c := res.Campaign; c != nil {
		c.Owed, c.Excused, c.ExcusedDelivered, c.Straddling = v.Owed, v.Excused, v.ExcusedDelivered, v.Straddling
		c.RemovalAnswers = res.Removal
		rep.Campaign = c
		fails = append(fails, campaignFailures(c)...)
	}
	fails = append(fails, res.Exits...)
	if m := res.Memory; m != nil && m.OOMKilled {
		fails = append(fails, fmt.Sprintf("a relay was killed for want of memory under its %s cap (%d OOM kills)", report.FormatBytes(m.LimitBytes), m.OOMKills))
	}
	if rn := res.Renewals; rn != nil && (rn.Succeeded != rn.Attempted || rn.Attempted == 0) {
		fails = append(fails, fmt.Sprintf("%d of %d renewals failed: %v", rn.Attempted-rn.Succeeded, rn.Attempted, rn.Refused))
	}
	if h := res.Hostile; h != nil && report.Total(h.Failures) > 0 {
		fails = append(fails, fmt.Sprintf("%d hostile requests were mishandled: %v", report.Total(h.Failures), h.Failures))
	}
	rep.Failures = fails
	rep.OK = len(fails) == 0
}

// redeliveryNote says why a run with explicit acks and crashes saw no
// redelivery: the relay writes acks in batches, so only those of the last
// batch interval before a kill are at risk.
func redeliveryNote(crashes []report.Crash) string {
	atRisk := 0
	for _, c := range crashes {
		atRisk += c.AcksAtRisk
	}
	if atRisk == 0 {
		return "no acknowledgement was made within the relay's ack interval before any crash, so none could be lost"
	}
	var at []string
	for _, c := range crashes {
		at = append(at, fmt.Sprintf("%.1f s", c.AtSeconds))
	}
	return fmt.Sprintf("%d acknowledgements were made within the relay's ack interval before the crashes at %s, and the relay had written every one before it was killed",
		atRisk, strings.Join(at, ", "))
}

// campaignFailures are a campaign's own reasons to fail: each kind of
// broken promise, with its first example, and each fault that did not
// heal.
func campaignFailures(c *report.Campaign) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(c.Violations)) {
		line := fmt.Sprintf("%s: %d times", k, c.Violations[k])
		for _, e := range c.Examples {
			if ex, ok := strings.CutPrefix(e, k+": "); ok {
				line += "; first: " + ex
				break
			}
		}
		out = append(out, line)
	}
	for _, f := range c.Faults {
		if f.Error != "" {
			out = append(out, fmt.Sprintf("the fault planned at %.3f s (%s) failed: %s", f.AtSeconds, f.Plan, f.Error))
		}
	}
	return out
}

// round3 rounds to the thousandth, as the report's seconds are.
func round3(v float64) float64 {
	return math.Round(v*1000) / 1000
}
