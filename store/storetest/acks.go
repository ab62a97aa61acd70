package storetest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

// ConcurrentAcks runs batches of acks, each naming devices of two
// households in a shuffled order (some twice, some that do not exist),
// beside fan-out sends, device removals and expiry, all on the same
// devices. No call may fail (a deadlock would), every envelope a send
// reported arrives exactly once unless it expired, nothing is left behind
// once everything is acknowledged, and every device's pending counters
// match what it stores. s must be empty.
//
// It is exported so that a backend can also run it on a store with more
// connections than the suite's.
func ConcurrentAcks(t *testing.T, s store.Store) {
	const (
		senders   = 6
		sendsEach = 10
		ackers    = 3
	)
	households := []string{"h1", "h2"}
	live := deviceNames("l", 4)    // fetched and acknowledged by their consumers
	victims := deviceNames("v", 2) // removed and registered again throughout
	type dev struct{ household, name string }
	var lives, all []dev
	for _, h := range households {
		register(t, s, h, live...)
		register(t, s, h, victims...)
		for _, n := range live {
			lives = append(lives, dev{h, n})
		}
		for _, n := range append(slices.Clone(live), victims...) {
			all = append(all, dev{h, n})
		}
	}
	// Old envelopes at the bottom of every live queue, for expiry to take
	// while the rest goes on.
	old, recent := t0, t0.Add(time.Hour)
	for _, h := range households {
		for i := range 3 {
			sendOK(t, s, store.SendParams{Household: h, Sender: "old", ID: strconv.Itoa(i), To: live, Payload: []byte("old"), Now: old})
		}
	}

	var (
		mu       sync.Mutex
		want     = map[dev][]sent{} // what sends reported, live devices only
		got      = map[dev][]sent{}
		consumed = map[dev]int64{} // the highest seq each consumer has read
	)
	sendersDone, stop := make(chan struct{}), make(chan struct{})
	var sendersWG, consumersWG, othersWG sync.WaitGroup

	for g := range senders {
		sendersWG.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 3))
			h := households[g%len(households)]
			from := fmt.Sprintf("s%02d", g)
			for i := range sendsEach {
				id := strconv.Itoa(i)
				to := pickRecipients(r, append(slices.Clone(live), victims...), 4)
				res, err := s.Send(ctx(t), store.SendParams{Household: h, Sender: from, ID: id, To: to, Payload: []byte(from + "/" + id), Now: recent})
				var ue *store.UnknownDeviceError
				if errors.As(err, &ue) && slices.Contains(victims, ue.Device) {
					continue // a victim was away: nothing was stored
				}
				if err != nil {
					t.Errorf("Send %s/%s to %v: %v", from, id, to, err)
					return
				}
				mu.Lock()
				for _, d := range res.Deliveries {
					if slices.Contains(live, d.Device) {
						want[dev{h, d.Device}] = append(want[dev{h, d.Device}], sent{from, id, d.Seq})
					}
				}
				mu.Unlock()
			}
		})
	}

	for _, d := range lives {
		consumersWG.Go(func() {
			var cursor int64
			for {
				var finished bool
				select {
				case <-sendersDone:
					finished = true
				default:
				}
				b, err := s.Fetch(ctx(t), store.FetchParams{Household: d.household, Device: d.name, After: cursor, Limit: 5, Budget: 1 << 20})
				if err != nil {
					t.Errorf("Fetch %v: %v", d, err)
					return
				}
				mu.Lock()
				for _, e := range b.Envelopes {
					if e.Seq <= cursor {
						t.Errorf("%v: seq %d after %d", d, e.Seq, cursor)
					}
					cursor = e.Seq
					got[d] = append(got[d], sent{e.From, e.ID, e.Seq})
				}
				consumed[d] = cursor
				mu.Unlock()
				if len(b.Envelopes) > 0 {
					continue
				}
				if finished {
					return
				}
				select {
				case <-sendersDone:
				case <-time.After(time.Millisecond):
				}
			}
		})
	}

	for g := range ackers {
		othersWG.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 4))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var batch []store.Ack
				mu.Lock()
				for _, d := range lives {
					if c := consumed[d]; r.IntN(3) > 0 {
						batch = append(batch, store.Ack{Household: d.household, Device: d.name, Cursor: c, Seen: recent.Add(time.Duration(i) * time.Second)})
						if c > 0 && r.IntN(2) == 0 {
							// The same device again, lower: it must not win.
							batch = append(batch, store.Ack{Household: d.household, Device: d.name, Cursor: r.Int64N(c)})
						}
					}
				}
				mu.Unlock()
				for _, h := range households {
					for _, v := range victims {
						// Victims' queues are nobody's: any cursor, up to
						// far past the head.
						batch = append(batch, store.Ack{Household: h, Device: v, Cursor: []int64{0, 2, math.MaxInt64}[r.IntN(3)]})
					}
					batch = append(batch, store.Ack{Household: h, Device: "ghost", Cursor: 1, Seen: recent})
				}
				r.Shuffle(len(batch), func(a, b int) { batch[a], batch[b] = batch[b], batch[a] })
				if _, err := s.AckMany(ctx(t), batch); err != nil {
					t.Errorf("AckMany: %v", err)
					return
				}
			}
		})
	}
	othersWG.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			h, v := households[i%2], victims[i/2%2]
			if err := s.DeleteDevice(ctx(t), h, v, recent); err != nil && !errors.Is(err, store.ErrNotFound) {
				t.Errorf("DeleteDevice %s/%s: %v", h, v, err)
				return
			}
			if _, err := s.Register(ctx(t), store.RegisterParams{Household: h, Device: v, Now: recent}); err != nil {
				t.Errorf("Register %s/%s: %v", h, v, err)
				return
			}
			pause(stop)
		}
	})
	othersWG.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Expire(ctx(t), store.ExpireParams{EnvelopesBefore: old.Add(time.Second), SendsBefore: old.Add(time.Second), Batch: 2}); err != nil {
				t.Errorf("Expire: %v", err)
				return
			}
			pause(stop)
		}
	})

	sendersWG.Wait()
	close(sendersDone)
	consumersWG.Wait()
	close(stop)
	othersWG.Wait()
	if t.Failed() {
		return
	}

	for _, d := range lives {
		ws := want[d]
		slices.SortFunc(ws, func(a, b sent) int { return int(a.seq - b.seq) })
		var recentGot []sent
		for _, g := range got[d] {
			if g.from == "old" {
				if g.seq > 3 {
					t.Errorf("%v: an old envelope at seq %d", d, g.seq)
				}
				continue
			}
			recentGot = append(recentGot, g)
		}
		if !slices.Equal(recentGot, ws) {
			t.Errorf("%v: received %v, sends reported %v", d, recentGot, ws)
		}
	}
	// Everything acknowledged, clamped to each head: nothing may be left
	// stored, and the counters must say so.
	var final []store.Ack
	for _, d := range all {
		// Knowing of every removal so far, so that the ack is this life's.
		life := state(t, s, d.household, d.name).Life
		final = append(final, store.Ack{Household: d.household, Device: d.name, Cursor: math.MaxInt64, Life: life})
	}
	ackMany(t, s, final...)
	for _, d := range all {
		st := state(t, s, d.household, d.name)
		if !st.Exists || st.Cursor != st.Head {
			t.Errorf("%v after acknowledging everything: %+v, want cursor at head", d, st)
		}
		if left := fetchAll(t, s, d.household, d.name, 0); len(left) != 0 {
			t.Errorf("%v still stores seqs %v at or below its cursor %d", d, seqs(left), st.Cursor)
		}
		checkPending(t, s, d.household, d.name)
	}
	for _, h := range households {
		if got, wantNames := names(listAll(t, s, h)), append(slices.Clone(live), victims...); !slices.Equal(got, wantNames) {
			t.Errorf("Devices(%s) = %v, want %v: an ack created a device", h, got, wantNames)
		}
	}
}

