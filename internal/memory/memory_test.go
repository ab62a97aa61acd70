package memory

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/store/sqlite"
	"github.com/flamenet/relay/wake"
)

// countingStore counts State calls: the reads memory should spare.
type countingStore struct {
	store.Store
	states atomic.Int64
}

func (c *countingStore) State(ctx context.Context, household, name string) (store.DeviceState, error) {
	c.states.Add(1)
	return c.Store.State(ctx, household, name)
}

func newMemory(t *testing.T) (*Memory, *countingStore) {
	t.Helper()
	db, err := sqlite.Open(context.Background(), sqlite.Config{Path: filepath.Join(t.TempDir(), "relay.db"), Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st := &countingStore{Store: db}
	m := New(Config{Store: st, AckInterval: time.Hour, StoreTimeout: time.Second})
	m.Start()
	t.Cleanup(m.Stop)
	return m, st
}

// TestPositionReadOnce: a device's first poll reads the store and
// registers it; later ones are answered from memory, which the hub's news
// keeps current.
func TestPositionReadOnce(t *testing.T) {
	m, st := newMemory(t)
	ctx := context.Background()
	k := key("phone")
	pos, err := m.Position(ctx, k, time.Now())
	if err != nil || !pos.Exists || pos.Head != 0 {
		t.Fatalf("first Position = %+v, %v", pos, err)
	}
	reads := st.states.Load()
	m.Advanced(wake.Wake{Key: k, Head: 3})
	pos, err = m.Position(ctx, k, time.Now())
	if err != nil || pos.Head != 3 {
		t.Fatalf("Position after news = %+v, %v; want head 3", pos, err)
	}
	if n := st.states.Load() - reads; n != 0 {
		t.Fatalf("a known device's Position read the store %d times", n)
	}
	if ds, _ := st.Devices(ctx, store.ListParams{Household: "home"}); len(ds) != 1 {
		t.Fatalf("the first poll did not register the device: %+v", ds)
	}
}

// TestStaleCredentialRegistersNothing: Read with a credential older than
// the device's last removal is refused by the store, and memory keeps the
// device removed.
func TestStaleCredentialRegistersNothing(t *testing.T) {
	m, st := newMemory(t)
	ctx := context.Background()
	k := key("phone")
	if _, err := m.Register(ctx, store.RegisterParams{Household: "home", Device: "phone", Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	issued := time.Now()
	removed := issued.Add(time.Millisecond)
	if err := st.DeleteDevice(ctx, "home", "phone", removed); err != nil {
		t.Fatal(err)
	}
	m.Removed(k, removed)
	if _, err := m.Read(ctx, k, issued); !errors.Is(err, store.ErrRemoved) {
		t.Fatalf("Read with a credential issued before the removal: %v, want ErrRemoved", err)
	}
	if life, ok := m.KnownLife(k); !ok || life != device.LifeAfter(removed) {
		t.Fatalf("KnownLife = %v, %v; want the removal's", life, ok)
	}
}

// TestRegisterKeepsWhatItRead: a registration's answer is kept, so that
// the device's first poll reads nothing; acks not yet written count in the
// cursor a registration reports. Without the registration's Fill this goes
// red (tried: the first poll read the store).
func TestRegisterKeepsWhatItRead(t *testing.T) {
	m, st := newMemory(t)
	ctx := context.Background()
	k := key("phone")
	// The list of removals, read at start, tells the device's life.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, ok := m.Listed(k); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the list of removals was not read")
		}
		time.Sleep(time.Millisecond) // a bounded poll of the loader's own state
	}
	if _, err := m.Register(ctx, store.RegisterParams{Household: "home", Device: "phone", Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	reads := st.states.Load()
	pos, err := m.Position(ctx, k, time.Now())
	if err != nil || !pos.Exists {
		t.Fatalf("Position after Register = %+v, %v", pos, err)
	}
	if n := st.states.Load() - reads; n != 0 {
		t.Fatalf("the first poll after Register read the store %d times", n)
	}
	m.Advanced(wake.Wake{Key: k, Head: 2})
	pos, _ = m.Position(ctx, k, time.Now())
	m.Acknowledge(k, pos, 2, time.Now())
	d, err := m.Register(ctx, store.RegisterParams{Household: "home", Device: "phone", Now: time.Now()})
	if err != nil || d.Cursor != 2 {
		t.Fatalf("Register after an unwritten ack = %+v, %v; want cursor 2", d, err)
	}
}

// TestWakeCarriesRecentEnvelope: a wake's envelope is handed out for its
// life only, and a removal forgets it.
func TestWakeCarriesRecentEnvelope(t *testing.T) {
	m, _ := newMemory(t)
	k := key("phone")
	e := store.Envelope{Seq: 1, ID: "x", From: "laptop", SentAt: time.UnixMicro(1_800_000_000_000_000).UTC(), Payload: []byte("hi")}
	m.Advanced(wake.Wake{Key: k, Head: 1, Envelope: EncodeEnvelope(e)})
	if got, ok := m.Recent(k, 1, device.Life{}); !ok || got.ID != "x" {
		t.Fatalf("Recent = %+v, %v", got, ok)
	}
	if _, ok := m.Recent(k, 1, device.LifeAfter(time.Now())); ok {
		t.Fatal("an envelope of the first life was handed to a later one")
	}
	m.Removed(k, time.Now())
	if _, ok := m.Recent(k, 1, device.Life{}); ok {
		t.Fatal("a removed device's envelope was kept")
	}
}

// TestWakeOfLaterLifeTellsTheRemoval: a wake of a send stored after a
// removal this relay has not heard of tells memory of that removal, even
// for a device memory never met: an old token is then refused from memory.
// Without the removal list's update in Advanced this goes red (tried).
func TestWakeOfLaterLifeTellsTheRemoval(t *testing.T) {
	m, _ := newMemory(t)
	k := key("phone")
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, ok := m.Listed(k); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the list of removals was not read")
		}
		time.Sleep(time.Millisecond) // a bounded poll of the loader's own state
	}
	removed := time.Now()
	m.Advanced(wake.Wake{Key: k, Life: device.LifeAfter(removed), Head: 1})
	if life, ok := m.KnownLife(k); !ok || life != device.LifeAfter(removed) || life.Admits(removed.Add(-time.Second)) {
		t.Fatalf("KnownLife after a wake of a later life = %v, %v; want the removal's, refusing older tokens", life, ok)
	}
}

// TestLostKeepsPendingAcks: after memory is dropped, a read of the store
// merges the acknowledgements not yet written of the same life and epoch,
// so that a device polling without a cursor is not handed again what it
// acknowledged; those of another epoch are not merged. Without the merge
// in read, the cursor read after Lost is the store's 0.
func TestLostKeepsPendingAcks(t *testing.T) {
	m, st := newMemory(t)
	ctx := context.Background()
	k := key("phone")
	if _, err := m.Register(ctx, store.RegisterParams{Household: "home", Device: "phone", Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"1", "2", "3"} {
		if _, err := st.Send(ctx, store.SendParams{Household: "home", Sender: "phone", ID: id, To: []string{"phone"}, Payload: []byte("x"), Now: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	pos, err := m.Read(ctx, k, time.Now())
	if err != nil || pos.Head != 3 {
		t.Fatalf("Read = %+v, %v", pos, err)
	}
	m.Acknowledge(k, pos, 2, time.Now()) // pending: the writer waits an hour
	m.Lost()
	if _, ok := m.Known(k); ok {
		t.Fatal("memory still knows the device after Lost")
	}
	pos, err = m.Position(ctx, k, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if pos.Cursor != 2 {
		t.Errorf("cursor after Lost = %d, want 2: the pending acknowledgement", pos.Cursor)
	}
	if stored, _ := st.State(ctx, "home", "phone"); stored.Cursor != 0 {
		t.Fatalf("the store's cursor is %d: the ack was written, and the test proves nothing", stored.Cursor)
	}

	// An ack of another epoch than the store's is not merged.
	m.acks.add(k, 3, time.Time{}, pos.Life, "another-epoch")
	m.Lost()
	if pos, err = m.Position(ctx, k, time.Now()); err != nil || pos.Cursor != 0 {
		t.Errorf("cursor after Lost with an ack of another epoch pending = %d, %v, want the store's 0", pos.Cursor, err)
	}
}

// TestPairReplacingStartsNewLife: a pairing that replaces a device leaves
// memory at the new life, registered, before any hub's news of the
// removal: not at the old device's head.
func TestPairReplacingStartsNewLife(t *testing.T) {
	m, st := newMemory(t)
	ctx := context.Background()
	k := key("phone")
	now := time.Now().UTC().Truncate(time.Microsecond)
	if _, err := m.Position(ctx, k, now); err != nil {
		t.Fatal(err)
	}
	m.Advanced(wake.Wake{Key: k, Head: 3})
	if err := st.CreateInvitation(ctx, store.InviteParams{Household: "home", Device: "phone", Scope: "device", Replace: true,
		Code: store.HashSecret("C"), Now: now, Expires: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	g, err := m.Pair(ctx, store.PairParams{Code: store.HashSecret("C"), Now: now.Add(time.Second),
		Secret: store.HashSecret("s"), SecretExpires: now.Add(time.Hour)})
	if err != nil || !g.Replaced {
		t.Fatalf("Pair = %+v, %v; want a replacement", g, err)
	}
	pos, ok := m.Known(k)
	if !ok || !pos.Exists || pos.Head != 0 || pos.Life != device.LifeAfter(g.RemovedAt) {
		t.Fatalf("memory after the replacement: %+v (known %v), want the new life %v at head 0", pos, ok, device.LifeAfter(g.RemovedAt))
	}
}
