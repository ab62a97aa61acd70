package storetest

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

func testAck(t *testing.T, open Opener) {
	t.Run("MovesUpOnly", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a", "b")
		for i := range 5 {
			sendOK(t, s, store.SendParams{Sender: "b", ID: strconv.Itoa(i), To: []string{"a"}, Payload: []byte("x")})
		}
		// later steps come long after the rest, so that a backend that
		// writes last_seen only now and then writes on those acks too.
		steps := []struct {
			name   string
			cursor int64
			later  bool
			want   store.Position
			left   []int64 // seqs still stored
		}{
			{"position only", -1, false, store.Position{Cursor: 0, Head: 5}, []int64{1, 2, 3, 4, 5}},
			{"zero moves nothing", 0, false, store.Position{Cursor: 0, Head: 5}, []int64{1, 2, 3, 4, 5}},
			{"up", 2, false, store.Position{Cursor: 2, Head: 5, Acked: 2}, []int64{3, 4, 5}},
			{"same", 2, false, store.Position{Cursor: 2, Head: 5}, []int64{3, 4, 5}},
			{"below never moves down", 1, false, store.Position{Cursor: 2, Head: 5}, []int64{3, 4, 5}},
			{"below, later", 1, true, store.Position{Cursor: 2, Head: 5}, []int64{3, 4, 5}},
			{"zero, later", 0, true, store.Position{Cursor: 2, Head: 5}, []int64{3, 4, 5}},
			{"position after", -1, true, store.Position{Cursor: 2, Head: 5}, []int64{3, 4, 5}},
			{"to head", 5, false, store.Position{Cursor: 5, Head: 5, Acked: 3}, nil},
		}
		for i, st := range steps {
			now := t0
			if st.later {
				now = t0.Add(time.Duration(i) * time.Hour)
			}
			got, err := s.Ack(ctx(t), store.AckParams{Household: hh, Device: "a", Cursor: st.cursor, Now: now})
			if err != nil {
				t.Fatalf("%s: Ack(%d): %v", st.name, st.cursor, err)
			}
			if got = withoutEpoch(t, got); got != st.want {
				t.Errorf("%s: Ack(%d) = %+v, want %+v", st.name, st.cursor, got, st.want)
			}
			if left := seqs(fetchAll(t, s, hh, "a", 0)); !slices.Equal(left, st.left) {
				t.Errorf("%s: stored seqs %v, want %v", st.name, left, st.left)
			}
		}
		res := sendOK(t, s, store.SendParams{Sender: "b", ID: "next", To: []string{"a"}, Payload: []byte("x")})
		if got := deliveries(res.Deliveries); got != "a:6" {
			t.Errorf("send after ack = %s, want a:6: acks never reset seqs", got)
		}
	})

	t.Run("CursorAhead", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a")
		for i := range 3 {
			sendOK(t, s, store.SendParams{Sender: "a", ID: strconv.Itoa(i), To: []string{"a"}, Payload: []byte("x")})
		}
		ack(t, s, hh, "a", 1)
		_, err := s.Ack(ctx(t), store.AckParams{Household: hh, Device: "a", Cursor: 4, Now: t0})
		if !errors.Is(err, store.ErrCursorAhead) {
			t.Fatalf("Ack(4) with head 3 = %v, want ErrCursorAhead", err)
		}
		var ae *store.CursorAheadError
		if !errors.As(err, &ae) || ae.Head != 3 {
			t.Fatalf("Ack(4) = %#v, want a *CursorAheadError with Head 3", err)
		}
		if got := position(t, s, hh, "a"); got != (store.Position{Cursor: 1, Head: 3}) {
			t.Errorf("position after a refused ack = %+v, want cursor 1 head 3", got)
		}
		if got := seqs(fetchAll(t, s, hh, "a", 0)); !slices.Equal(got, []int64{2, 3}) {
			t.Errorf("stored seqs %v after a refused ack, want [2 3]", got)
		}
	})

	t.Run("RegistersUnknownDevice", func(t *testing.T) {
		for _, cursor := range []int64{-1, 0} {
			t.Run("cursor "+strconv.FormatInt(cursor, 10), func(t *testing.T) {
				s := fresh(t, open)
				register(t, s, hh, "sender")
				got, err := s.Ack(ctx(t), store.AckParams{Household: hh, Device: "newbie", Cursor: cursor, Now: t0})
				if err != nil {
					t.Fatalf("Ack of an unregistered device: %v", err)
				}
				if got = withoutEpoch(t, got); got != (store.Position{}) {
					t.Errorf("Position = %+v, want zero", got)
				}
				ds := listAll(t, s, hh)
				if gotNames := names(ds); !slices.Equal(gotNames, []string{"newbie", "sender"}) {
					t.Fatalf("Devices = %v, want newbie registered by its ack", gotNames)
				}
				if nb := ds[0]; !nb.RegisteredAt.Equal(t0) || !nb.Push.Empty() {
					t.Errorf("newbie = %+v, want registered at %v with no push", nb, t0)
				}
				res := sendOK(t, s, store.SendParams{Sender: "sender", ID: "1", To: []string{"newbie"}, Payload: []byte("x")})
				if got := deliveries(res.Deliveries); got != "newbie:1" {
					t.Errorf("send to newbie = %s, want newbie:1", got)
				}
			})
		}
	})

	t.Run("Households", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, "h1", "a")
		register(t, s, "h2", "a")
		for _, h := range []string{"h1", "h2"} {
			for i := range 2 {
				sendOK(t, s, store.SendParams{Household: h, Sender: "a", ID: strconv.Itoa(i), To: []string{"a"}, Payload: []byte("x")})
			}
		}
		ack(t, s, "h1", "a", 2)
		if got := seqs(fetchAll(t, s, "h2", "a", 0)); !slices.Equal(got, []int64{1, 2}) {
			t.Errorf("h2/a seqs = %v after h1/a's ack, want [1 2]", got)
		}
	})
}

