package storetest

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

var (
	keyA  = bytes.Repeat([]byte{0xa1}, 32)
	keyB  = bytes.Repeat([]byte{0xb2}, 32)
	pushA = device.PushTarget{Kind: device.PushUnifiedPush, Address: "https://push.example/a"}
	pushB = device.PushTarget{Kind: device.PushAPNs, Address: "0a1b2c3d"}
)

func testRegister(t *testing.T, open Opener) {
	t.Run("CreatesWithFields", func(t *testing.T) {
		s := fresh(t, open)
		d, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "phone", Push: &pushA, IdentityKey: keyA, Now: t0})
		if err != nil {
			t.Fatalf("Register: %v", err)
		}
		if d.Household != hh || d.Name != "phone" {
			t.Errorf("got %s/%s, want %s/phone", d.Household, d.Name, hh)
		}
		if d.Push != pushA {
			t.Errorf("Push = %+v, want %+v", d.Push, pushA)
		}
		if !bytes.Equal(d.IdentityKey, keyA) {
			t.Errorf("IdentityKey = %x, want %x", d.IdentityKey, keyA)
		}
		if d.Cursor != 0 || d.Head != 0 {
			t.Errorf("Cursor, Head = %d, %d, want 0, 0", d.Cursor, d.Head)
		}
		if !d.RegisteredAt.Equal(t0) || !d.LastSeen.Equal(t0) {
			t.Errorf("RegisteredAt, LastSeen = %v, %v, want %v", d.RegisteredAt, d.LastSeen, t0)
		}
	})

	t.Run("RepeatKeepsFieldsAndCursor", func(t *testing.T) {
		s := fresh(t, open)
		if _, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "phone", Push: &pushA, IdentityKey: keyA, Now: t0}); err != nil {
			t.Fatalf("Register: %v", err)
		}
		register(t, s, hh, "laptop")
		for i := range 3 {
			sendOK(t, s, store.SendParams{Sender: "laptop", ID: string(rune('a' + i)), To: []string{"phone"}, Payload: []byte("x")})
		}
		ack(t, s, hh, "phone", 2)

		later := t0.Add(time.Hour)
		d, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "phone", Now: later})
		if err != nil {
			t.Fatalf("Register again: %v", err)
		}
		if d.Push != pushA || !bytes.Equal(d.IdentityKey, keyA) {
			t.Errorf("nil fields changed the device: Push %+v key %x", d.Push, d.IdentityKey)
		}
		if d.Cursor != 2 || d.Head != 3 {
			t.Errorf("Cursor, Head = %d, %d, want 2, 3", d.Cursor, d.Head)
		}
		if !d.RegisteredAt.Equal(t0) {
			t.Errorf("RegisteredAt = %v, want the first registration %v", d.RegisteredAt, t0)
		}
		if !d.LastSeen.Equal(later) {
			t.Errorf("LastSeen = %v, want %v", d.LastSeen, later)
		}
		// The envelope above the cursor is still owed after a register.
		if got := seqs(fetchAll(t, s, hh, "phone", 2)); !slices.Equal(got, []int64{3}) {
			t.Errorf("after register, pending seqs = %v, want [3]", got)
		}
	})

	t.Run("UpdatesSetFields", func(t *testing.T) {
		s := fresh(t, open)
		if _, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "phone", Push: &pushA, IdentityKey: keyA, Now: t0}); err != nil {
			t.Fatalf("Register: %v", err)
		}
		d, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "phone", Push: &pushB, Now: t0})
		if err != nil {
			t.Fatalf("Register push: %v", err)
		}
		if d.Push != pushB || !bytes.Equal(d.IdentityKey, keyA) {
			t.Errorf("after push update: Push %+v key %x, want %+v and the old key", d.Push, d.IdentityKey, pushB)
		}
		d, err = s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "phone", IdentityKey: keyB, Now: t0})
		if err != nil {
			t.Fatalf("Register key: %v", err)
		}
		if d.Push != pushB || !bytes.Equal(d.IdentityKey, keyB) {
			t.Errorf("after key update: Push %+v key %x, want %+v and %x", d.Push, d.IdentityKey, pushB, keyB)
		}
		none := device.PushTarget{Kind: device.PushNone}
		d, err = s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "phone", Push: &none, Now: t0})
		if err != nil {
			t.Fatalf("Register no push: %v", err)
		}
		if !d.Push.Empty() {
			t.Errorf("Push = %+v after registering kind none, want empty", d.Push)
		}
		ds := listAll(t, s, hh)
		if len(ds) != 1 || !ds[0].Push.Empty() || !bytes.Equal(ds[0].IdentityKey, keyB) {
			t.Errorf("stored device = %+v, want one with no push and key %x", ds, keyB)
		}
	})
}

