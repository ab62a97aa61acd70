package storetest

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

func testExpire(t *testing.T, open Opener) {
	// Expiry only ever removes a prefix of a device's seqs, so a poll never
	// sees a hole: an envelope whose sent_at is old but that follows a
	// younger one (two sends racing for the device's lock) waits for it.
	t.Run("PrefixOnly", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a")
		sendOK(t, s, store.SendParams{Sender: "b", ID: "younger", To: []string{"a"}, Payload: []byte("x"), Now: t0.Add(10 * time.Minute)})
		sendOK(t, s, store.SendParams{Sender: "b", ID: "older", To: []string{"a"}, Payload: []byte("x"), Now: t0})
		res, err := s.Expire(ctx(t), store.ExpireParams{EnvelopesBefore: t0.Add(5 * time.Minute), SendsBefore: t0.Add(-time.Hour), Batch: 10})
		if err != nil {
			t.Fatal(err)
		}
		if got := seqs(fetchAll(t, s, hh, "a", 0)); res.Envelopes != 0 || !slices.Equal(got, []int64{1, 2}) {
			t.Fatalf("Expire = %+v, left %v: want nothing deleted while seq 1 is young", res, got)
		}
		res, err = s.Expire(ctx(t), store.ExpireParams{EnvelopesBefore: t0.Add(11 * time.Minute), SendsBefore: t0.Add(-time.Hour), Batch: 10})
		if err != nil {
			t.Fatal(err)
		}
		if got := seqs(fetchAll(t, s, hh, "a", 0)); res.Envelopes != 2 || len(got) != 0 {
			t.Fatalf("Expire = %+v, left %v: want both deleted", res, got)
		}
	})
	t.Run("Envelopes", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a", "b", "c")
		old, recent := t0, t0.Add(2*time.Hour)
		// a: three old, one recent; b: two old; c: one recent.
		for i := range 3 {
			sendOK(t, s, store.SendParams{Sender: "c", ID: "old" + strconv.Itoa(i), To: []string{"a", "b"}[:1+i%2], Payload: make([]byte, 10), Now: old})
		}
		sendOK(t, s, store.SendParams{Sender: "c", ID: "old-b", To: []string{"b"}, Payload: make([]byte, 10), Now: old})
		sendOK(t, s, store.SendParams{Sender: "c", ID: "recent", To: []string{"a", "c"}, Payload: make([]byte, 10), Now: recent})
		// a now holds 4 envelopes, 40 bytes: a limit of 4 refuses one more.
		limits := store.SendParams{Sender: "c", To: []string{"a"}, Payload: make([]byte, 10), MaxPendingEnvelopes: 4, MaxPendingBytes: 40}
		limits.ID, limits.Now = "probe", recent
		if e := isQueueFull(sendErr(s, limits), "a"); e != nil {
			t.Fatalf("before expiry: %v", e)
		}

		res, err := s.Expire(ctx(t), store.ExpireParams{
			EnvelopesBefore: old.Add(time.Hour),
			SendsBefore:     old.Add(-time.Hour), // keep every send record here
			Batch:           2,                   // fewer than are due: one call still deletes all
		})
		if err != nil {
			t.Fatalf("Expire: %v", err)
		}
		if res.Envelopes != 5 || res.Sends != 0 {
			t.Errorf("Expire = %+v, want 5 envelopes, 0 sends", res)
		}
		if got := seqs(fetchAll(t, s, hh, "a", 0)); !slices.Equal(got, []int64{4}) {
			t.Errorf("a seqs = %v, want [4]", got)
		}
		if got := fetchAll(t, s, hh, "b", 0); len(got) != 0 {
			t.Errorf("b seqs = %v, want none", seqs(got))
		}
		if got := seqs(fetchAll(t, s, hh, "c", 0)); !slices.Equal(got, []int64{1}) {
			t.Errorf("c seqs = %v, want [1]", got)
		}
		// Expiry frees room but never rewinds: cursors stay, seqs go on.
		if got := position(t, s, hh, "a"); got != (store.Position{Cursor: 0, Head: 4}) {
			t.Errorf("a position = %+v, want cursor 0 head 4", got)
		}
		r := sendOK(t, s, limits)
		if got := deliveries(r.Deliveries); got != "a:5" {
			t.Errorf("after expiry: %s, want a:5", got)
		}
		limits.ID, limits.MaxPendingEnvelopes, limits.MaxPendingBytes = "probe2", 3, 30
		r = sendOK(t, s, limits)
		if got := deliveries(r.Deliveries); got != "a:6" {
			t.Errorf("after expiry: %s, want a:6", got)
		}

		res, err = s.Expire(ctx(t), store.ExpireParams{EnvelopesBefore: old.Add(time.Hour), SendsBefore: old.Add(-time.Hour), Batch: 2})
		if err != nil || res != (store.ExpireResult{}) {
			t.Errorf("second Expire = %+v, %v, want nothing to do", res, err)
		}
	})

	t.Run("Sends", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a", "b")
		old, recent := t0, t0.Add(2*time.Hour)
		p := func(id string, now time.Time) store.SendParams {
			return store.SendParams{Household: hh, Sender: "b", ID: id, To: []string{"a"}, Payload: []byte(id), Now: now}
		}
		sendOK(t, s, p("gone", old))     // a seq 1, acked below
		sendOK(t, s, p("gone2", old))    // a seq 2, acked below
		sendOK(t, s, p("kept", old))     // a seq 3, still stored
		ack(t, s, hh, "a", 2)            // the "gone" sends have no envelope left
		sendOK(t, s, p("young", recent)) // a seq 4

		res, err := s.Expire(ctx(t), store.ExpireParams{
			EnvelopesBefore: old.Add(-time.Hour), // no envelope is due
			SendsBefore:     old.Add(time.Hour),
			Batch:           1, // fewer than are due
		})
		if err != nil {
			t.Fatalf("Expire: %v", err)
		}
		if res.Envelopes != 0 || res.Sends != 2 {
			t.Errorf("Expire = %+v, want 0 envelopes, 2 sends", res)
		}
		// A record with an envelope still stored survives: dedupe holds for
		// as long as any envelope of the send is stored.
		if r := sendOK(t, s, p("kept", recent)); !r.Repeat || deliveries(r.Deliveries) != "a:3" {
			t.Errorf("resend of kept = %s (repeat %v), want the stored answer a:3", deliveries(r.Deliveries), r.Repeat)
		}
		if r := sendOK(t, s, p("young", recent)); !r.Repeat {
			t.Error("resend of a recent send is not a Repeat")
		}
		// The expired record is gone: the id is free again, even with
		// another payload.
		q := p("gone", recent)
		q.Payload = []byte("new content")
		if r := sendOK(t, s, q); r.Repeat || deliveries(r.Deliveries) != "a:5" {
			t.Errorf("resend of an expired id = %s (repeat %v), want a new send a:5", deliveries(r.Deliveries), r.Repeat)
		}
	})

	t.Run("SendsAfterEnvelopes", func(t *testing.T) {
		// One pass expires the envelopes first, then the records they held.
		s := fresh(t, open)
		register(t, s, hh, "a")
		for i := range 3 {
			sendOK(t, s, store.SendParams{Sender: "a", ID: strconv.Itoa(i), To: []string{"a"}, Payload: []byte("x"), Now: t0})
		}
		res, err := s.Expire(ctx(t), store.ExpireParams{EnvelopesBefore: t0.Add(time.Second), SendsBefore: t0.Add(time.Second), Batch: 100})
		if err != nil {
			t.Fatalf("Expire: %v", err)
		}
		if res != (store.ExpireResult{Envelopes: 3, Sends: 3}) {
			t.Errorf("Expire = %+v, want 3 envelopes and 3 sends", res)
		}
	})
}
