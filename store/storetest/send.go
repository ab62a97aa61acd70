package storetest

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

func testSend(t *testing.T, open Opener) {
	t.Run("SeqsPerDevice", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a", "b", "c")
		steps := []struct {
			to   []string
			want string
		}{
			{[]string{"a"}, "a:1"},
			{[]string{"a", "b"}, "a:2 b:1"},
			{[]string{"a", "b", "c"}, "a:3 b:2 c:1"},
			{[]string{"c"}, "c:2"},
			{[]string{"b", "c"}, "b:3 c:3"},
		}
		for i, st := range steps {
			res := sendOK(t, s, store.SendParams{Sender: "a", ID: string(rune('0' + i)), To: st.to, Payload: []byte("x")})
			if got := deliveries(res.Deliveries); got != st.want {
				t.Errorf("send %d to %v: deliveries %s, want %s", i, st.to, got, st.want)
			}
			if res.Repeat {
				t.Errorf("send %d: Repeat on a first send", i)
			}
			if res.ID != string(rune('0'+i)) {
				t.Errorf("send %d: ID %q", i, res.ID)
			}
		}
		if got := position(t, s, hh, "a"); got != (store.Position{Cursor: 0, Head: 3}) {
			t.Errorf("a position = %+v, want head 3", got)
		}
	})

	t.Run("SelfSend", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a")
		res := sendOK(t, s, store.SendParams{Sender: "a", ID: "1", To: []string{"a"}, Payload: []byte("note to self")})
		if got := deliveries(res.Deliveries); got != "a:1" {
			t.Errorf("deliveries %s, want a:1", got)
		}
	})

	t.Run("UnregisteredSender", func(t *testing.T) {
		// Only recipients must exist; a sender's token is enough.
		s := fresh(t, open)
		register(t, s, hh, "a")
		sendOK(t, s, store.SendParams{Sender: "ghost", ID: "1", To: []string{"a"}, Payload: []byte("x")})
		if got := names(listAll(t, s, hh)); !slices.Equal(got, []string{"a"}) {
			t.Errorf("Devices = %v, want [a]: a send does not register its sender", got)
		}
	})

	t.Run("Push", func(t *testing.T) {
		s := fresh(t, open)
		if _, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "a", Push: &pushA, Now: t0}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "c", Push: &pushB, Now: t0}); err != nil {
			t.Fatal(err)
		}
		register(t, s, hh, "b")
		p := store.SendParams{Sender: "b", ID: "1", To: []string{"a", "b", "c"}, Payload: []byte("x")}
		res := sendOK(t, s, p)
		want := []device.PushTarget{pushA, {}, pushB}
		for i, d := range res.Deliveries {
			if d.Push.Empty() != want[i].Empty() || (!want[i].Empty() && d.Push != want[i]) {
				t.Errorf("delivery %s Push = %+v, want %+v", d.Device, d.Push, want[i])
			}
			if !d.Pending {
				t.Errorf("delivery %s of a first send is not Pending", d.Device)
			}
		}
	})

	t.Run("Dedupe", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a", "b", "c")
		p := store.SendParams{Sender: "a", ID: "c1f9", To: []string{"b", "c"}, Payload: []byte("hello")}
		first := sendOK(t, s, p)
		sendOK(t, s, store.SendParams{Sender: "a", ID: "other", To: []string{"b"}, Payload: []byte("x")})

		p.Now = t0.Add(time.Hour) // a retry an hour later is still the same send
		again := sendOK(t, s, p)
		if !again.Repeat {
			t.Errorf("second send not a Repeat")
		}
		if got, want := deliveries(again.Deliveries), deliveries(first.Deliveries); got != want {
			t.Errorf("repeat deliveries %s, want the first answer %s", got, want)
		}
		if again.ID != p.ID {
			t.Errorf("repeat ID %q, want %q", again.ID, p.ID)
		}
		if got := seqs(fetchAll(t, s, hh, "b", 0)); !slices.Equal(got, []int64{1, 2}) {
			t.Errorf("b seqs = %v, want [1 2]: the repeat stored something", got)
		}
		if got := position(t, s, hh, "c").Head; got != 1 {
			t.Errorf("c head = %d, want 1", got)
		}
		next := sendOK(t, s, store.SendParams{Sender: "a", ID: "next", To: []string{"b", "c"}, Payload: []byte("x")})
		if got := deliveries(next.Deliveries); got != "b:3 c:2" {
			t.Errorf("next send %s, want b:3 c:2", got)
		}
	})

	t.Run("Conflict", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a", "b", "c")
		sendOK(t, s, store.SendParams{Sender: "a", ID: "x1", To: []string{"b"}, Payload: []byte("hello")})
		tests := []struct {
			name string
			p    store.SendParams
		}{
			{"more recipients", store.SendParams{Sender: "a", ID: "x1", To: []string{"b", "c"}, Payload: []byte("hello")}},
			{"other recipients", store.SendParams{Sender: "a", ID: "x1", To: []string{"c"}, Payload: []byte("hello")}},
			{"other payload", store.SendParams{Sender: "a", ID: "x1", To: []string{"b"}, Payload: []byte("hellO")}},
			{"longer payload", store.SendParams{Sender: "a", ID: "x1", To: []string{"b"}, Payload: []byte("hello!")}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if err := sendErr(s, tt.p); !errors.Is(err, store.ErrConflict) {
					t.Errorf("got %v, want ErrConflict", err)
				}
			})
		}
		if got := seqs(fetchAll(t, s, hh, "b", 0)); !slices.Equal(got, []int64{1}) {
			t.Errorf("b seqs = %v, want [1]", got)
		}
		if got := position(t, s, hh, "c").Head; got != 0 {
			t.Errorf("c head = %d, want 0: a conflict stored something", got)
		}
	})

	t.Run("SendersOwnTheirIDs", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a", "b", "c")
		r1 := sendOK(t, s, store.SendParams{Sender: "a", ID: "same", To: []string{"c"}, Payload: []byte("from a")})
		r2 := sendOK(t, s, store.SendParams{Sender: "b", ID: "same", To: []string{"c"}, Payload: []byte("from b")})
		if r1.Repeat || r2.Repeat {
			t.Fatalf("Repeat = %v, %v: another sender's id is not a repeat", r1.Repeat, r2.Repeat)
		}
		es := fetchAll(t, s, hh, "c", 0)
		if len(es) != 2 || es[0].From != "a" || es[1].From != "b" || string(es[1].Payload) != "from b" {
			t.Errorf("c got %+v, want one envelope from a and one from b", es)
		}
	})

	t.Run("UnknownRecipientIsAtomic", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a", "m", "z")
		sendOK(t, s, store.SendParams{Sender: "a", ID: "before", To: []string{"a", "z"}, Payload: []byte("x")})

		err := sendErr(s, store.SendParams{Sender: "a", ID: "bad", To: []string{"a", "ghost1", "ghost2", "m", "z"}, Payload: []byte("x")})
		if e := isUnknown(err, "ghost1"); e != nil {
			t.Fatal(e)
		}
		for _, d := range []string{"a", "m", "z"} {
			want := int64(1)
			if d == "m" {
				want = 0
			}
			if got := position(t, s, hh, d).Head; got != want {
				t.Errorf("%s head = %d, want %d: a failed send stored something", d, got, want)
			}
		}
		// Nothing was recorded for the id either, and no seq was given away.
		res := sendOK(t, s, store.SendParams{Sender: "a", ID: "bad", To: []string{"a", "m", "z"}, Payload: []byte("x")})
		if res.Repeat {
			t.Error("retry of a failed send reported as Repeat")
		}
		if got := deliveries(res.Deliveries); got != "a:2 m:1 z:2" {
			t.Errorf("retry deliveries %s, want a:2 m:1 z:2 (no gap)", got)
		}
		if got := names(listAll(t, s, hh)); !slices.Equal(got, []string{"a", "m", "z"}) {
			t.Errorf("Devices = %v: a send registered a recipient", got)
		}
	})

	t.Run("QueueFull", func(t *testing.T) {
		tests := []struct {
			name    string
			limits  store.SendParams
			payload int
			fits    int // sends to "full" that succeed before the limit
		}{
			{"envelopes", store.SendParams{MaxPendingEnvelopes: 3}, 10, 3},
			{"bytes exact", store.SendParams{MaxPendingBytes: 30}, 10, 3},
			{"bytes partial", store.SendParams{MaxPendingBytes: 35}, 10, 3},
			{"both, envelopes first", store.SendParams{MaxPendingEnvelopes: 2, MaxPendingBytes: 1000}, 10, 2},
			{"both, bytes first", store.SendParams{MaxPendingEnvelopes: 100, MaxPendingBytes: 20}, 10, 2},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				s := fresh(t, open)
				register(t, s, hh, "a", "full", "full2")
				p := func(id string, to ...string) store.SendParams {
					q := tt.limits
					q.Sender, q.ID, q.To, q.Payload = "a", id, to, make([]byte, tt.payload)
					return q
				}
				for i := range tt.fits {
					sendOK(t, s, p(string(rune('0'+i)), "full", "full2"))
				}
				err := sendErr(s, p("over", "a", "full", "full2"))
				if e := isQueueFull(err, "full"); e != nil {
					t.Fatal(e)
				}
				if got := position(t, s, hh, "a").Head; got != 0 {
					t.Fatalf("a head = %d, want 0: a refused send stored something", got)
				}
				// The refused send recorded nothing and gave no seq away.
				res := sendOK(t, s, p("over", "a"))
				if got := deliveries(res.Deliveries); got != "a:1" || res.Repeat {
					t.Fatalf("send to a = %s (repeat %v), want a:1", got, res.Repeat)
				}
				// An ack frees room again.
				ack(t, s, hh, "full", 1)
				err = sendErr(s, p("again", "full", "full2"))
				if e := isQueueFull(err, "full2"); e != nil {
					t.Fatal(e)
				}
				ack(t, s, hh, "full2", 1)
				res = sendOK(t, s, p("again", "full", "full2"))
				want := "full:" + strconv.Itoa(tt.fits+1) + " full2:" + strconv.Itoa(tt.fits+1)
				if got := deliveries(res.Deliveries); got != want {
					t.Errorf("after acks: %s, want %s", got, want)
				}
			})
		}
	})

	t.Run("NoLimitsByDefault", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a")
		for i := range 20 {
			sendOK(t, s, store.SendParams{Sender: "a", ID: strconv.Itoa(i), To: []string{"a"}, Payload: make([]byte, 1000)})
		}
	})

	t.Run("HouseholdsIsolated", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, "h1", "phone", "laptop")
		register(t, s, "h2", "phone")
		sendOK(t, s, store.SendParams{Household: "h1", Sender: "laptop", ID: "1", To: []string{"phone"}, Payload: []byte("for h1")})
		sendOK(t, s, store.SendParams{Household: "h1", Sender: "laptop", ID: "2", To: []string{"phone"}, Payload: []byte("for h1")})
		// The same sender name and id in another household is another send.
		res := sendOK(t, s, store.SendParams{Household: "h2", Sender: "laptop", ID: "1", To: []string{"phone"}, Payload: []byte("for h2")})
		if res.Repeat || deliveries(res.Deliveries) != "phone:1" {
			t.Errorf("h2 send = %s (repeat %v), want phone:1", deliveries(res.Deliveries), res.Repeat)
		}
		h2 := fetchAll(t, s, "h2", "phone", 0)
		if len(h2) != 1 || string(h2[0].Payload) != "for h2" {
			t.Errorf("h2/phone got %d envelopes, want only its own", len(h2))
		}
		if got := seqs(fetchAll(t, s, "h1", "phone", 0)); !slices.Equal(got, []int64{1, 2}) {
			t.Errorf("h1/phone seqs = %v, want [1 2]", got)
		}
		err := sendErr(s, store.SendParams{Household: "h2", Sender: "phone", ID: "x", To: []string{"laptop"}, Payload: []byte("x")})
		if e := isUnknown(err, "laptop"); e != nil {
			t.Errorf("send to another household's device: %v", e)
		}
		ack(t, s, "h1", "phone", 2)
		if got := position(t, s, "h2", "phone"); got != (store.Position{Cursor: 0, Head: 1}) {
			t.Errorf("h2/phone = %+v after h1's ack, want cursor 0 head 1", got)
		}
	})
}