func testFetch(t *testing.T, open Opener) {
	s := fresh(t, open)
	register(t, s, hh, "a", "b", "big", "mixed")
	for i := range 5 {
		sendOK(t, s, store.SendParams{Sender: "b", ID: strconv.Itoa(i), To: []string{"a"}, Payload: bytes.Repeat([]byte{byte('0' + i)}, 10)})
	}
	// "mixed" holds sizes 100, 1, 1, 50, 1 at seqs 1..5.
	for i, n := range []int{100, 1, 1, 50, 1} {
		sendOK(t, s, store.SendParams{Sender: "b", ID: "m" + strconv.Itoa(i), To: []string{"mixed"}, Payload: make([]byte, n)})
	}

	tests := []struct {
		name   string
		device string
		after  int64
		limit  int
		budget int64
		want   []int64
		more   bool
	}{
		{"all", "a", 0, 100, 1000, []int64{1, 2, 3, 4, 5}, false},
		{"limit", "a", 0, 2, 1000, []int64{1, 2}, true},
		{"limit exactly what waits", "a", 0, 5, 1000, []int64{1, 2, 3, 4, 5}, false},
		{"after", "a", 2, 100, 1000, []int64{3, 4, 5}, false},
		{"after and limit", "a", 2, 2, 1000, []int64{3, 4}, true},
		{"after head", "a", 5, 100, 1000, nil, false},
		{"far after head", "a", 99, 100, 1000, nil, false},
		{"budget", "a", 0, 100, 25, []int64{1, 2}, true},
		{"budget exact fit", "a", 0, 100, 30, []int64{1, 2, 3}, true},
		{"budget fits all exactly", "a", 0, 100, 50, []int64{1, 2, 3, 4, 5}, false},
		{"budget below one envelope", "a", 0, 100, 5, []int64{1}, true},
		{"budget and limit", "a", 1, 2, 1000, []int64{2, 3}, true},
		{"limit tighter than budget", "a", 0, 1, 25, []int64{1}, true},
		{"first alone over budget", "mixed", 0, 100, 50, []int64{1}, true},
		{"prefix, never a skip", "mixed", 1, 100, 50, []int64{2, 3}, true},
		{"exact fit mid-queue", "mixed", 1, 100, 52, []int64{2, 3, 4}, true},
		{"rest", "mixed", 3, 100, 51, []int64{4, 5}, false},
		{"unknown device", "ghost", 0, 100, 1000, nil, false},
		{"device with nothing", "big", 0, 100, 1000, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := s.Fetch(ctx(t), store.FetchParams{Household: hh, Device: tt.device, After: tt.after, Limit: tt.limit, Budget: tt.budget})
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			if got := seqs(b.Envelopes); !slices.Equal(got, tt.want) {
				t.Errorf("seqs = %v, want %v", got, tt.want)
			}
			if b.More != tt.more {
				t.Errorf("More = %v, want %v", b.More, tt.more)
			}
		})
	}

	t.Run("RoundTrip", func(t *testing.T) {
		payload := []byte{0, 1, 2, 0xff, 0xfe, 0, '\n', '"', 0}
		id := `c1f9 ~!'"\%_*?` // printable ASCII, quotes and wildcards included
		sentAt := t0.Add(1234567 * time.Microsecond).In(time.FixedZone("CET", 3600))
		sendOK(t, s, store.SendParams{Sender: "sender-1", ID: id, To: []string{"b", "big"}, Payload: payload, Now: sentAt})
		large := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB, the largest envelope
		sendOK(t, s, store.SendParams{Sender: "a", ID: "large", To: []string{"big"}, Payload: large, Now: t0})

		es := fetchAll(t, s, hh, "big", 0)
		if len(es) != 2 {
			t.Fatalf("got %d envelopes, want 2", len(es))
		}
		e := es[0]
		if e.Seq != 1 || e.ID != id || e.From != "sender-1" || !bytes.Equal(e.Payload, payload) {
			t.Errorf("envelope = %+v, want seq 1 id %q from sender-1 payload %x", e, id, payload)
		}
		if !e.SentAt.Equal(sentAt) {
			t.Errorf("SentAt = %v, want %v to the microsecond", e.SentAt, sentAt)
		}
		if !bytes.Equal(es[1].Payload, large) {
			t.Errorf("64 KiB payload came back with %d bytes, not equal", len(es[1].Payload))
		}
		if other := fetchAll(t, s, hh, "b", 0); len(other) != 1 || !bytes.Equal(other[0].Payload, payload) {
			t.Errorf("b got %d envelopes, want its own copy", len(other))
		}
	})
}
