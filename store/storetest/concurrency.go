package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

// sent is one envelope a send promised to a device.
type sent struct {
	from, id string
	seq      int64
}

func testConcurrency(t *testing.T, open Opener) {
	t.Run("FanOut", func(t *testing.T) { testFanOut(t, open) })
	t.Run("RegisterAckRaceSends", func(t *testing.T) { testRaces(t, open) })
	t.Run("FirstContactRace", func(t *testing.T) { testFirstContact(t, open) })
	t.Run("AckManyBesideSendsRemovalsExpiry", func(t *testing.T) { ConcurrentAcks(t, fresh(t, open)) })
	t.Run("RefusedAmongMany", func(t *testing.T) { testRefusedAmongMany(t, open) })
}

// pickRecipients draws 1 to max distinct devices in random order, then
// sorts them, as the relay does before calling Send: the sets overlap and
// come in every order, and the store relies on getting them sorted.
func pickRecipients(r *rand.Rand, devices []string, most int) []string {
	n := 1 + r.IntN(most)
	perm := r.Perm(len(devices))[:n]
	to := make([]string, n)
	for i, j := range perm {
		to[i] = devices[j]
	}
	slices.Sort(to)
	return to
}

func deviceNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

// testFanOut: 50 senders at once, overlapping recipient sets. Every send
// must succeed (no "database is locked", no deadlock), and every recipient
// must then hold each of its envelopes exactly once, at the seq its send
// reported, numbered 1, 2, 3, ... without a gap.
func testFanOut(t *testing.T, open Opener) {
	const senders, sendsEach = 50, 5
	s := fresh(t, open)
	devices := deviceNames("d", 10)
	register(t, s, hh, devices...)

	var mu sync.Mutex
	want := map[string][]sent{}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range senders {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			from := fmt.Sprintf("s%02d", g)
			<-start
			for i := range sendsEach {
				id := strconv.Itoa(i)
				res, err := s.Send(ctx(t), store.SendParams{
					Household: hh, Sender: from, ID: id, To: pickRecipients(r, devices, 6),
					Payload: []byte(from + "/" + id), Now: t0,
				})
				if err != nil {
					t.Errorf("Send %s/%s: %v", from, id, err)
					return
				}
				mu.Lock()
				for _, d := range res.Deliveries {
					want[d.Device] = append(want[d.Device], sent{from, id, d.Seq})
				}
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}

	for _, dev := range devices {
		es := fetchAll(t, s, hh, dev, 0)
		ws := want[dev]
		slices.SortFunc(ws, func(a, b sent) int { return int(a.seq - b.seq) })
		if len(es) != len(ws) {
			t.Errorf("%s: fetched %d envelopes, sends reported %d", dev, len(es), len(ws))
			continue
		}
		for i, e := range es {
			w := ws[i]
			if e.Seq != int64(i+1) || w.seq != e.Seq || e.From != w.from || e.ID != w.id || string(e.Payload) != w.from+"/"+w.id {
				t.Errorf("%s: envelope %d = seq %d %s/%s, want seq %d %s/%s", dev, i, e.Seq, e.From, e.ID, w.seq, w.from, w.id)
				break
			}
		}
		if got := position(t, s, hh, dev).Head; got != int64(len(ws)) {
			t.Errorf("%s: head %d, want %d", dev, got, len(ws))
		}
	}
}

// testRaces: sends race with consumers that fetch and ack, and with
// re-registrations and position reads of the same devices. Nothing may
// fail, every envelope arrives exactly once and in order, and no one ever
// sees a cursor or head move down.
func testRaces(t *testing.T, open Opener) {
	const senders, sendsEach = 10, 6
	s := fresh(t, open)
	devices := deviceNames("r", 6)
	register(t, s, hh, devices...)

	sendersDone := make(chan struct{})
	var mu sync.Mutex
	want := map[string][]sent{}
	got := map[string][]sent{}

	var consumers, others sync.WaitGroup
	for _, dev := range devices {
		consumers.Go(func() {
			var cursor int64
			for {
				// Read done before fetching: an empty fetch after every send
				// has returned means the queue is drained.
				var finished bool
				select {
				case <-sendersDone:
					finished = true
				default:
				}
				b, err := s.Fetch(ctx(t), store.FetchParams{Household: hh, Device: dev, After: cursor, Limit: 7, Budget: 1 << 20})
				if err != nil {
					t.Errorf("Fetch %s: %v", dev, err)
					return
				}
				for _, e := range b.Envelopes {
					if e.Seq != cursor+1 {
						t.Errorf("%s: seq %d after %d: a gap or a repeat", dev, e.Seq, cursor)
						return
					}
					cursor = e.Seq
					mu.Lock()
					got[dev] = append(got[dev], sent{e.From, e.ID, e.Seq})
					mu.Unlock()
				}
				if len(b.Envelopes) > 0 {
					p, err := s.Ack(ctx(t), store.AckParams{Household: hh, Device: dev, Cursor: cursor, Now: t0})
					if err != nil {
						t.Errorf("Ack %s %d: %v", dev, cursor, err)
						return
					}
					if p.Cursor != cursor || p.Head < cursor {
						t.Errorf("Ack %s %d = %+v", dev, cursor, p)
						return
					}
					continue
				}
				if finished {
					return
				}
				// A bounded poll: wake on the senders finishing or soon.
				select {
				case <-sendersDone:
				case <-time.After(time.Millisecond):
				}
			}
		})
	}

	stop := make(chan struct{})
	for g := range 3 {
		others.Go(func() {
			last := map[string]store.Position{}
			targets := []*device.PushTarget{nil, &pushA, &pushB}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				dev := devices[(g+i)%len(devices)]
				d, err := s.Register(ctx(t), store.RegisterParams{Household: hh, Device: dev, Push: targets[i%3], Now: t0.Add(time.Duration(i) * time.Second)})
				if err != nil {
					t.Errorf("Register %s: %v", dev, err)
					return
				}
				p, err := s.Ack(ctx(t), store.AckParams{Household: hh, Device: dev, Cursor: -1, Now: t0})
				if err != nil {
					t.Errorf("Ack %s -1: %v", dev, err)
					return
				}
				prev := last[dev]
				for _, now := range []store.Position{{Cursor: d.Cursor, Head: d.Head}, p} {
					if now.Cursor < prev.Cursor || now.Head < prev.Head || now.Cursor > now.Head {
						t.Errorf("%s went from %+v to %+v", dev, prev, now)
						return
					}
					prev = now
				}
				last[dev] = prev
			}
		})
	}

	var sendersWG sync.WaitGroup
	for g := range senders {
		sendersWG.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 2))
			from := fmt.Sprintf("s%02d", g)
			for i := range sendsEach {
				id := strconv.Itoa(i)
				res, err := s.Send(ctx(t), store.SendParams{
					Household: hh, Sender: from, ID: id, To: pickRecipients(r, devices, 4),
					Payload: []byte(id), Now: t0,
				})
				if err != nil {
					t.Errorf("Send %s/%s: %v", from, id, err)
					return
				}
				mu.Lock()
				for _, d := range res.Deliveries {
					want[d.Device] = append(want[d.Device], sent{from, id, d.Seq})
				}
				mu.Unlock()
			}
		})
	}
	sendersWG.Wait()
	close(sendersDone)
	consumers.Wait()
	close(stop)
	others.Wait()
	if t.Failed() {
		return
	}

	for _, dev := range devices {
		ws, gs := want[dev], got[dev]
		slices.SortFunc(ws, func(a, b sent) int { return int(a.seq - b.seq) })
		if !slices.Equal(ws, gs) {
			t.Errorf("%s: received %v, sends reported %v", dev, gs, ws)
		}
		p := position(t, s, hh, dev)
		if n := int64(len(ws)); p != (store.Position{Cursor: n, Head: n}) {
			t.Errorf("%s: position %+v, want cursor and head %d", dev, p, n)
		}
	}
}

