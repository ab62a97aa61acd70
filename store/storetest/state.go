package storetest

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

func state(t testing.TB, s store.Store, household, device string) store.DeviceState {
	t.Helper()
	st, err := s.State(ctx(t), household, device)
	if err != nil {
		t.Fatalf("State(%s/%s): %v", household, device, err)
	}
	if len(st.Epoch) != 16 || !store.ValidEpoch(st.Epoch) {
		t.Fatalf("State(%s/%s) = %+v: no epoch of 16 characters", household, device, st)
	}
	st.Epoch = "" // the tests compare states whole; testEpoch checks it
	return st
}

func ackMany(t testing.TB, s store.Store, acks ...store.Ack) int64 {
	t.Helper()
	res, err := s.AckMany(ctx(t), acks)
	if err != nil {
		t.Fatalf("AckMany(%+v): %v", acks, err)
	}
	if res.Stale != 0 {
		t.Fatalf("AckMany(%+v) = %+v: no ack names an epoch, none is stale", acks, res)
	}
	return res.Deleted
}

// checkPending proves, through the store's own limits, that a device's
// pending counters equal what it stores: with n envelopes of b bytes
// stored, a one-byte send is refused at a limit of n envelopes (or b
// bytes) and accepted at n+1 (and b+1). The accepted probe stores one
// envelope more, so call it last.
func checkPending(t testing.TB, s store.Store, household, device string) {
	t.Helper()
	es := fetchAll(t, s, household, device, 0)
	n, b := int64(len(es)), int64(0)
	for _, e := range es {
		b += int64(len(e.Payload))
	}
	probe := func(id string, maxN, maxB int64) error {
		id += strconv.FormatInt(probes.Add(1), 10)
		return sendErr(s, store.SendParams{Household: household, Sender: "probe", ID: id, To: []string{device},
			Payload: []byte("p"), MaxPendingEnvelopes: maxN, MaxPendingBytes: maxB})
	}
	// A limit of zero means none, so the refusals are only provable above
	// zero; an empty queue's counters are proven by the last probe alone.
	if n > 0 {
		if err := probe("probe-n-", n, 0); !errors.Is(err, store.ErrQueueFull) {
			t.Errorf("%s/%s stores %d envelopes, but its counter is below that (probe: %v)", household, device, n, err)
		}
	}
	if b > 0 {
		if err := probe("probe-b-", 0, b); !errors.Is(err, store.ErrQueueFull) {
			t.Errorf("%s/%s stores %d bytes, but its counter is below that (probe: %v)", household, device, b, err)
		}
	}
	if err := probe("probe-ok-", n+1, b+1); err != nil {
		t.Errorf("%s/%s stores %d envelopes of %d bytes, but its counters are above that (probe: %v)", household, device, n, b, err)
	}
}

// probes numbers checkPending's sends, so that no probe is a repeat.
var probes atomic.Int64

func testState(t *testing.T, open Opener) {
	s := fresh(t, open)
	register(t, s, hh, "a", "b")
	register(t, s, "other", "a")

	if got := state(t, s, hh, "ghost"); got != (store.DeviceState{}) {
		t.Errorf("State(ghost) = %+v, want zero", got)
	}
	if got := state(t, s, hh, "a"); got != (store.DeviceState{Exists: true}) {
		t.Errorf("State(a) = %+v, want an existing device at 0, 0", got)
	}
	for i := range 3 {
		sendOK(t, s, store.SendParams{Sender: "b", ID: strconv.Itoa(i), To: []string{"a"}, Payload: []byte("x")})
	}
	ack(t, s, hh, "a", 1)
	if got := state(t, s, hh, "a"); got != (store.DeviceState{Exists: true, Cursor: 1, Head: 3}) {
		t.Errorf("State(a) = %+v, want cursor 1 head 3", got)
	}
	if got := state(t, s, "other", "a"); got != (store.DeviceState{Exists: true}) {
		t.Errorf("State(other/a) = %+v: another household's device moved", got)
	}
	// A read: last_seen stays where the register put it.
	later := t0.Add(time.Hour)
	if _, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "b", Now: later}); err != nil {
		t.Fatal(err)
	}
	state(t, s, hh, "b")
	if d := listAll(t, s, hh)[1]; !d.LastSeen.Equal(later) {
		t.Errorf("b LastSeen = %v after State, want %v", d.LastSeen, later)
	}

	at := t0.Add(time.Minute)
	if err := s.DeleteDevice(ctx(t), hh, "a", at); err != nil {
		t.Fatal(err)
	}
	if got := state(t, s, hh, "a"); got.Exists || got.Cursor != 0 || got.Head != 0 || got.Life != device.LifeAfter(at) {
		t.Errorf("State(removed a) = %+v, want not existing, removed at %v", got, at)
	}
	register(t, s, hh, "a")
	if got := state(t, s, hh, "a"); !got.Exists || got.Cursor != 0 || got.Head != 0 || got.Life != device.LifeAfter(at) {
		t.Errorf("State(re-registered a) = %+v, want existing at 0, 0, removed at %v", got, at)
	}
}