func listAll(t testing.TB, s store.Store, household string) []store.Device {
	t.Helper()
	ds, err := s.Devices(ctx(t), store.ListParams{Household: household, Limit: 1000})
	if err != nil {
		t.Fatalf("Devices(%s): %v", household, err)
	}
	return ds
}

func names(ds []store.Device) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Name
	}
	return out
}

func testDevices(t *testing.T, open Opener) {
	s := fresh(t, open)
	for _, name := range []string{"tablet", "laptop", "phone", "watch"} {
		p := store.RegisterParams{Household: hh, Device: name, Now: t0}
		if name == "phone" {
			p.IdentityKey = keyA
			p.Push = &pushA
		}
		if _, err := s.Register(ctx(t), p); err != nil {
			t.Fatalf("Register(%s): %v", name, err)
		}
	}
	register(t, s, "other", "aardvark", "phone")

	all := listAll(t, s, hh)
	if got, want := names(all), []string{"laptop", "phone", "tablet", "watch"}; !slices.Equal(got, want) {
		t.Fatalf("Devices = %v, want %v (ordered by name, own household only)", got, want)
	}
	phone := all[1]
	if phone.Household != hh || !bytes.Equal(phone.IdentityKey, keyA) || phone.Push != pushA {
		t.Errorf("phone = %+v, want household %s, key and push stored", phone, hh)
	}
	if !phone.RegisteredAt.Equal(t0) || !phone.LastSeen.Equal(t0) {
		t.Errorf("phone timestamps = %v, %v, want %v", phone.RegisteredAt, phone.LastSeen, t0)
	}
	if len(all[0].IdentityKey) != 0 {
		t.Errorf("laptop IdentityKey = %x, want none", all[0].IdentityKey)
	}

	tests := []struct {
		name  string
		after string
		limit int
		want  []string
	}{
		{"first page", "", 2, []string{"laptop", "phone"}},
		{"second page", "phone", 2, []string{"tablet", "watch"}},
		{"after is exclusive and need not exist", "m", 1, []string{"phone"}},
		{"past the end", "watch", 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds, err := s.Devices(ctx(t), store.ListParams{Household: hh, After: tt.after, Limit: tt.limit})
			if err != nil {
				t.Fatalf("Devices: %v", err)
			}
			if got := names(ds); !slices.Equal(got, tt.want) {
				t.Errorf("Devices(after %q, limit %d) = %v, want %v", tt.after, tt.limit, got, tt.want)
			}
		})
	}

	// Cursor and head are reported in the directory too.
	sendOK(t, s, store.SendParams{Sender: "phone", ID: "1", To: []string{"laptop"}, Payload: []byte("x")})
	sendOK(t, s, store.SendParams{Sender: "phone", ID: "2", To: []string{"laptop"}, Payload: []byte("x")})
	ack(t, s, hh, "laptop", 1)
	if d := listAll(t, s, hh)[0]; d.Cursor != 1 || d.Head != 2 {
		t.Errorf("laptop Cursor, Head = %d, %d, want 1, 2", d.Cursor, d.Head)
	}
}

