package storetest

import (
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/flamenet/relay/store"
)

// otherEpoch is an epoch no store holds: acks taken in it are stale.
const otherEpoch = "AAAAAAAAAAAAAAAA"

func history(t testing.TB, s store.Store) store.History {
	t.Helper()
	h, err := s.History(ctx(t))
	if err != nil {
		t.Fatalf("History: %v", err)
	}
	return h
}

func testEpoch(t *testing.T, open Opener) {
	t.Run("EveryReadNamesIt", func(t *testing.T) {
		s := fresh(t, open)
		h := history(t, s)
		if len(h.Epoch) != 16 || !store.ValidEpoch(h.Epoch) || h.Instance == "" {
			t.Fatalf("History = %+v, want an epoch of 16 base64url characters and an instance", h)
		}
		if again := history(t, s); again != h {
			t.Errorf("History = %+v, then %+v: nothing changed the store's history", h, again)
		}
		d, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "a", Now: t0})
		if err != nil {
			t.Fatal(err)
		}
		sendOK(t, s, store.SendParams{Sender: "a", ID: "1", To: []string{"a"}, Payload: []byte("x")})
		st, err := s.State(ctx(t), hh, "a")
		if err != nil {
			t.Fatal(err)
		}
		none, err := s.State(ctx(t), hh, "nobody")
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.Fetch(ctx(t), store.FetchParams{Household: hh, Device: "a", Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		empty, err := s.Fetch(ctx(t), store.FetchParams{Household: hh, Device: "a", After: 1, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.Ack(ctx(t), store.AckParams{Household: hh, Device: "a", Cursor: -1, Now: t0})
		if err != nil {
			t.Fatal(err)
		}
		for what, got := range map[string]string{"Register": d.Epoch, "State": st.Epoch, "State of no device": none.Epoch,
			"Fetch": b.Epoch, "Fetch of nothing": empty.Epoch, "Ack": p.Epoch} {
			if got != h.Epoch {
				t.Errorf("%s names epoch %q, want History's %q", what, got, h.Epoch)
			}
		}
	})

	t.Run("AckOfAnotherEpoch", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a")
		for i := range 3 {
			sendOK(t, s, store.SendParams{Sender: "a", ID: strconv.Itoa(i), To: []string{"a"}, Payload: []byte("x")})
		}
		cur := history(t, s).Epoch
		_, err := s.Ack(ctx(t), store.AckParams{Household: hh, Device: "a", Cursor: 2, Now: t0, Epoch: otherEpoch})
		var se *store.StaleEpochError
		if !errors.Is(err, store.ErrStaleEpoch) || !errors.As(err, &se) || se.Epoch != cur {
			t.Fatalf("Ack of another epoch = %v, want a *StaleEpochError naming %q", err, cur)
		}
		if got := seqs(fetchAll(t, s, hh, "a", 0)); !slices.Equal(got, []int64{1, 2, 3}) {
			t.Errorf("stored seqs %v after an ack of another epoch, want [1 2 3]: nothing acknowledged", got)
		}
		if got := position(t, s, hh, "a"); got.Cursor != 0 {
			t.Errorf("cursor %d after an ack of another epoch, want 0", got.Cursor)
		}
		// A device's first contact in another epoch registers it all the
		// same (it did call), and acknowledges nothing.
		if _, err := s.Ack(ctx(t), store.AckParams{Household: hh, Device: "new", Cursor: 0, Now: t0, Epoch: otherEpoch}); !errors.Is(err, store.ErrStaleEpoch) {
			t.Errorf("first Ack of another epoch = %v, want ErrStaleEpoch", err)
		}
		if !state(t, s, hh, "new").Exists {
			t.Errorf("a device's first ack, of another epoch, did not register it")
		}
		p, err := s.Ack(ctx(t), store.AckParams{Household: hh, Device: "a", Cursor: 2, Now: t0, Epoch: cur})
		if err != nil || p.Cursor != 2 || p.Acked != 2 {
			t.Fatalf("Ack of the current epoch = %+v, %v, want cursor 2, 2 acked", p, err)
		}
	})

	t.Run("AckManyOfAnotherEpoch", func(t *testing.T) {
		// The guard is the epoch check in AckMany's transaction: without
		// it, b's cursor moves to 3 and its envelopes go.
		s := fresh(t, open)
		register(t, s, hh, "a", "b", "c")
		for i := range 3 {
			sendOK(t, s, store.SendParams{Sender: "a", ID: strconv.Itoa(i), To: []string{"a", "b", "c"}, Payload: []byte("x")})
		}
		cur := history(t, s).Epoch
		res, err := s.AckMany(ctx(t), []store.Ack{
			{Household: hh, Device: "a", Cursor: 2, Epoch: cur},
			{Household: hh, Device: "b", Cursor: 3, Epoch: otherEpoch},
			{Household: hh, Device: "c", Cursor: 1}, // no epoch: not checked
		})
		if err != nil {
			t.Fatal(err)
		}
		if res != (store.AckManyResult{Deleted: 3, Stale: 1}) {
			t.Errorf("AckMany = %+v, want 3 deleted (a's 2, c's 1) and 1 stale (b's)", res)
		}
		for dev, want := range map[string]int64{"a": 2, "b": 0, "c": 1} {
			if got := state(t, s, hh, dev); got.Cursor != want {
				t.Errorf("%s: cursor %d, want %d", dev, got.Cursor, want)
			}
		}
		if got := seqs(fetchAll(t, s, hh, "b", 0)); !slices.Equal(got, []int64{1, 2, 3}) {
			t.Errorf("b stores %v, want [1 2 3]: an ack of another epoch deletes nothing", got)
		}
		checkPending(t, s, hh, "b")
		res, err = s.AckMany(ctx(t), []store.Ack{{Household: hh, Device: "b", Cursor: 3, Epoch: otherEpoch}})
		if err != nil || res != (store.AckManyResult{Stale: 1}) {
			t.Errorf("AckMany of only stale acks = %+v, %v, want 1 stale", res, err)
		}
	})
}