// testFirstContact: a device's first register and first acks arrive at
// once. Exactly one device results, and it works.
func testFirstContact(t *testing.T, open Opener) {
	s := fresh(t, open)
	register(t, s, hh, "sender")
	newbies := deviceNames("n", 4)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		for _, dev := range newbies {
			wg.Go(func() {
				<-start
				var err error
				if g%2 == 0 {
					_, err = s.Register(context.Background(), store.RegisterParams{Household: hh, Device: dev, Push: &pushA, Now: t0})
				} else {
					_, err = s.Ack(context.Background(), store.AckParams{Household: hh, Device: dev, Cursor: -1 + int64(g%4/2), Now: t0})
				}
				if err != nil {
					t.Errorf("first contact of %s: %v", dev, err)
				}
			})
		}
	}
	close(start)
	wg.Wait()

	wantNames := append(slices.Clone(newbies), "sender")
	ds := listAll(t, s, hh)
	if got := names(ds); !slices.Equal(got, wantNames) {
		t.Fatalf("Devices = %v, want %v", got, wantNames)
	}
	for _, d := range ds[:len(newbies)] {
		if d.Push != pushA || d.Cursor != 0 || d.Head != 0 {
			t.Errorf("%s = %+v, want push %+v from its register, cursor and head 0", d.Name, d, pushA)
		}
	}
	res := sendOK(t, s, store.SendParams{Sender: "sender", ID: "hello", To: newbies, Payload: []byte("x")})
	if got := deliveries(res.Deliveries); got != "n00:1 n01:1 n02:1 n03:1" {
		t.Errorf("deliveries %s, want seq 1 for each", got)
	}
}