// pause lets the others run between two rounds of a background loop, and
// ends at once on stop.
func pause(stop <-chan struct{}) {
	select {
	case <-stop:
	case <-time.After(time.Millisecond):
	}
}

// testRefusedAmongMany: many sends at once, one of them refused (a full
// queue). The refused one stores nothing and keeps its id free; every
// other one is stored with dense seqs. A backend that commits sends in
// groups must undo the refused one alone.
func testRefusedAmongMany(t *testing.T, open Opener) {
	const n = 16
	s := fresh(t, open)
	register(t, s, hh, "a", "b", "full")
	sendOK(t, s, store.SendParams{Sender: "x", ID: "fill", To: []string{"full"}, Payload: make([]byte, 1000)})

	start := make(chan struct{})
	results := make([]store.SendResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			p := store.SendParams{Household: hh, Sender: "x", ID: strconv.Itoa(i), To: []string{"a", "b"}, Payload: []byte(strconv.Itoa(i)), Now: t0}
			if i == n/2 {
				p.ID, p.To, p.MaxPendingBytes = "refused", []string{"a", "b", "full"}, 500
			}
			<-start
			results[i], errs[i] = s.Send(ctx(t), p)
		})
	}
	close(start)
	wg.Wait()

	var heads []int64
	for i := range n {
		if i == n/2 {
			if e := isQueueFull(errs[i], "full"); e != nil {
				t.Errorf("the refused send: %v", e)
			}
			continue
		}
		if errs[i] != nil {
			t.Errorf("send %d: %v", i, errs[i])
			continue
		}
		ds := results[i].Deliveries
		if len(ds) != 2 || ds[0].Seq != ds[1].Seq {
			// Every send goes to a and b alike, so each gets the same seq
			// on both.
			t.Errorf("send %d = %s, want the same seq on a and b", i, deliveries(ds))
			continue
		}
		heads = append(heads, ds[0].Seq)
	}
	slices.Sort(heads)
	for i, h := range heads {
		if h != int64(i+1) {
			t.Fatalf("seqs given = %v, want 1 to %d without a gap", heads, n-1)
		}
	}
	for _, d := range []string{"a", "b"} {
		es := fetchAll(t, s, hh, d, 0)
		if len(es) != n-1 {
			t.Errorf("%s stores %d envelopes, want %d", d, len(es), n-1)
		}
		for _, e := range es {
			if e.ID == "refused" {
				t.Errorf("%s stores the refused send", d)
			}
		}
	}
	// Nothing of the refused send was kept, its id included.
	res := sendOK(t, s, store.SendParams{Sender: "x", ID: "refused", To: []string{"a", "b", "full"}, Payload: []byte("again")})
	if res.Repeat || deliveries(res.Deliveries) != fmt.Sprintf("a:%d b:%d full:2", n, n) {
		t.Errorf("the refused id sent again = %s (repeat %v), want a new send a:%d b:%d full:2", deliveries(res.Deliveries), res.Repeat, n, n)
	}
}
