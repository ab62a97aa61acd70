package position

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
)

var k = device.Key{Household: "home", Device: "phone"}

func filled(t *testing.T, c *Cache, k device.Key, st State) State {
	t.Helper()
	return c.Fill(k, c.Begin(k), st)
}

// TestNewsDuringARead: a wake that arrives while the store is read is kept
// and merged, so a read that started before the send cannot leave an old
// head behind. With Advanced ignoring entries not yet filled, this goes
// red (tried): the head stays at the store's 4 and a poll would park on an
// envelope that is waiting.
func TestNewsDuringARead(t *testing.T) {
	c := New(0)
	ticket := c.Begin(k)
	c.Advanced(k, device.Life{}, 5) // a send committed after the store read's snapshot
	got := c.Fill(k, ticket, State{Exists: true, Cursor: 2, Head: 4})
	if got.Head != 5 || got.Cursor != 2 || !got.Exists {
		t.Fatalf("Fill = %+v, want head 5 from the news", got)
	}
	if st, ok := c.Get(k); !ok || st.Head != 5 {
		t.Fatalf("Get = %+v, %v", st, ok)
	}
}

// TestRemovalDuringARead: a read begun before a removal is not merged into
// what the removal left: the device is gone, with its removal time, and
// its next life starts from zero.
func TestRemovalDuringARead(t *testing.T) {
	c := New(0)
	at := time.Unix(1_800_000_000, 0)
	ticket := c.Begin(k)
	c.Removed(k, device.LifeAfter(at))
	got := c.Fill(k, ticket, State{Exists: true, Cursor: 7, Head: 9})
	if got.Head != 9 {
		t.Fatalf("Fill returns the read as it was: %+v", got)
	}
	st, ok := c.Get(k)
	if !ok || st.Exists || st.Head != 0 || st.Cursor != 0 || st.Life != device.LifeAfter(at) {
		t.Fatalf("after the removal Get = %+v, %v; want the removal, nothing else", st, ok)
	}
	c.Registered(k, time.Unix(1_800_000_100, 0))
	c.Advanced(k, device.LifeAfter(at), 1)
	if st, _ := c.Get(k); !st.Exists || st.Head != 1 || st.Life != device.LifeAfter(at) {
		t.Fatalf("the next life = %+v", st)
	}
}

// TestLost: news lost makes everything known stale, and a read in flight
// is not kept.
func TestLost(t *testing.T) {
	c := New(0)
	other := device.Key{Household: "home", Device: "laptop"}
	filled(t, c, other, State{Exists: true, Head: 3})
	ticket := c.Begin(k)
	c.Lost()
	c.Fill(k, ticket, State{Exists: true, Head: 4})
	if _, ok := c.Get(k); ok {
		t.Fatal("a read begun before Lost was kept")
	}
	if _, ok := c.Get(other); ok {
		t.Fatal("a device known before Lost is still trusted")
	}
	filled(t, c, other, State{Exists: true, Head: 6})
	if st, ok := c.Get(other); !ok || st.Head != 6 {
		t.Fatalf("read again after Lost: %+v, %v", st, ok)
	}
}

// TestNewsOfStrangers: a wake for a device nobody asked about is not
// remembered; its first use reads the store, which holds that send.
func TestNewsOfStrangers(t *testing.T) {
	c := New(0)
	for i := range 1000 {
		c.Advanced(device.Key{Household: "h", Device: fmt.Sprint(i)}, device.Life{}, 1)
	}
	if n := c.Len(); n != 0 {
		t.Fatalf("%d strangers remembered", n)
	}
}

// TestBounded: past its bound the cache forgets, and stays near it.
func TestBounded(t *testing.T) {
	c := New(640)
	for i := range 20_000 {
		filled(t, c, device.Key{Household: "h", Device: fmt.Sprint(i)}, State{Exists: true})
	}
	if n := c.Len(); n > 640+shardCount {
		t.Fatalf("%d devices remembered, bound 640", n)
	}
}

// TestAckedAndTouched: acks move the cursor up only; activity is due once
// per interval.
func TestAckedAndTouched(t *testing.T) {
	c := New(0)
	filled(t, c, k, State{Exists: true, Cursor: 2, Head: 9})
	c.Acked(k, device.Life{}, 5)
	c.Acked(k, device.Life{}, 3)
	if st, _ := c.Get(k); st.Cursor != 5 {
		t.Fatalf("cursor = %d, want 5", st.Cursor)
	}
	now := time.Unix(1_800_000_000, 0)
	if !c.Touch(k, now, time.Minute) || c.Touch(k, now.Add(time.Second), time.Minute) || !c.Touch(k, now.Add(time.Minute), time.Minute) {
		t.Fatal("activity not due exactly once a minute")
	}
	c.Empty(k, device.Life{}, 9)
	if st, _ := c.Get(k); st.Pending(5) {
		t.Fatal("pending after a read found nothing up to the head")
	}
	c.Advanced(k, device.Life{}, 10)
	if st, _ := c.Get(k); !st.Pending(5) {
		t.Fatal("not pending after the head moved past the floor")
	}
}

// TestConcurrentNews: reads and news for the same devices at once; in the
// end every device's head is the highest news it had.
func TestConcurrentNews(t *testing.T) {
	c := New(0)
	keys := make([]device.Key, 50)
	for i := range keys {
		keys[i] = device.Key{Household: "h", Device: fmt.Sprint(i)}
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				key := keys[(i+w)%len(keys)]
				if w%2 == 0 {
					c.Fill(key, c.Begin(key), State{Exists: true, Head: int64(i % 7)})
				} else {
					c.Advanced(key, device.Life{}, int64(i))
				}
			}
		})
	}
	wg.Wait()
	for _, key := range keys {
		c.Advanced(key, device.Life{}, 1<<40)
		if st, ok := c.Get(key); !ok || st.Head != 1<<40 {
			t.Fatalf("%v: %+v, %v", key, st, ok)
		}
	}
}

