package main

import (
	"testing"
	"time"
)

// twoPairs has two accepted sends to r0 (seq 1, 2) and one to r1 (seq 1).
func twoPairs() ([]sendRecord, []*pair) {
	sends := []sendRecord{
		{pair: 0, outcome: accepted, seq: 1},
		{pair: 0, outcome: accepted, seq: 2},
		{pair: 1, outcome: accepted, seq: 1},
	}
	pairs := []*pair{{idx: 0, sender: "s0", recipient: "r0"}, {idx: 1, sender: "s1", recipient: "r1"}}
	return sends, pairs
}

// t0 is the clock of the check tests; arrival k happens at t0 + k s.
var t0 = time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)

func arrival(send int, seq int64, from string) received {
	return received{send: send, seq: seq, from: from, payload: true, at: t0}
}

// at moves an arrival to t0 + sec seconds.
func at(r received, sec int) received {
	r.at = t0.Add(time.Duration(sec) * time.Second)
	return r
}

// asked sets when an arrival's poll was sent, t0 + sec seconds.
func asked(r received, sec int) received {
	r.asked = t0.Add(time.Duration(sec) * time.Second)
	return r
}

// after sets how many resyncs the recipient had made when the arrival's
// poll was sent.
func after(r received, resyncs int) received {
	r.resyncs = resyncs
	return r
}

