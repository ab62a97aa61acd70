package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/flamenet/relay/loadtest/report"
)

// verdict is what the checks found.
type verdict struct {
	delivered   int // accepted sends that arrived, counted once
	lost        int // accepted sends that never arrived
	duplicates  int // arrivals of a send beyond its first
	redelivered int // arrivals again after a crash lost their ack (-ack explicit), or after a resync
	reordered   int // arrivals whose seq is not above the previous one's
	unexpected  int // arrivals that are not an accepted send to this recipient
	unconfirmed int // sends with no answer that arrived anyway
	errors      map[string]int

	// By the recipient's lives (a campaign's removals): accepted sends
	// owed, excused (and of those, delivered) and straddling, as fateOf
	// says; homeless were accepted while no life existed; elsewhere
	// arrived at a life they did not overlap.
	owed, excused, excusedDelivered, straddling int
	homeless, elsewhere                         int
}

// checkOpts are what the checks need to know of the run beyond arrivals.
type checkOpts struct {
	// explicitAck: recipients acknowledged with POST /v1/ack and polled
	// without a cursor, so a crash may hand them again what they had.
	explicitAck bool
	// kills are the times relays were killed.
	kills []time.Time
}

// check holds every recipient's arrivals against what was sent: each
// accepted send arrives exactly once, at its recipient, from its sender,
// with the seq and payload it was given, in seq order; nothing else
// arrives. A recipient removed and registered again (-faults) has lives,
// each with seqs of its own: a send is owed only if it ran while a life
// lasted that was never removed, and may arrive only at a life it
// overlapped. The repeats allowed: an envelope that arrives again at the
// same life with the same seq after its client crashed (the client lost
// its place), or under explicit acks after a relay was killed (the kill
// lost its ack), is a redelivery, not a duplicate; so is an envelope that
// arrives again, by sender and id whatever its seq, after the recipient
// resynchronised (a 409 cursor_ahead: the store's history went back, and
// with it seqs and acknowledgements), and seqs are in order only between
// resyncs. Otherwise no repeat is allowed, since the relay answers from
// the cursor the client sends. A resync excuses no loss: an accepted send
// that never arrived is lost.
func check(sends []sendRecord, pairs []*pair, opts checkOpts) verdict {
	v := verdict{errors: map[string]int{}}
	seen := make([]int, len(sends)) // arrivals at the right recipient
	first := make([]received, len(sends))
	for _, p := range pairs {
		type span struct{ life, resyncs int }
		prev := map[span]int64{} // by life, between resyncs
		for _, got := range p.received {
			mine := got.send >= 0 && sends[got.send].pair == p.idx && got.from == p.sender
			ours := mine && (len(p.lives) == 0 || p.lives[got.life].mayHold(sends[got.send]))
			if ours && seen[got.send] > 0 {
				// Counted once, as a repeat, not again as out of order.
				seen[got.send]++
				f := first[got.send]
				again := got.seq == f.seq && got.life == f.life
				resynced := got.life == f.life && got.resyncs > f.resyncs
				if resynced || again && (opts.explicitAck && crashBetween(opts.kills, f.since(), got.at) || crashBetween(p.crashes, f.since(), got.at)) {
					v.redelivered++
				} else {
					v.duplicates++
				}
				continue
			}
			sp := span{got.life, got.resyncs}
			if got.seq <= prev[sp] {
				v.reordered++
			}
			prev[sp] = max(prev[sp], got.seq)
			if !ours {
				v.unexpected++
				if mine {
					v.elsewhere++
				}
				continue
			}
			seen[got.send]++
			first[got.send] = got
			rec := sends[got.send]
			if !got.payload {
				v.errors["payload differs from the one sent"]++
			}
			switch rec.outcome {
			case accepted:
				v.delivered++
				if got.seq != rec.seq {
					v.errors["seq differs from the send's answer"]++
				}
			case unknown:
				v.unconfirmed++
			default:
				// Refused or failed, yet stored: the relay said no and did it.
				v.unexpected++
			}
		}
	}
	for i, rec := range sends {
		if rec.outcome != accepted {
			continue
		}
		switch fateOf(rec, pairs[rec.pair].lives) {
		case owed:
			v.owed++
			if seen[i] == 0 {
				v.lost++
			}
		case excused:
			v.excused++
			if seen[i] > 0 {
				v.excusedDelivered++
			}
		case straddling:
			v.straddling++
		case homeless:
			v.homeless++
		}
	}
	return v
}

// crashBetween reports whether a kill falls in (from, to].
// since is the earliest the relay can have handed r over: when its poll
// was sent. An answer the killed relay wrote just before the kill may be
// read just after it.
func (r received) since() time.Time {
	if r.asked.IsZero() {
		return r.at
	}
	return r.asked
}

func crashBetween(kills []time.Time, from, to time.Time) bool {
	for _, k := range kills {
		if k.After(from) && !k.After(to) {
			return true
		}
	}
	return false
}