func testFetchRemovedAt(t *testing.T, open Opener) {
	s := fresh(t, open)
	register(t, s, hh, "a", "b")
	sendOK(t, s, store.SendParams{Sender: "b", ID: "1", To: []string{"a"}, Payload: []byte("x")})
	fetch := func(after int64) store.Batch {
		t.Helper()
		b, err := s.Fetch(ctx(t), store.FetchParams{Household: hh, Device: "a", After: after, Limit: 10, Budget: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if b := fetch(0); len(b.Envelopes) != 1 || !b.Life.IsZero() {
		t.Errorf("Fetch of a never removed device = %d envelopes, Life %v, want 1 and zero", len(b.Envelopes), b.Life)
	}

	at := t0.Add(time.Minute)
	if err := s.DeleteDevice(ctx(t), hh, "a", at); err != nil {
		t.Fatal(err)
	}
	if b := fetch(0); len(b.Envelopes) != 0 || b.Life != device.LifeAfter(at) {
		t.Errorf("Fetch of a removed device = %d envelopes, Life %v, want none and %v", len(b.Envelopes), b.Life, at)
	}
	register(t, s, hh, "a")
	sendOK(t, s, store.SendParams{Sender: "b", ID: "2", To: []string{"a"}, Payload: []byte("new")})
	b := fetch(0)
	if len(b.Envelopes) != 1 || b.Envelopes[0].ID != "2" || b.Life != device.LifeAfter(at) {
		t.Errorf("Fetch after re-register = %+v, want the new envelope with Life %v", b, at)
	}
	if b := fetch(1); len(b.Envelopes) != 0 || b.Life != device.LifeAfter(at) {
		t.Errorf("empty Fetch after re-register: Life %v, want %v", b.Life, at)
	}
}

func testAckMany(t *testing.T, open Opener) {
	// The guard is the clamp to the head: without it (the cursor moved to
	// whatever the batch said), this went red in both backends at "past
	// the head stops at it" (checked once by hand).
	t.Run("UpOnlyClampedToHead", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a", "b")
		for i := range 5 {
			sendOK(t, s, store.SendParams{Sender: "b", ID: strconv.Itoa(i), To: []string{"a"}, Payload: make([]byte, 10)})
		}
		steps := []struct {
			name    string
			cursor  int64
			deleted int64
			want    store.DeviceState
			left    []int64
		}{
			{"up", 2, 2, store.DeviceState{Exists: true, Cursor: 2, Head: 5}, []int64{3, 4, 5}},
			{"below never moves down", 1, 0, store.DeviceState{Exists: true, Cursor: 2, Head: 5}, []int64{3, 4, 5}},
			{"negative acknowledges nothing", -1, 0, store.DeviceState{Exists: true, Cursor: 2, Head: 5}, []int64{3, 4, 5}},
			// The clamp: a cursor past the head stops at the head, so the
			// next envelope is still owed.
			{"past the head stops at it", 99, 3, store.DeviceState{Exists: true, Cursor: 5, Head: 5}, nil},
		}
		for _, st := range steps {
			if n := ackMany(t, s, store.Ack{Household: hh, Device: "a", Cursor: st.cursor}); n != st.deleted {
				t.Errorf("%s: AckMany deleted %d, want %d", st.name, n, st.deleted)
			}
			if got := state(t, s, hh, "a"); got != st.want {
				t.Errorf("%s: State = %+v, want %+v", st.name, got, st.want)
			}
			if left := seqs(fetchAll(t, s, hh, "a", 0)); !slices.Equal(left, st.left) {
				t.Errorf("%s: stored seqs %v, want %v", st.name, left, st.left)
			}
		}
		res := sendOK(t, s, store.SendParams{Sender: "b", ID: "next", To: []string{"a"}, Payload: make([]byte, 10)})
		if got := deliveries(res.Deliveries); got != "a:6" {
			t.Errorf("send after the clamp = %s, want a:6", got)
		}
		if got := seqs(fetchAll(t, s, hh, "a", 5)); !slices.Equal(got, []int64{6}) {
			t.Errorf("after the clamp, fetch above 5 = %v, want [6]", got)
		}
		if got := state(t, s, hh, "a"); got != (store.DeviceState{Exists: true, Cursor: 5, Head: 6}) {
			t.Errorf("State = %+v, want cursor 5 head 6", got)
		}
		checkPending(t, s, hh, "a")
	})

	// The guard is the skip: with the batch's missing devices inserted
	// first, as Ack registers a device on first contact, this went red in
	// both backends (checked once by hand).
	t.Run("SkipsUnknownDevices", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a", "gone")
		for i := range 2 {
			sendOK(t, s, store.SendParams{Sender: "x", ID: strconv.Itoa(i), To: []string{"a", "gone"}, Payload: []byte("x")})
		}
		if err := s.DeleteDevice(ctx(t), hh, "gone", t0); err != nil {
			t.Fatal(err)
		}
		n := ackMany(t, s,
			store.Ack{Household: hh, Device: "ghost", Cursor: 1, Seen: t0.Add(time.Hour)},
			store.Ack{Household: hh, Device: "gone", Cursor: 2, Seen: t0.Add(time.Hour)},
			store.Ack{Household: "nowhere", Device: "a", Cursor: 1},
			store.Ack{Household: hh, Device: "a", Cursor: 1},
		)
		if n != 1 {
			t.Errorf("AckMany deleted %d, want 1 (a's seq 1)", n)
		}
		if got := names(listAll(t, s, hh)); !slices.Equal(got, []string{"a"}) {
			t.Errorf("Devices = %v, want [a]: AckMany must not create devices", got)
		}
		if got := listAll(t, s, "nowhere"); len(got) != 0 {
			t.Errorf("Devices(nowhere) = %v, want none", names(got))
		}
		for _, d := range []string{"ghost", "gone"} {
			if got := state(t, s, hh, d); got.Exists {
				t.Errorf("State(%s) = %+v after AckMany, want it still absent", d, got)
			}
		}
		if got := state(t, s, hh, "a"); got.Cursor != 1 {
			t.Errorf("a cursor = %d, want 1: the known device in the batch still moves", got.Cursor)
		}
	})

	// The guard is the removal check: without it (an ack of the old life
	// applied to the new one), this went red in both backends at "the old
	// life's ack" (checked once by hand).
	t.Run("EarlierLifeSkipped", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a")
		for i := range 3 {
			sendOK(t, s, store.SendParams{Sender: "x", ID: "old" + strconv.Itoa(i), To: []string{"a"}, Payload: []byte("x")})
		}
		removed := t0.Add(time.Minute)
		if err := s.DeleteDevice(ctx(t), hh, "a", removed); err != nil {
			t.Fatal(err)
		}
		register(t, s, hh, "a")
		for i := range 3 {
			sendOK(t, s, store.SendParams{Sender: "x", ID: "new" + strconv.Itoa(i), To: []string{"a"}, Payload: []byte("x")})
		}
		// Taken before the removal, by a caller that had not heard of it.
		if n := ackMany(t, s, store.Ack{Household: hh, Device: "a", Cursor: 3}); n != 0 {
			t.Errorf("the old life's ack deleted %d envelopes of the new one", n)
		}
		if got := seqs(fetchAll(t, s, hh, "a", 0)); !slices.Equal(got, []int64{1, 2, 3}) {
			t.Errorf("after the old life's ack: stored %v, want [1 2 3]", got)
		}
		// Taken knowing of the removal: it applies.
		if n := ackMany(t, s, store.Ack{Household: hh, Device: "a", Cursor: 2, Life: device.LifeAfter(removed)}); n != 2 {
			t.Errorf("the new life's ack deleted %d, want 2", n)
		}
		checkPending(t, s, hh, "a")
	})

	t.Run("SameDeviceTwice", func(t *testing.T) {
		for _, order := range []string{"higher first", "higher last"} {
			t.Run(order, func(t *testing.T) {
				s := fresh(t, open)
				register(t, s, hh, "a")
				for i := range 5 {
					sendOK(t, s, store.SendParams{Sender: "x", ID: strconv.Itoa(i), To: []string{"a"}, Payload: []byte("x")})
				}
				high := store.Ack{Household: hh, Device: "a", Cursor: 4, Seen: t0.Add(time.Minute)}
				late := store.Ack{Household: hh, Device: "a", Cursor: 2, Seen: t0.Add(time.Hour)}
				acks := []store.Ack{high, late}
				if order == "higher last" {
					acks = []store.Ack{late, high}
				}
				if n := ackMany(t, s, acks...); n != 4 {
					t.Errorf("AckMany deleted %d, want 4", n)
				}
				if got := state(t, s, hh, "a"); got.Cursor != 4 {
					t.Errorf("cursor = %d, want 4: the highest wins", got.Cursor)
				}
				if d := listAll(t, s, hh)[0]; !d.LastSeen.Equal(t0.Add(time.Hour)) {
					t.Errorf("LastSeen = %v, want %v: the latest wins", d.LastSeen, t0.Add(time.Hour))
				}
				checkPending(t, s, hh, "a")
			})
		}
	})

	t.Run("LastSeen", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, hh, "a")
		sendOK(t, s, store.SendParams{Sender: "x", ID: "1", To: []string{"a"}, Payload: []byte("x")})
		steps := []struct {
			name string
			ack  store.Ack
			want time.Time
		}{
			{"only last_seen", store.Ack{Cursor: -1, Seen: t0.Add(time.Hour)}, t0.Add(time.Hour)},
			{"never down", store.Ack{Cursor: -1, Seen: t0.Add(time.Minute)}, t0.Add(time.Hour)},
			{"zero leaves it", store.Ack{Cursor: 1}, t0.Add(time.Hour)},
			{"with a cursor", store.Ack{Cursor: 1, Seen: t0.Add(2 * time.Hour)}, t0.Add(2 * time.Hour)},
		}
		for _, st := range steps {
			st.ack.Household, st.ack.Device = hh, "a"
			ackMany(t, s, st.ack)
			if d := listAll(t, s, hh)[0]; !d.LastSeen.Equal(st.want) {
				t.Errorf("%s: LastSeen = %v, want %v", st.name, d.LastSeen, st.want)
			}
		}
		if got := state(t, s, hh, "a"); got.Cursor != 1 {
			t.Errorf("cursor = %d, want 1", got.Cursor)
		}
	})

	t.Run("ManyDevicesAndHouseholds", func(t *testing.T) {
		s := fresh(t, open)
		register(t, s, "h1", "a", "b")
		register(t, s, "h2", "a")
		for i := range 4 {
			sendOK(t, s, store.SendParams{Household: "h1", Sender: "x", ID: strconv.Itoa(i), To: []string{"a", "b"}, Payload: make([]byte, 1+i)})
			sendOK(t, s, store.SendParams{Household: "h2", Sender: "x", ID: strconv.Itoa(i), To: []string{"a"}, Payload: make([]byte, 1+i)})
		}
		if n := ackMany(t, s,
			store.Ack{Household: "h2", Device: "a", Cursor: 3},
			store.Ack{Household: "h1", Device: "b", Cursor: math.MaxInt64},
			store.Ack{Household: "h1", Device: "a", Cursor: 1},
		); n != 8 {
			t.Errorf("AckMany deleted %d, want 3 + 4 + 1", n)
		}
		for _, c := range []struct {
			household, device string
			cursor            int64
		}{{"h1", "a", 1}, {"h1", "b", 4}, {"h2", "a", 3}} {
			if got := state(t, s, c.household, c.device); got.Cursor != c.cursor || got.Head != 4 {
				t.Errorf("%s/%s = %+v, want cursor %d head 4", c.household, c.device, got, c.cursor)
			}
			checkPending(t, s, c.household, c.device)
		}
		if n, err := s.AckMany(ctx(t), nil); n != (store.AckManyResult{}) || err != nil {
			t.Errorf("AckMany(nothing) = %d, %v, want 0, nil", n, err)
		}
	})
}

