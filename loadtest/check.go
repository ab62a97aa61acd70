package main

import (
	"fmt"
	"math"
	"time"

	"github.com/flamenet/relay/loadtest/report"
)

// verdict is what the checks found.
type verdict struct {
	delivered   int // accepted sends that arrived, counted once
	lost        int // accepted sends that never arrived
	duplicates  int // arrivals of a send beyond its first
	reordered   int // arrivals whose seq is not above the previous one's
	unexpected  int // arrivals that are not an accepted send to this recipient
	unconfirmed int // sends with no answer that arrived anyway
	errors      map[string]int
}

// check holds every recipient's arrivals against what was sent: each
// accepted send arrives exactly once, at its recipient, from its sender,
// with the seq and payload it was given, in seq order; nothing else
// arrives.
func check(sends []sendRecord, pairs []*pair) verdict {
	v := verdict{errors: map[string]int{}}
	seen := make([]int, len(sends)) // arrivals at the right recipient
	for _, p := range pairs {
		var prev int64
		for _, got := range p.received {
			ours := got.send >= 0 && sends[got.send].pair == p.idx && got.from == p.sender
			if ours && seen[got.send] > 0 {
				// Counted once, as a duplicate, not again as out of order.
				seen[got.send]++
				v.duplicates++
				continue
			}
			if got.seq <= prev {
				v.reordered++
			}
			prev = max(prev, got.seq)
			if !ours {
				v.unexpected++
				continue
			}
			seen[got.send]++
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
		if rec.outcome == accepted && seen[i] == 0 {
			v.lost++
		}
	}
	return v
}

// fill turns the result into the report's figures and verdict.
func (res *result) fill(rep *report.Report) {
	v := check(res.sends, res.pairs)
	rep.HeldPolls = res.peakHeld
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
	if v.unexpected > 0 {
		fails = append(fails, fmt.Sprintf("%d envelopes arrived that were not accepted sends to their recipient", v.unexpected))
	}
	if n := report.Total(rep.Errors); n > 0 {
		fails = append(fails, fmt.Sprintf("%d unexpected errors: %v", n, rep.Errors))
	}
	rep.Failures = fails
	rep.OK = len(fails) == 0
}