func testDelete(t *testing.T, open Opener) {
	s := fresh(t, open)
	register(t, s, hh, "phone", "laptop")
	register(t, s, "other", "phone")
	for i := range 3 {
		sendOK(t, s, store.SendParams{Sender: "laptop", ID: string(rune('a' + i)), To: []string{"laptop", "phone"}, Payload: []byte("x")})
	}
	sendOK(t, s, store.SendParams{Household: "other", Sender: "x", ID: "a", To: []string{"phone"}, Payload: []byte("x")})

	if at, err := s.RemovedAt(ctx(t), hh, "phone"); err != nil || !at.IsZero() {
		t.Fatalf("RemovedAt before delete = %v, %v, want zero, nil", at, err)
	}
	at := t0.Add(time.Minute)
	if err := s.DeleteDevice(ctx(t), hh, "phone", at); err != nil {
		t.Fatalf("DeleteDevice: %v", err)
	}
	if got, err := s.RemovedAt(ctx(t), hh, "phone"); err != nil || !got.Equal(at) {
		t.Errorf("RemovedAt = %v, %v, want %v", got, err, at)
	}
	if got := names(listAll(t, s, hh)); !slices.Equal(got, []string{"laptop"}) {
		t.Errorf("Devices after delete = %v, want [laptop]", got)
	}
	if got := fetchAll(t, s, hh, "phone", 0); len(got) != 0 {
		t.Errorf("deleted device still has envelopes %v", seqs(got))
	}
	// Nothing else was touched: the other recipient, the other household.
	if got := seqs(fetchAll(t, s, hh, "laptop", 0)); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Errorf("laptop seqs = %v, want [1 2 3]", got)
	}
	if got := seqs(fetchAll(t, s, "other", "phone", 0)); !slices.Equal(got, []int64{1}) {
		t.Errorf("other/phone seqs = %v, want [1]", got)
	}
	if at, err := s.RemovedAt(ctx(t), "other", "phone"); err != nil || !at.IsZero() {
		t.Errorf("other/phone RemovedAt = %v, %v, want zero", at, err)
	}

	err := sendErr(s, store.SendParams{Sender: "laptop", ID: "to-deleted", To: []string{"laptop", "phone"}, Payload: []byte("x")})
	if e := isUnknown(err, "phone"); e != nil {
		t.Errorf("send to deleted device: %v", e)
	}
	if err := s.DeleteDevice(ctx(t), hh, "phone", at); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second DeleteDevice = %v, want ErrNotFound", err)
	}
	if err := s.DeleteDevice(ctx(t), hh, "never", at); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("DeleteDevice(unknown) = %v, want ErrNotFound", err)
	}

	// Registered again, the device starts afresh at 0; the removal stays on
	// record so its older tokens remain refused.
	d, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "phone", Now: at.Add(time.Minute)})
	if err != nil {
		t.Fatalf("Register again: %v", err)
	}
	if d.Cursor != 0 || d.Head != 0 {
		t.Errorf("re-registered Cursor, Head = %d, %d, want 0, 0", d.Cursor, d.Head)
	}
	res := sendOK(t, s, store.SendParams{Sender: "laptop", ID: "again", To: []string{"phone"}, Payload: []byte("x")})
	if got := deliveries(res.Deliveries); got != "phone:1" {
		t.Errorf("first send after re-register = %s, want phone:1", got)
	}
	if got, err := s.RemovedAt(ctx(t), hh, "phone"); err != nil || !got.Equal(at) {
		t.Errorf("RemovedAt after re-register = %v, %v, want %v", got, err, at)
	}
}

func testRemovals(t *testing.T, open Opener) {
	s := fresh(t, open)
	list := func(limit int) []store.Removal {
		t.Helper()
		rs, err := s.Removals(ctx(t), limit)
		if err != nil {
			t.Fatalf("Removals(%d): %v", limit, err)
		}
		slices.SortFunc(rs, func(a, b store.Removal) int {
			return strings.Compare(a.Household+"/"+a.Device, b.Household+"/"+b.Device)
		})
		return rs
	}
	if got := list(10); len(got) != 0 {
		t.Fatalf("Removals of a new store = %v, want none", got)
	}
	register(t, s, hh, "phone", "laptop")
	register(t, s, "other", "phone")
	at := t0.Add(time.Minute)
	for _, d := range []struct{ household, device string }{{hh, "phone"}, {"other", "phone"}} {
		if err := s.DeleteDevice(ctx(t), d.household, d.device, at); err != nil {
			t.Fatalf("DeleteDevice %s/%s: %v", d.household, d.device, err)
		}
	}
	// Removed again later: the list has the last removal, once.
	later := at.Add(time.Hour)
	register(t, s, hh, "phone")
	if err := s.DeleteDevice(ctx(t), hh, "phone", later); err != nil {
		t.Fatalf("DeleteDevice again: %v", err)
	}
	want := []store.Removal{{Household: hh, Device: "phone", At: later}, {Household: "other", Device: "phone", At: at}}
	got := list(10)
	if len(got) != len(want) {
		t.Fatalf("Removals = %v, want %v", got, want)
	}
	for i := range want {
		if got[i].Household != want[i].Household || got[i].Device != want[i].Device || !got[i].At.Equal(want[i].At) {
			t.Errorf("Removals[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	if got := list(1); len(got) != 1 {
		t.Errorf("Removals(1) = %v, want one", got)
	}
}

func testClearPush(t *testing.T, open Opener) {
	s := fresh(t, open)
	if _, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "phone", Push: &pushA, Now: t0}); err != nil {
		t.Fatalf("Register: %v", err)
	}
	// A provider's late "gone" for an older target must not erase the
	// current one.
	if err := s.ClearPush(ctx(t), hh, "phone", pushB); err != nil {
		t.Fatalf("ClearPush(other target): %v", err)
	}
	if d := listAll(t, s, hh)[0]; d.Push != pushA {
		t.Fatalf("Push = %+v after clearing another target, want %+v", d.Push, pushA)
	}
	same := pushA
	same.Address += "/other"
	if err := s.ClearPush(ctx(t), hh, "phone", same); err != nil {
		t.Fatalf("ClearPush(other address): %v", err)
	}
	if d := listAll(t, s, hh)[0]; d.Push != pushA {
		t.Fatalf("Push = %+v after clearing another address of the same kind, want %+v", d.Push, pushA)
	}
	if err := s.ClearPush(ctx(t), hh, "phone", pushA); err != nil {
		t.Fatalf("ClearPush: %v", err)
	}
	if d := listAll(t, s, hh)[0]; !d.Push.Empty() {
		t.Fatalf("Push = %+v after clearing it, want empty", d.Push)
	}
	register(t, s, hh, "laptop")
	res := sendOK(t, s, store.SendParams{Sender: "laptop", ID: "1", To: []string{"phone"}, Payload: []byte("x")})
	if !res.Deliveries[0].Push.Empty() {
		t.Errorf("delivery Push = %+v after ClearPush, want empty", res.Deliveries[0].Push)
	}
}