// testHouseholdFull: the household's pending bytes bound. With the check
// taken out, this went red in both backends (checked once by hand).
func testHouseholdFull(t *testing.T, open Opener) {
	s := fresh(t, open)
	register(t, s, hh, "a", "b", "c")
	register(t, s, "other", "a")
	const limit = 100
	p := func(id string, size int, to ...string) store.SendParams {
		return store.SendParams{Sender: "x", ID: id, To: to, Payload: make([]byte, size), MaxHouseholdPendingBytes: limit}
	}
	// Another household's bytes do not count against this one.
	sendOK(t, s, store.SendParams{Household: "other", Sender: "x", ID: "big", To: []string{"a"}, Payload: make([]byte, 1000)})
	for i := range 4 {
		sendOK(t, s, p(strconv.Itoa(i), 10, "a", "b")) // 80 bytes
	}
	sendOK(t, s, p("c1", 10, "c")) // 90

	// 90 + 10 x 2 recipients is over 100.
	err := sendErr(s, p("over", 10, "a", "b"))
	var he *store.HouseholdFullError
	if !errors.Is(err, store.ErrHouseholdFull) || !errors.As(err, &he) || he.Household != hh {
		t.Fatalf("send over the household's bound = %v, want a *HouseholdFullError naming %q", err, hh)
	}
	if errors.Is(err, store.ErrQueueFull) {
		t.Errorf("HouseholdFullError is also ErrQueueFull: %v", err)
	}
	for d, want := range map[string]int64{"a": 4, "b": 4, "c": 1} {
		if got := state(t, s, hh, d).Head; got != want {
			t.Errorf("%s head = %d, want %d: a refused send stored something", d, got, want)
		}
	}
	// Inclusive: exactly at the bound is allowed.
	sendOK(t, s, p("c2", 10, "c")) // 100
	if e := sendErr(s, p("one-more", 1, "c")); !errors.Is(e, store.ErrHouseholdFull) {
		t.Fatalf("one byte past the bound = %v, want ErrHouseholdFull", e)
	}
	// Per-recipient limits are checked first.
	q := p("both", 10, "a")
	q.MaxPendingEnvelopes = 4
	if e := isQueueFull(sendErr(s, q), "a"); e != nil {
		t.Errorf("over both bounds: %v", e)
	}
	// An ack frees room; the refused id was not recorded.
	ackMany(t, s, store.Ack{Household: hh, Device: "a", Cursor: 2})
	res := sendOK(t, s, p("over", 10, "a", "b")) // 80 + 20
	if res.Repeat || deliveries(res.Deliveries) != "a:5 b:5" {
		t.Errorf("after an ack: %s (repeat %v), want a:5 b:5", deliveries(res.Deliveries), res.Repeat)
	}
	// Zero means no bound.
	q = p("unbounded", 1000, "a", "b", "c")
	q.MaxHouseholdPendingBytes = 0
	sendOK(t, s, q)
}

