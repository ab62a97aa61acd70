package position

import (
	"testing"
	"time"

	"github.com/flamenet/relay/device"
)

var t1 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func removedAt(t *testing.T, r *Removals, k device.Key) time.Time {
	t.Helper()
	life, ok := r.Get(k)
	if !ok {
		t.Fatalf("Get(%v): not complete", k)
	}
	return life.RemovedAt()
}

func TestRemovalsCompleteOnceFilled(t *testing.T) {
	r := NewRemovals()
	if _, ok := r.Get(k); ok {
		t.Fatal("Get before any Fill answered; a device removed before start would pass")
	}
	laptop := device.Key{Household: "home", Device: "laptop"}
	if !r.Fill(r.Begin(), map[device.Key]device.Life{k: device.LifeAfter(t1)}) {
		t.Fatal("Fill refused without Lost")
	}
	if got := removedAt(t, r, k); !got.Equal(t1) {
		t.Errorf("Get(phone) = %v, want %v", got, t1)
	}
	if got := removedAt(t, r, laptop); !got.IsZero() {
		t.Errorf("Get(laptop) = %v, want zero: never removed", got)
	}
}

// TestRemovalsNewsDuringARead: a removal the hub tells of while the list is
// read is kept, whether the read saw it or not. With Fill replacing the
// map instead of merging into it, this goes red (tried): a device removed
// after the read's snapshot looked never removed, and its old tokens
// passed.
func TestRemovalsNewsDuringARead(t *testing.T) {
	r := NewRemovals()
	laptop := device.Key{Household: "home", Device: "laptop"}
	gen := r.Begin()
	r.Removed(laptop, device.LifeAfter(t1))                     // after the snapshot: not in the read
	r.Removed(k, device.LifeAfter(t1.Add(time.Hour)))           // removed again after the snapshot
	read := map[device.Key]device.Life{k: device.LifeAfter(t1)} // the snapshot's removal of phone
	if !r.Fill(gen, read) {
		t.Fatal("Fill refused without Lost")
	}
	if got := removedAt(t, r, laptop); !got.Equal(t1) {
		t.Errorf("Get(laptop) = %v, want %v from the news", got, t1)
	}
	if got := removedAt(t, r, k); !got.Equal(t1.Add(time.Hour)) {
		t.Errorf("Get(phone) = %v, want the later removal %v", got, t1.Add(time.Hour))
	}
	// News older than what is known does not move it back.
	r.Removed(k, device.LifeAfter(t1))
	if got := removedAt(t, r, k); !got.Equal(t1.Add(time.Hour)) {
		t.Errorf("Get(phone) after older news = %v, want %v", got, t1.Add(time.Hour))
	}
}

// TestRemovalsLostDuringARead: a read begun before news was lost may miss
// a removal nobody will tell of again, so it does not make the list
// complete. Without the generation check in Fill, this goes red (tried).
func TestRemovalsLostDuringARead(t *testing.T) {
	r := NewRemovals()
	gen := r.Begin()
	r.Lost()
	if r.Fill(gen, map[device.Key]device.Life{}) {
		t.Error("Fill of a read begun before Lost was kept")
	}
	if _, ok := r.Get(k); ok {
		t.Error("Get answered from a read begun before Lost")
	}
	if !r.Fill(r.Begin(), map[device.Key]device.Life{k: device.LifeAfter(t1)}) {
		t.Fatal("Fill of a read begun after Lost refused")
	}
	if got := removedAt(t, r, k); !got.Equal(t1) {
		t.Errorf("Get = %v, want %v", got, t1)
	}

	// Lost once complete: not trusted until read again.
	r.Lost()
	if _, ok := r.Get(k); ok {
		t.Error("Get answered after Lost, before a new read")
	}
}