// testStaleCredential: a credential issued at or before a device's last
// removal neither creates the device again (a first poll's implicit
// registration, an explicit one) nor acts on the device registered since;
// one issued after it does. Zero IssuedAt checks nothing.
func testStaleCredential(t *testing.T, open Opener) {
	s := fresh(t, open)
	register(t, s, hh, "a")
	removed := t0.Add(time.Minute)
	if err := s.DeleteDevice(ctx(t), hh, "a", removed); err != nil {
		t.Fatal(err)
	}
	for _, issued := range []time.Time{t0, removed} { // before, and at the same microsecond
		_, err := s.Ack(ctx(t), store.AckParams{Household: hh, Device: "a", Cursor: -1, Now: removed.Add(time.Second), IssuedAt: issued})
		if !errors.Is(err, store.ErrRemoved) {
			t.Errorf("first poll of a credential issued at %v, device removed at %v: %v, want ErrRemoved", issued, removed, err)
		}
		_, err = s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "a", Now: removed.Add(time.Second), IssuedAt: issued})
		if !errors.Is(err, store.ErrRemoved) {
			t.Errorf("register of a credential issued at %v, device removed at %v: %v, want ErrRemoved", issued, removed, err)
		}
		if st := state(t, s, hh, "a"); st.Exists {
			t.Fatalf("a stale credential (issued %v) created the removed device again: %+v", issued, st)
		}
	}

	fresh := removed.Add(time.Microsecond)
	if _, err := s.Ack(ctx(t), store.AckParams{Household: hh, Device: "a", Cursor: -1, Now: fresh, IssuedAt: fresh}); err != nil {
		t.Fatalf("first poll of a credential issued after the removal: %v", err)
	}
	key := []byte("0123456789abcdef0123456789abcdef")
	d, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "a", IdentityKey: key, Now: fresh, IssuedAt: fresh})
	if err != nil || string(d.IdentityKey) != string(key) {
		t.Fatalf("register of a credential issued after the removal = %+v, %v", d, err)
	}
	sendOK(t, s, store.SendParams{Sender: "x", ID: "1", To: []string{"a"}, Payload: []byte("x")})

	// The device of the new life is out of the old credential's reach.
	other := []byte("fedcba9876543210fedcba9876543210")
	if _, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: "a", IdentityKey: other, Now: fresh, IssuedAt: t0}); !errors.Is(err, store.ErrRemoved) {
		t.Errorf("a stale register of the device registered since: %v, want ErrRemoved", err)
	}
	if _, err := s.Ack(ctx(t), store.AckParams{Household: hh, Device: "a", Cursor: 1, Now: fresh, IssuedAt: t0}); !errors.Is(err, store.ErrRemoved) {
		t.Errorf("a stale ack of the device registered since: %v, want ErrRemoved", err)
	}
	if ds := listAll(t, s, hh); len(ds) != 1 || string(ds[0].IdentityKey) != string(key) {
		t.Errorf("after stale calls the directory holds %+v, want a with its new key", ds)
	}
	if st := state(t, s, hh, "a"); !st.Exists || st.Cursor != 0 || st.Head != 1 {
		t.Errorf("after stale calls a stands at %+v, want cursor 0, head 1", st)
	}

	// Without a credential to check (tools, tests), nothing is refused.
	register(t, s, hh, "a")
}