// TestLateWakeOfEarlierLife: a wake of a send stored before a removal that
// arrives after it changes nothing: the device stays removed, and its next
// life starts from nothing. With the life check in Advanced removed this
// goes red (tried): the removed device existed again with the old head.
func TestLateWakeOfEarlierLife(t *testing.T) {
	c := New(0)
	filled(t, c, k, State{Exists: true, Cursor: 4, Head: 5})
	removed := device.LifeAfter(time.Unix(1_800_000_000, 0))
	c.Removed(k, removed)
	c.Advanced(k, device.Life{}, 6) // the send before the removal
	if st, ok := c.Get(k); !ok || st.Exists || st.Head != 0 || st.Life != removed {
		t.Fatalf("after a late wake of the earlier life: %+v, %v; want removed, head 0", st, ok)
	}
	c.Registered(k, time.Unix(1_800_000_001, 0))
	c.Advanced(k, removed, 1)
	c.Advanced(k, device.Life{}, 7)
	c.Acked(k, device.Life{}, 4) // a poll of the earlier life, late
	if st, _ := c.Get(k); !st.Exists || st.Head != 1 || st.Cursor != 0 {
		t.Fatalf("the next life = %+v, want head 1, cursor 0", st)
	}
}

// TestWakeOfLaterLife: a wake stored after a removal not heard of here is
// taken as that removal: what was known of the earlier life goes, and the
// next use reads the store (Exists false). Merged by maximum instead, the
// new life would inherit the earlier one's cursor and head.
func TestWakeOfLaterLife(t *testing.T) {
	c := New(0)
	filled(t, c, k, State{Exists: true, Cursor: 9, Head: 9})
	later := device.LifeAfter(time.Unix(1_800_000_000, 0))
	c.Advanced(k, later, 1)
	if st, ok := c.Get(k); !ok || st.Exists || st.Cursor != 0 || st.Head != 0 || st.Life != later {
		t.Fatalf("after a wake of a later life: %+v, %v; want the later life, to be read", st, ok)
	}
}

// TestReadOfAnotherLife: a read that comes back with another life than the
// news kept meanwhile is not merged with it.
func TestReadOfAnotherLife(t *testing.T) {
	removed := device.LifeAfter(time.Unix(1_800_000_000, 0))

	c := New(0)
	ticket := c.Begin(k)
	c.Advanced(k, device.Life{}, 9) // news of the earlier life
	got := c.Fill(k, ticket, State{Exists: true, Head: 1, Life: removed})
	if got.Head != 1 || got.Life != removed {
		t.Fatalf("a read of the later life merged with news of the earlier: %+v", got)
	}

	c = New(0)
	ticket = c.Begin(k)
	c.Advanced(k, removed, 2) // news of a life the read did not see
	got = c.Fill(k, ticket, State{Exists: true, Cursor: 7, Head: 8})
	if got.Exists || got.Head != 0 || got.Life != removed {
		t.Fatalf("a read of the earlier life merged with news of the later: %+v", got)
	}
}

// TestAheadOf: the store's word that a cursor is above the head holds for
// AheadFor, and news that moves the head ends it. With HeadRead left set
// when the head moves, this goes red (tried): a cursor the new head covers
// would be refused from memory.
func TestAheadOf(t *testing.T) {
	c := New(0)
	filled(t, c, k, State{Exists: true, Head: 3})
	now := time.Unix(1_800_000_000, 0)
	if st, _ := c.Get(k); st.AheadOf(5, now) {
		t.Fatal("ahead before the store said so")
	}
	c.HeadRead(k, device.Life{}, 3, now)
	st, _ := c.Get(k)
	if !st.AheadOf(5, now.Add(AheadFor/2)) || st.AheadOf(3, now) {
		t.Fatalf("after the store's word: %+v", st)
	}
	if st.AheadOf(5, now.Add(AheadFor)) {
		t.Fatal("the store's word outlived AheadFor")
	}
	c.Advanced(k, device.Life{}, 4)
	if st, _ := c.Get(k); st.AheadOf(5, now) {
		t.Fatal("the store's word outlived news that moved the head")
	}
	c.HeadRead(k, device.Life{}, 3, now) // a read older than the news
	if st, _ := c.Get(k); st.AheadOf(5, now) {
		t.Fatal("a word about an older head was kept")
	}
}

// TestOlderRemovalChangesNothing: news of a removal older than the life
// memory knows (a late echo, a removal heard out of order) leaves the
// device as it stands; so does the same removal told twice once the name
// was registered again. Without the check in Removed this goes red (tried:
// the entry went back to the older life, removed).
func TestOlderRemovalChangesNothing(t *testing.T) {
	c := New(0)
	first := device.LifeAfter(time.Unix(1_800_000_000, 0))
	second := device.LifeAfter(time.Unix(1_800_000_100, 0))
	c.Removed(k, second)
	c.Registered(k, time.Unix(1_800_000_101, 0))
	c.Advanced(k, second, 2)
	for _, life := range []device.Life{first, second} {
		c.Removed(k, life)
		if st, ok := c.Get(k); !ok || !st.Exists || st.Head != 2 || st.Life != second {
			t.Fatalf("after news of the removal %v: %+v, %v; want the registration since, head 2", life, st, ok)
		}
	}
}
