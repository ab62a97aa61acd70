package check

import (
	"testing"
	"time"
)

// twoPairs has two accepted sends to r0 (seq 1, 2) and one to r1 (seq 1).
func twoPairs() ([]Send, []*Recipient) {
	sends := []Send{
		{Pair: 0, Outcome: Accepted, Seq: 1},
		{Pair: 0, Outcome: Accepted, Seq: 2},
		{Pair: 1, Outcome: Accepted, Seq: 1},
	}
	pairs := []*Recipient{{Idx: 0, Sender: "s0"}, {Idx: 1, Sender: "s1"}}
	return sends, pairs
}

// t0 is the clock of the check tests; arrival k happens at t0 + k s.
var t0 = time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)

func arrival(send int, seq int64, from string) Arrival {
	return Arrival{Send: send, Seq: seq, From: from, Payload: true, At: t0}
}

// at moves an arrival to t0 + sec seconds.
func at(r Arrival, sec int) Arrival {
	r.At = t0.Add(time.Duration(sec) * time.Second)
	return r
}

// asked sets when an arrival's poll was sent, t0 + sec seconds.
func asked(r Arrival, sec int) Arrival {
	r.Asked = t0.Add(time.Duration(sec) * time.Second)
	return r
}

// after sets how many resyncs the recipient had made when the arrival's
// poll was sent.
func after(r Arrival, resyncs int) Arrival {
	r.Resyncs = resyncs
	return r
}

