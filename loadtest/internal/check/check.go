package check

import "time"

// Verdict is what the checks found.
type Verdict struct {
	Delivered   int // accepted sends that arrived, counted once
	Lost        int // accepted sends that never arrived
	Duplicates  int // arrivals of a send beyond its first
	Redelivered int // arrivals again after a crash lost their ack (-ack explicit), or after a resync
	Reordered   int // arrivals whose seq is not above the previous one's
	Unexpected  int // arrivals that are not an accepted send to this recipient
	Unconfirmed int // sends with no answer that arrived anyway
	Errors      map[string]int

	// By the recipient's lives (a campaign's removals): accepted sends
	// owed, excused (and of those, delivered) and straddling, as FateOf
	// says; homeless were accepted while no life existed; elsewhere
	// arrived at a life they did not overlap.
	Owed, Excused, ExcusedDelivered, Straddling int
	Homeless, Elsewhere                         int
}

// Opts are what the checks need to know of the run beyond arrivals.
type Opts struct {
	// ExplicitAck: recipients acknowledged with POST /v1/ack and polled
	// without a cursor, so a crash may hand them again what they had.
	ExplicitAck bool
	// Kills are the times relays were killed.
	Kills []time.Time
}

// Check holds every recipient's arrivals against what was sent: each
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
func Check(sends []Send, pairs []*Recipient, opts Opts) Verdict {
	v := Verdict{Errors: map[string]int{}}
	seen := make([]int, len(sends)) // arrivals at the right recipient
	first := make([]Arrival, len(sends))
	for _, p := range pairs {
		type span struct{ life, resyncs int }
		prev := map[span]int64{} // by life, between resyncs
		for _, got := range p.Received {
			mine := got.Send >= 0 && sends[got.Send].Pair == p.Idx && got.From == p.Sender
			ours := mine && (len(p.Lives) == 0 || p.Lives[got.Life].MayHold(sends[got.Send]))
			if ours && seen[got.Send] > 0 {
				// Counted once, as a repeat, not again as out of order.
				seen[got.Send]++
				f := first[got.Send]
				again := got.Seq == f.Seq && got.Life == f.Life
				resynced := got.Life == f.Life && got.Resyncs > f.Resyncs
				if resynced || again && (opts.ExplicitAck && crashBetween(opts.Kills, f.Since(), got.At) || crashBetween(p.Crashes, f.Since(), got.At)) {
					v.Redelivered++
				} else {
					v.Duplicates++
				}
				continue
			}
			sp := span{got.Life, got.Resyncs}
			if got.Seq <= prev[sp] {
				v.Reordered++
			}
			prev[sp] = max(prev[sp], got.Seq)
			if !ours {
				v.Unexpected++
				if mine {
					v.Elsewhere++
				}
				continue
			}
			seen[got.Send]++
			first[got.Send] = got
			rec := sends[got.Send]
			if !got.Payload {
				v.Errors["payload differs from the one sent"]++
			}
			switch rec.Outcome {
			case Accepted:
				v.Delivered++
				if got.Seq != rec.Seq {
					v.Errors["seq differs from the send's answer"]++
				}
			case Unknown:
				v.Unconfirmed++
			default:
				// Refused or failed, yet stored: the relay said no and did it.
				v.Unexpected++
			}
		}
	}
	for i, rec := range sends {
		if rec.Outcome != Accepted {
			continue
		}
		switch FateOf(rec, pairs[rec.Pair].Lives) {
		case Owed:
			v.Owed++
			if seen[i] == 0 {
				v.Lost++
			}
		case Excused:
			v.Excused++
			if seen[i] > 0 {
				v.ExcusedDelivered++
			}
		case Straddling:
			v.Straddling++
		case Homeless:
			v.Homeless++
		}
	}
	return v
}

// crashBetween reports whether a kill falls in (from, to].
func crashBetween(kills []time.Time, from, to time.Time) bool {
	for _, k := range kills {
		if k.After(from) && !k.After(to) {
			return true
		}
	}
	return false
}