func TestCheck(t *testing.T) {
	type want struct{ delivered, lost, dup, redelivered, reordered, unexpected, unconfirmed, errors int }
	explicitCrashAt5 := checkOpts{explicitAck: true, kills: []time.Time{t0.Add(5 * time.Second)}}
	for _, tc := range []struct {
		name string
		opts checkOpts
		edit func(sends []sendRecord, pairs []*pair)
		r0   []received
		r1   []received
		want want
	}{
		{
			name: "clean",
			r0:   []received{arrival(0, 1, "s0"), arrival(1, 2, "s0")},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 3},
		},
		{
			name: "lost",
			r0:   []received{arrival(1, 2, "s0")},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 2, lost: 1},
		},
		{
			name: "duplicate is not also out of order",
			r0:   []received{arrival(0, 1, "s0"), arrival(1, 2, "s0"), arrival(0, 1, "s0")},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 3, dup: 1},
		},
		{
			name: "reordered",
			r0:   []received{arrival(1, 2, "s0"), arrival(0, 1, "s0")},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 3, reordered: 1},
		},
		{
			name: "wrong recipient is unexpected and still lost",
			r0:   []received{arrival(0, 1, "s0"), arrival(1, 2, "s0"), arrival(2, 3, "s1")},
			want: want{delivered: 2, lost: 1, unexpected: 1},
		},
		{
			name: "wrong sender",
			r0:   []received{arrival(0, 1, "s1"), arrival(1, 2, "s0")},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 2, lost: 1, unexpected: 1},
		},
		{
			name: "not one of ours",
			r0:   []received{arrival(0, 1, "s0"), arrival(1, 2, "s0"), arrival(-1, 3, "s0")},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 3, unexpected: 1},
		},
		{
			name: "refused yet delivered",
			edit: func(s []sendRecord, _ []*pair) { s[2].outcome = refused },
			r0:   []received{arrival(0, 1, "s0"), arrival(1, 2, "s0")},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 2, unexpected: 1},
		},
		{
			name: "refused and not delivered is no loss",
			edit: func(s []sendRecord, _ []*pair) { s[2].outcome = refused },
			r0:   []received{arrival(0, 1, "s0"), arrival(1, 2, "s0")},
			want: want{delivered: 2},
		},
		{
			name: "unanswered but delivered",
			edit: func(s []sendRecord, _ []*pair) { s[2].outcome = unknown },
			r0:   []received{arrival(0, 1, "s0"), arrival(1, 2, "s0")},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 2, unconfirmed: 1},
		},
		{
			name: "seq differs from the answer",
			r0:   []received{arrival(0, 1, "s0"), arrival(1, 3, "s0")},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 3, errors: 1},
		},
		{
			// Seq 1 and 2 arrived, the crash lost their acks, and the
			// relay handed them again before the next.
			name: "explicit acks: the same envelopes after a crash are redelivered",
			opts: explicitCrashAt5,
			r0: []received{at(arrival(0, 1, "s0"), 1), at(arrival(1, 2, "s0"), 2),
				at(arrival(0, 1, "s0"), 6), at(arrival(1, 2, "s0"), 6)},
			r1:   []received{at(arrival(2, 1, "s1"), 7)},
			want: want{delivered: 3, redelivered: 2},
		},
		{
			// The killed relay wrote seq 1 before the kill; the tester
			// read it after. Its poll was sent before: a redelivery.
			// Timed by the read alone, it went red as a duplicate (tried).
			name: "explicit acks: an answer read just after the kill, then again",
			opts: explicitCrashAt5,
			r0: []received{asked(at(arrival(0, 1, "s0"), 6), 4), at(arrival(0, 1, "s0"), 7),
				at(arrival(1, 2, "s0"), 8)},
			r1:   []received{at(arrival(2, 1, "s1"), 8)},
			want: want{delivered: 3, redelivered: 1},
		},
		{
			name: "explicit acks: a repeat with no crash between is a duplicate",
			opts: explicitCrashAt5,
			r0:   []received{at(arrival(0, 1, "s0"), 1), at(arrival(1, 2, "s0"), 2), at(arrival(0, 1, "s0"), 3)},
			r1:   []received{at(arrival(2, 1, "s1"), 1)},
			want: want{delivered: 3, dup: 1},
		},
		{
			name: "explicit acks: a repeat under another seq is a duplicate",
			opts: explicitCrashAt5,
			r0:   []received{at(arrival(0, 1, "s0"), 1), at(arrival(1, 2, "s0"), 2), at(arrival(0, 3, "s0"), 6)},
			r1:   []received{at(arrival(2, 1, "s1"), 1)},
			want: want{delivered: 3, dup: 1},
		},
		{
			// The relay answers from the cursor each poll carries: a
			// crash is no excuse for a repeat.
			name: "cursor acks: a repeat after a crash is a duplicate",
			opts: checkOpts{kills: explicitCrashAt5.kills},
			r0:   []received{at(arrival(0, 1, "s0"), 1), at(arrival(1, 2, "s0"), 2), at(arrival(1, 2, "s0"), 6)},
			r1:   []received{at(arrival(2, 1, "s1"), 1)},
			want: want{delivered: 3, dup: 1},
		},
		{
			// The store's history went back: the recipient resynced, and
			// the relay handed both again, one under another seq.
			name: "after a resync, the same sends are redelivered whatever their seq",
			r0: []received{arrival(0, 1, "s0"), arrival(1, 2, "s0"),
				after(arrival(0, 1, "s0"), 1), after(arrival(1, 1, "s0"), 1)},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 3, redelivered: 2},
		},
		{
			// Seq 2 was lost with the store's history; its send was
			// made again after the resync and given seq 1 anew.
			name: "after a resync, seqs may start below the last one seen",
			edit: func(s []sendRecord, _ []*pair) { s[1].seq = 1 },
			r0:   []received{arrival(0, 1, "s0"), after(arrival(1, 1, "s0"), 1)},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 3},
		},
		{
			name: "a resync excuses no loss",
			r0:   []received{arrival(0, 1, "s0"), after(arrival(0, 1, "s0"), 2)},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 2, lost: 1, redelivered: 1},
		},
		{
			name: "a repeat between the same resyncs is a duplicate",
			r0:   []received{after(arrival(0, 1, "s0"), 1), after(arrival(1, 2, "s0"), 1), after(arrival(0, 1, "s0"), 1)},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 3, dup: 1},
		},
		{
			name: "payload differs",
			r0:   []received{arrival(0, 1, "s0"), {send: 1, seq: 2, from: "s0"}},
			r1:   []received{arrival(2, 1, "s1")},
			want: want{delivered: 3, errors: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sends, pairs := twoPairs()
			if tc.edit != nil {
				tc.edit(sends, pairs)
			}
			pairs[0].received, pairs[1].received = tc.r0, tc.r1
			v := check(sends, pairs, tc.opts)
			errs := 0
			for _, n := range v.errors {
				errs += n
			}
			got := want{v.delivered, v.lost, v.duplicates, v.redelivered, v.reordered, v.unexpected, v.unconfirmed, errs}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestPayloadCarriesItsID(t *testing.T) {
	for _, size := range []int{1, 8, 256} {
		p := payload("abcd-12", size)
		if got, want := len(p), max(size, 7); got != want {
			t.Errorf("size %d: len %d, want %d", size, got, want)
		}
		if string(p[:7]) != "abcd-12" {
			t.Errorf("size %d: payload starts %q", size, p[:7])
		}
	}
	if string(payload("a-1", 64)) == string(payload("a-2", 64)) {
		t.Error("two ids gave the same payload")
	}
}

// TestCheckLives judges sends by the recipient's lives: r0 was removed
// (the DELETE sent at 9 s, answered at 10 s) and registered again with a
// fresh token (sent at 12 s, answered at 12.1 s).
func TestCheckLives(t *testing.T) {
	sec := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	send := func(started, answered float64, seq int64) sendRecord {
		return sendRecord{pair: 0, outcome: accepted, seq: seq, started: sec(started), answered: sec(answered)}
	}
	sends := []sendRecord{
		0: send(1, 1.1, 1),   // to the first life: excused
		1: send(13, 13.1, 1), // to the second: owed
		2: send(14, 14.1, 2), // owed
		3: send(10.5, 11, 2), // while no life existed: homeless
		4: send(8, 12.5, 3),  // across the removal and the registration: straddling
	}
	in := func(send int, seq int64, life int, atSec float64) received {
		r := arrival(send, seq, "s0")
		r.life, r.at, r.asked = life, sec(atSec), sec(atSec)
		return r
	}
	type want struct {
		lost, dup, redelivered, reordered, unexpected, elsewhere int
		owed, excused, excusedDelivered, straddling, homeless    int
	}
	for _, tc := range []struct {
		name    string
		r0      []received
		crashes []float64
		want    want
	}{
		{
			name: "an excused send may be missing, an owed one may not",
			r0:   []received{in(1, 1, 1, 13.2)},
			want: want{lost: 1, owed: 2, excused: 1, straddling: 1, homeless: 1},
		},
		{
			name: "each life counts its seqs from 1",
			r0:   []received{in(0, 1, 0, 2), in(4, 3, 0, 9), in(1, 1, 1, 13.2), in(2, 2, 1, 14.2)},
			want: want{owed: 2, excused: 1, excusedDelivered: 1, straddling: 1, homeless: 1},
		},
		{
			// The old token's poll handed an envelope of the new life.
			name: "a send of the second life at the first is elsewhere and owed still",
			r0:   []received{in(1, 1, 0, 13.2), in(2, 2, 1, 14.2)},
			want: want{lost: 1, unexpected: 1, elsewhere: 1, owed: 2, excused: 1, straddling: 1, homeless: 1},
		},
		{
			name:    "the same envelope after the client crashed is redelivered",
			r0:      []received{in(1, 1, 1, 13.2), in(1, 1, 1, 14.5), in(2, 2, 1, 14.5)},
			crashes: []float64{14},
			want:    want{redelivered: 1, owed: 2, excused: 1, straddling: 1, homeless: 1},
		},
		{
			name: "the same envelope with no crash between is a duplicate",
			r0:   []received{in(1, 1, 1, 13.2), in(1, 1, 1, 14.5), in(2, 2, 1, 14.5)},
			want: want{dup: 1, owed: 2, excused: 1, straddling: 1, homeless: 1},
		},
		{
			// A straddling send the relay gave both lives is one too many.
			name:    "the same send at two lives is a duplicate, crash or not",
			r0:      []received{in(4, 3, 0, 9), in(1, 1, 1, 13.2), in(2, 2, 1, 14.2), in(4, 3, 1, 14.5)},
			crashes: []float64{14.3},
			want:    want{dup: 1, owed: 2, excused: 1, straddling: 1, homeless: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &pair{idx: 0, sender: "s0", recipient: "r0", received: tc.r0, lives: []*life{
				{removing: sec(9), removed: sec(10)},
				{registering: sec(12), registered: sec(12.1)},
			}}
			for _, c := range tc.crashes {
				p.crashes = append(p.crashes, sec(c))
			}
			v := check(sends, []*pair{p}, checkOpts{})
			got := want{v.lost, v.duplicates, v.redelivered, v.reordered, v.unexpected, v.elsewhere,
				v.owed, v.excused, v.excusedDelivered, v.straddling, v.homeless}
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			if len(v.errors) > 0 {
				t.Errorf("errors %v", v.errors)
			}
		})
	}
}