func TestCheck(t *testing.T) {
	type want struct{ delivered, lost, dup, redelivered, reordered, unexpected, unconfirmed, errors int }
	explicitCrashAt5 := Opts{ExplicitAck: true, Kills: []time.Time{t0.Add(5 * time.Second)}}
	for _, tc := range []struct {
		name string
		opts Opts
		edit func(sends []Send, pairs []*Recipient)
		r0   []Arrival
		r1   []Arrival
		want want
	}{
		{
			name: "clean",
			r0:   []Arrival{arrival(0, 1, "s0"), arrival(1, 2, "s0")},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 3},
		},
		{
			name: "lost",
			r0:   []Arrival{arrival(1, 2, "s0")},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 2, lost: 1},
		},
		{
			name: "duplicate is not also out of order",
			r0:   []Arrival{arrival(0, 1, "s0"), arrival(1, 2, "s0"), arrival(0, 1, "s0")},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 3, dup: 1},
		},
		{
			name: "reordered",
			r0:   []Arrival{arrival(1, 2, "s0"), arrival(0, 1, "s0")},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 3, reordered: 1},
		},
		{
			name: "wrong recipient is unexpected and still lost",
			r0:   []Arrival{arrival(0, 1, "s0"), arrival(1, 2, "s0"), arrival(2, 3, "s1")},
			want: want{delivered: 2, lost: 1, unexpected: 1},
		},
		{
			name: "wrong sender",
			r0:   []Arrival{arrival(0, 1, "s1"), arrival(1, 2, "s0")},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 2, lost: 1, unexpected: 1},
		},
		{
			name: "not one of ours",
			r0:   []Arrival{arrival(0, 1, "s0"), arrival(1, 2, "s0"), arrival(-1, 3, "s0")},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 3, unexpected: 1},
		},
		{
			name: "refused yet delivered",
			edit: func(s []Send, _ []*Recipient) { s[2].Outcome = Refused },
			r0:   []Arrival{arrival(0, 1, "s0"), arrival(1, 2, "s0")},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 2, unexpected: 1},
		},
		{
			name: "refused and not delivered is no loss",
			edit: func(s []Send, _ []*Recipient) { s[2].Outcome = Refused },
			r0:   []Arrival{arrival(0, 1, "s0"), arrival(1, 2, "s0")},
			want: want{delivered: 2},
		},
		{
			name: "unanswered but delivered",
			edit: func(s []Send, _ []*Recipient) { s[2].Outcome = Unknown },
			r0:   []Arrival{arrival(0, 1, "s0"), arrival(1, 2, "s0")},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 2, unconfirmed: 1},
		},
		{
			name: "seq differs from the answer",
			r0:   []Arrival{arrival(0, 1, "s0"), arrival(1, 3, "s0")},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 3, errors: 1},
		},
		{
			// Seq 1 and 2 arrived, the crash lost their acks, and the
			// relay handed them again before the next.
			name: "explicit acks: the same envelopes after a crash are redelivered",
			opts: explicitCrashAt5,
			r0: []Arrival{at(arrival(0, 1, "s0"), 1), at(arrival(1, 2, "s0"), 2),
				at(arrival(0, 1, "s0"), 6), at(arrival(1, 2, "s0"), 6)},
			r1:   []Arrival{at(arrival(2, 1, "s1"), 7)},
			want: want{delivered: 3, redelivered: 2},
		},
		{
			// The killed relay wrote seq 1 before the kill; the tester
			// read it after. Its poll was sent before: a redelivery.
			// Timed by the read alone, it went red as a duplicate (tried).
			name: "explicit acks: an answer read just after the kill, then again",
			opts: explicitCrashAt5,
			r0: []Arrival{asked(at(arrival(0, 1, "s0"), 6), 4), at(arrival(0, 1, "s0"), 7),
				at(arrival(1, 2, "s0"), 8)},
			r1:   []Arrival{at(arrival(2, 1, "s1"), 8)},
			want: want{delivered: 3, redelivered: 1},
		},
		{
			name: "explicit acks: a repeat with no crash between is a duplicate",
			opts: explicitCrashAt5,
			r0:   []Arrival{at(arrival(0, 1, "s0"), 1), at(arrival(1, 2, "s0"), 2), at(arrival(0, 1, "s0"), 3)},
			r1:   []Arrival{at(arrival(2, 1, "s1"), 1)},
			want: want{delivered: 3, dup: 1},
		},
		{
			name: "explicit acks: a repeat under another seq is a duplicate",
			opts: explicitCrashAt5,
			r0:   []Arrival{at(arrival(0, 1, "s0"), 1), at(arrival(1, 2, "s0"), 2), at(arrival(0, 3, "s0"), 6)},
			r1:   []Arrival{at(arrival(2, 1, "s1"), 1)},
			want: want{delivered: 3, dup: 1},
		},
		{
			// The relay answers from the cursor each poll carries: a
			// crash is no excuse for a repeat.
			name: "cursor acks: a repeat after a crash is a duplicate",
			opts: Opts{Kills: explicitCrashAt5.Kills},
			r0:   []Arrival{at(arrival(0, 1, "s0"), 1), at(arrival(1, 2, "s0"), 2), at(arrival(1, 2, "s0"), 6)},
			r1:   []Arrival{at(arrival(2, 1, "s1"), 1)},
			want: want{delivered: 3, dup: 1},
		},
		{
			// The store's history went back: the recipient resynced, and
			// the relay handed both again, one under another seq.
			name: "after a resync, the same sends are redelivered whatever their seq",
			r0: []Arrival{arrival(0, 1, "s0"), arrival(1, 2, "s0"),
				after(arrival(0, 1, "s0"), 1), after(arrival(1, 1, "s0"), 1)},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 3, redelivered: 2},
		},
		{
			// Seq 2 was lost with the store's history; its send was
			// made again after the resync and given seq 1 anew.
			name: "after a resync, seqs may start below the last one seen",
			edit: func(s []Send, _ []*Recipient) { s[1].Seq = 1 },
			r0:   []Arrival{arrival(0, 1, "s0"), after(arrival(1, 1, "s0"), 1)},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 3},
		},
		{
			name: "a resync excuses no loss",
			r0:   []Arrival{arrival(0, 1, "s0"), after(arrival(0, 1, "s0"), 2)},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 2, lost: 1, redelivered: 1},
		},
		{
			name: "a repeat between the same resyncs is a duplicate",
			r0:   []Arrival{after(arrival(0, 1, "s0"), 1), after(arrival(1, 2, "s0"), 1), after(arrival(0, 1, "s0"), 1)},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 3, dup: 1},
		},
		{
			name: "payload differs",
			r0:   []Arrival{arrival(0, 1, "s0"), {Send: 1, Seq: 2, From: "s0"}},
			r1:   []Arrival{arrival(2, 1, "s1")},
			want: want{delivered: 3, errors: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sends, pairs := twoPairs()
			if tc.edit != nil {
				tc.edit(sends, pairs)
			}
			pairs[0].Received, pairs[1].Received = tc.r0, tc.r1
			v := Check(sends, pairs, tc.opts)
			errs := 0
			for _, n := range v.Errors {
				errs += n
			}
			got := want{v.Delivered, v.Lost, v.Duplicates, v.Redelivered, v.Reordered, v.Unexpected, v.Unconfirmed, errs}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestPayloadCarriesItsID(t *testing.T) {
	for _, size := range []int{1, 8, 256} {
		p := Payload("abcd-12", size)
		if got, want := len(p), max(size, 7); got != want {
			t.Errorf("size %d: len %d, want %d", size, got, want)
		}
		if string(p[:7]) != "abcd-12" {
			t.Errorf("size %d: payload starts %q", size, p[:7])
		}
	}
	if string(Payload("a-1", 64)) == string(Payload("a-2", 64)) {
		t.Error("two ids gave the same payload")
	}
}

// TestCheckLives judges sends by the recipient's lives: r0 was removed
// (the DELETE sent at 9 s, answered at 10 s) and registered again with a
// fresh token (sent at 12 s, answered at 12.1 s).
func TestCheckLives(t *testing.T) {
	sec := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	send := func(started, answered float64, seq int64) Send {
		return Send{Pair: 0, Outcome: Accepted, Seq: seq, Started: sec(started), Answered: sec(answered)}
	}
	sends := []Send{
		0: send(1, 1.1, 1),   // to the first life: excused
		1: send(13, 13.1, 1), // to the second: owed
		2: send(14, 14.1, 2), // owed
		3: send(10.5, 11, 2), // while no life existed: homeless
		4: send(8, 12.5, 3),  // across the removal and the registration: straddling
	}
	in := func(send int, seq int64, life int, atSec float64) Arrival {
		r := arrival(send, seq, "s0")
		r.Life, r.At, r.Asked = life, sec(atSec), sec(atSec)
		return r
	}
	type want struct {
		lost, dup, redelivered, reordered, unexpected, elsewhere int
		owed, excused, excusedDelivered, straddling, homeless    int
	}
	for _, tc := range []struct {
		name    string
		r0      []Arrival
		crashes []float64
		want    want
	}{
		{
			name: "an excused send may be missing, an owed one may not",
			r0:   []Arrival{in(1, 1, 1, 13.2)},
			want: want{lost: 1, owed: 2, excused: 1, straddling: 1, homeless: 1},
		},
		{
			name: "each life counts its seqs from 1",
			r0:   []Arrival{in(0, 1, 0, 2), in(4, 3, 0, 9), in(1, 1, 1, 13.2), in(2, 2, 1, 14.2)},
			want: want{owed: 2, excused: 1, excusedDelivered: 1, straddling: 1, homeless: 1},
		},
		{
			// The old token's poll handed an envelope of the new life.
			name: "a send of the second life at the first is elsewhere and owed still",
			r0:   []Arrival{in(1, 1, 0, 13.2), in(2, 2, 1, 14.2)},
			want: want{lost: 1, unexpected: 1, elsewhere: 1, owed: 2, excused: 1, straddling: 1, homeless: 1},
		},
		{
			name:    "the same envelope after the client crashed is redelivered",
			r0:      []Arrival{in(1, 1, 1, 13.2), in(1, 1, 1, 14.5), in(2, 2, 1, 14.5)},
			crashes: []float64{14},
			want:    want{redelivered: 1, owed: 2, excused: 1, straddling: 1, homeless: 1},
		},
		{
			name: "the same envelope with no crash between is a duplicate",
			r0:   []Arrival{in(1, 1, 1, 13.2), in(1, 1, 1, 14.5), in(2, 2, 1, 14.5)},
			want: want{dup: 1, owed: 2, excused: 1, straddling: 1, homeless: 1},
		},
		{
			// A straddling send the relay gave both lives is one too many.
			name:    "the same send at two lives is a duplicate, crash or not",
			r0:      []Arrival{in(4, 3, 0, 9), in(1, 1, 1, 13.2), in(2, 2, 1, 14.2), in(4, 3, 1, 14.5)},
			crashes: []float64{14.3},
			want:    want{dup: 1, owed: 2, excused: 1, straddling: 1, homeless: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Recipient{Idx: 0, Sender: "s0", Received: tc.r0, Lives: []*Life{
				{Removing: sec(9), Removed: sec(10)},
				{Registering: sec(12), Registered: sec(12.1)},
			}}
			for _, c := range tc.crashes {
				p.Crashes = append(p.Crashes, sec(c))
			}
			v := Check(sends, []*Recipient{p}, Opts{})
			got := want{v.Lost, v.Duplicates, v.Redelivered, v.Reordered, v.Unexpected, v.Elsewhere,
				v.Owed, v.Excused, v.ExcusedDelivered, v.Straddling, v.Homeless}
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			if len(v.Errors) > 0 {
				t.Errorf("errors %v", v.Errors)
			}
		})
	}
}