// fill turns the result into the report's figures and verdict.
func (res *result) fill(rep *report.Report) {
	explicit := res.cfg.ackMode == "explicit"
	v := check(res.sends, res.pairs, checkOpts{explicitAck: explicit, kills: res.kills})
	rep.HeldPolls = res.peakHeld
	rep.HeldPollsEnd = res.heldEnd
	if res.cfg.herd {
		rep.HerdHeldMS = float64(res.herdHeld.Microseconds()) / 1000
	}
	rep.Steady = res.steady
	rep.Crashes = res.crashes
	rep.Hostile = res.hostile
	rep.Renewals = res.renewals
	rep.Memory = res.memory
	rep.Redis = res.redis
	rep.Redelivered = v.redelivered
	rep.CursorAhead, rep.Resyncs = res.cursorAhead, res.resyncs
	if len(res.retried) > 0 {
		rep.Retried = res.retried
	}
	if explicit && len(res.crashes) > 0 && v.redelivered == 0 {
		rep.RedeliveryNote = redeliveryNote(res.crashes)
	}
	rep.OfferedRate = res.cfg.rate
	rep.Scheduled = len(res.sends)
	rep.LateSends = res.late
	rep.LateThresholdMS = float64(res.cfg.late) / float64(time.Millisecond)
	rep.Refused = res.refused
	rep.Errors = res.errors
	for k, n := range v.errors {
		rep.Errors[k] += n
	}
	if res.undelivered > 0 {
		rep.Errors["owed when the drain ended"] += res.undelivered
	}
	rep.Delivered = v.delivered
	rep.Lost = v.lost
	rep.Duplicates = v.duplicates
	rep.Reordered = v.reordered
	rep.Unexpected = v.unexpected
	rep.Unconfirmed = v.unconfirmed
	rep.WindowSeconds = round3(res.end.Sub(res.start).Seconds())
	rep.Relay = res.relay

	var a2r, s2r, req []time.Duration
	first := make([]bool, len(res.sends))
	var lastAccepted time.Time
	for _, rec := range res.sends {
		if rec.outcome != accepted {
			continue
		}
		rep.Accepted++
		req = append(req, rec.answered.Sub(rec.started))
		if rec.answered.After(lastAccepted) {
			lastAccepted = rec.answered
		}
	}
	for _, p := range res.pairs {
		for _, got := range p.received {
			if got.send < 0 || first[got.send] || res.sends[got.send].pair != p.idx {
				continue
			}
			first[got.send] = true
			rec := res.sends[got.send]
			if rec.outcome != accepted {
				continue
			}
			a2r = append(a2r, got.at.Sub(rec.answered))
			s2r = append(s2r, got.at.Sub(rec.started))
		}
	}
	if rep.Accepted > 0 {
		// Over the offered window, or longer when the relay answered late:
		// a relay that falls behind shows a lower rate, never a higher one.
		if span := max(res.cfg.duration, lastAccepted.Sub(res.start)).Seconds(); span > 0 {
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
	if v.lost > 0 {
		fails = append(fails, fmt.Sprintf("%d accepted sends were never delivered", v.lost))
	}
	if v.duplicates > 0 {
		fails = append(fails, fmt.Sprintf("%d envelopes were delivered more than once", v.duplicates))
	}
	if v.reordered > 0 {
		fails = append(fails, fmt.Sprintf("%d envelopes arrived out of seq order", v.reordered))
	}
	// Those at another life of their recipient have a line of their own.
	if n := v.unexpected - v.elsewhere; n > 0 {
		fails = append(fails, fmt.Sprintf("%d envelopes arrived that were not accepted sends to their recipient", n))
	}
	if n := report.Total(rep.Errors); n > 0 {
		fails = append(fails, fmt.Sprintf("%d unexpected errors: %v", n, rep.Errors))
	}
	if res.householdRefused > 0 {
		fails = append(fails, fmt.Sprintf("%d sends of the load's households were refused by their household's limit, which their rate never reaches", res.householdRefused))
	}
	for _, c := range res.crashes {
		if c.Error != "" {
			fails = append(fails, fmt.Sprintf("the relay did not come back after the crash at %.1f s: %s", c.AtSeconds, c.Error))
		}
	}
	if v.homeless > 0 {
		fails = append(fails, fmt.Sprintf("%d sends were accepted while their recipient was removed and not yet registered again", v.homeless))
	}
	if v.elsewhere > 0 {
		fails = append(fails, fmt.Sprintf("%d envelopes arrived at a registration of their recipient that did not last while they were sent", v.elsewhere))
	}
	if c := res.campaign; c != nil {
		c.Owed, c.Excused, c.ExcusedDelivered, c.Straddling = v.owed, v.excused, v.excusedDelivered, v.straddling
		c.RemovalAnswers = res.removal
		rep.Campaign = c
		fails = append(fails, campaignFailures(c)...)
	}
	fails = append(fails, res.exits...)
	if m := res.memory; m != nil && m.OOMKilled {
		fails = append(fails, fmt.Sprintf("a relay was killed for want of memory under its %s cap (%d OOM kills)", report.FormatBytes(m.LimitBytes), m.OOMKills))
	}
	if rn := res.renewals; rn != nil && (rn.Succeeded != rn.Attempted || rn.Attempted == 0) {
		fails = append(fails, fmt.Sprintf("%d of %d renewals failed: %v", rn.Attempted-rn.Succeeded, rn.Attempted, rn.Refused))
	}
	if h := res.hostile; h != nil && report.Total(h.Failures) > 0 {
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