// testRepeatWakes: a repeat reports each recipient's push target now and
// whether its copy of this send is still stored. The last step's guard is
// the send_ref in the pending check: with the seq alone, a device
// registered again after removal, whose seq 1 went to another send,
// showed as pending in both backends (checked once by hand).
func testRepeatWakes(t *testing.T, open Opener) {
	s := fresh(t, open)
	if _, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "a", Push: &pushA, Now: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "c", Push: &pushB, Now: t0}); err != nil {
		t.Fatal(err)
	}
	register(t, s, hh, "b")
	p := store.SendParams{Sender: "b", ID: "1", To: []string{"a", "b", "c"}, Payload: []byte("x")}
	first := sendOK(t, s, p)
	for _, d := range first.Deliveries {
		if !d.Pending {
			t.Errorf("first send: delivery %s not Pending", d.Device)
		}
	}

	type want struct {
		push    device.PushTarget
		pending bool
	}
	check := func(step string, wants map[string]want) {
		t.Helper()
		res := sendOK(t, s, p)
		if !res.Repeat {
			t.Fatalf("%s: not a repeat", step)
		}
		if got := deliveries(res.Deliveries); got != "a:1 b:1 c:1" {
			t.Errorf("%s: deliveries %s, want the first answer a:1 b:1 c:1", step, got)
		}
		for _, d := range res.Deliveries {
			w := wants[d.Device]
			if d.Pending != w.pending || d.Push.Empty() != w.push.Empty() || !w.push.Empty() && d.Push != w.push {
				t.Errorf("%s: delivery %s = push %+v pending %v, want push %+v pending %v", step, d.Device, d.Push, d.Pending, w.push, w.pending)
			}
		}
	}
	check("unchanged", map[string]want{"a": {pushA, true}, "b": {device.PushTarget{}, true}, "c": {pushB, true}})

	// The push targets are the recipients' current ones.
	if _, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "a", Push: &pushB, Now: t0}); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearPush(ctx(t), hh, "c", pushB); err != nil {
		t.Fatal(err)
	}
	check("targets changed", map[string]want{"a": {pushB, true}, "b": {device.PushTarget{}, true}, "c": {device.PushTarget{}, true}})

	// An acknowledged copy is no longer pending; the others still are.
	ack(t, s, hh, "a", 1)
	check("a acked", map[string]want{"a": {pushB, false}, "b": {device.PushTarget{}, true}, "c": {device.PushTarget{}, true}})

	// A removed recipient has neither. Registered again, its seq 1 goes
	// to another send: still not this send's copy.
	if err := s.DeleteDevice(ctx(t), hh, "c", t0); err != nil {
		t.Fatal(err)
	}
	check("c removed", map[string]want{"a": {pushB, false}, "b": {device.PushTarget{}, true}, "c": {device.PushTarget{}, false}})
	if _, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "c", Push: &pushA, Now: t0}); err != nil {
		t.Fatal(err)
	}
	if r := sendOK(t, s, store.SendParams{Sender: "b", ID: "other", To: []string{"c"}, Payload: []byte("y")}); deliveries(r.Deliveries) != "c:1" {
		t.Fatalf("send to the re-registered c = %s, want c:1", deliveries(r.Deliveries))
	}
	check("c registered again", map[string]want{"a": {pushB, false}, "b": {device.PushTarget{}, true}, "c": {pushA, false}})
}

// testSendRemovedAt: a send reports each recipient's last removal, first
// send and repeat alike, so that a relay handing the envelope over from
// memory can check a poll's token as Fetch's RemovedAt lets it.
func testSendRemovedAt(t *testing.T, open Opener) {
	s := fresh(t, open)
	register(t, s, hh, "a", "b")
	removed := t0.Add(time.Minute)
	if err := s.DeleteDevice(ctx(t), hh, "a", removed); err != nil {
		t.Fatal(err)
	}
	register(t, s, hh, "a")
	for _, id := range []string{"1", "1"} { // the second is a repeat
		res := sendOK(t, s, store.SendParams{Sender: "x", ID: id, To: []string{"a", "b"}, Payload: []byte("x")})
		if len(res.Deliveries) != 2 || res.Deliveries[0].Life != device.LifeAfter(removed) || !res.Deliveries[1].Life.IsZero() {
			t.Fatalf("deliveries (repeat %v) = %+v, want a removed at %v and b never", res.Repeat, res.Deliveries, removed)
		}
	}
}
