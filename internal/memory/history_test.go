package memory

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

// historyStore is a real store whose History the test sets.
type historyStore struct {
	store.Store
	mu  sync.Mutex
	h   store.History
	err error
}

func (s *historyStore) History(context.Context) (store.History, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.h, s.err
}

func (s *historyStore) set(h store.History, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.h, s.err = h, err
}

// TestWatchDropsMemory: the watch drops what memory knows when a check
// fails, when the store's instance changes, and when its epoch changes, and
// only then; a new epoch is current before Dropped runs, and the
// acknowledgements pending of the old epoch go with it.
func TestWatchDropsMemory(t *testing.T) {
	m, db := newMemory(t)
	ctx := context.Background()
	real, err := db.History(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hs := &historyStore{Store: db, h: real}
	drops := make(chan bool, 10)
	var w *HistoryCheck
	w = NewHistoryCheck(HistoryCheckConfig{Store: hs, Memory: m, Interval: time.Hour, Dropped: func(changed bool) {
		if changed && w.Epoch() != "new-epoch" {
			t.Errorf("Dropped ran with the epoch %q current, want the new one", w.Epoch())
		}
		drops <- changed
	}})
	w.Start()
	t.Cleanup(w.Stop)
	if w.Epoch() != real.Epoch {
		t.Fatalf("Epoch after Start = %q, want the store's %q", w.Epoch(), real.Epoch)
	}
	k := key("phone")
	known := func() bool {
		pos, ok := m.Known(k)
		return ok && pos.Exists
	}
	readAndAck := func() {
		t.Helper()
		pos, err := m.Read(ctx, k, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if pos.Epoch != real.Epoch {
			t.Fatalf("Read = %+v, want the store's epoch %q", pos, real.Epoch)
		}
		m.Acknowledge(k, pos, 0, time.Now())
	}
	dropped := func(what string, want bool) {
		t.Helper()
		select {
		case got := <-drops:
			if got != want {
				t.Fatalf("%s: Dropped(%v), want Dropped(%v)", what, got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: memory not dropped", what)
		}
		if known() {
			t.Fatalf("%s: memory still knows the device", what)
		}
	}

	readAndAck()
	hs.set(real, nil)
	w.Nudge()
	// Nothing changed: a check that drops nothing, then one that does
	// (the instance): the first drop seen must be the second's.
	hs.set(store.History{Epoch: real.Epoch, Instance: "elsewhere"}, nil)
	w.Nudge()
	dropped("instance changed", false)

	readAndAck()
	hs.set(store.History{}, errors.New("store down"))
	w.Nudge()
	dropped("check failed", false)
	if w.Epoch() != real.Epoch {
		t.Errorf("a failed check changed the epoch to %q", w.Epoch())
	}

	hs.set(store.History{Epoch: real.Epoch, Instance: "elsewhere"}, nil)
	readAndAck()
	if n := len(m.acks.snapshot(k)); n != 1 {
		t.Fatalf("%d acks pending, want 1", n)
	}
	m.recent.put(k, store.Envelope{Seq: 1, ID: "kept"}, device.Life{}, time.Now())
	hs.set(store.History{Epoch: "new-epoch", Instance: "elsewhere"}, nil)
	w.Nudge()
	dropped("epoch changed", true)
	if n := len(m.acks.snapshot(k)); n != 0 {
		t.Errorf("%d acks of the old epoch still pending after it changed", n)
	}
	if e, ok := m.Recent(k, 1, device.Life{}); ok {
		t.Errorf("envelope %+v of the old epoch still kept after it changed", e)
	}
	select {
	case got := <-drops:
		t.Errorf("memory dropped once more (%v) with nothing changed", got)
	default:
	}
}

// blockingHistory is a historyStore whose History, once armed, signals
// entered and waits for release before it answers.
type blockingHistory struct {
	*historyStore
	armed            chan struct{} // closed: block from now on
	entered, release chan struct{}
}

func (s *blockingHistory) History(ctx context.Context) (store.History, error) {
	select {
	case <-s.armed:
		s.entered <- struct{}{}
		<-s.release
	default:
	}
	return s.historyStore.History(ctx)
}

// TestWatchSync: Sync returns only once a check that began after it has
// ended, so the epoch that check read is current when it returns.
func TestWatchSync(t *testing.T) {
	m, db := newMemory(t)
	real, err := db.History(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	bs := &blockingHistory{historyStore: &historyStore{Store: db, h: real},
		armed: make(chan struct{}), entered: make(chan struct{}), release: make(chan struct{})}
	w := NewHistoryCheck(HistoryCheckConfig{Store: bs, Memory: m, Interval: time.Hour})
	w.Start()
	t.Cleanup(w.Stop)

	bs.set(store.History{Epoch: "new-epoch", Instance: real.Instance}, nil)
	close(bs.armed)
	go func() {
		<-bs.entered // the check is under way; let it answer
		close(bs.release)
	}()
	w.Sync(context.Background())
	if got := w.Epoch(); got != "new-epoch" {
		t.Fatalf("Epoch after Sync = %q, want the epoch its check read", got)
	}
}

// TestWatchSyncAfterStop: Sync does not wait for a stopped watch.
func TestWatchSyncAfterStop(t *testing.T) {
	m, db := newMemory(t)
	w := NewHistoryCheck(HistoryCheckConfig{Store: db, Memory: m, Interval: time.Hour})
	w.Start()
	w.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w.Sync(ctx)
	if ctx.Err() != nil {
		t.Fatal("Sync waited for a stopped watch until its deadline")
	}
}
