package driver

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/epochtest"
	"github.com/flamenet/relay/loadtest/internal/check"
	"github.com/flamenet/relay/loadtest/internal/tally"
)

// testDriver is a driver of pairs against urls, and its tally; with
// changes to its config.
func testDriver(t *testing.T, urls []string, pairs int, with ...func(*Config)) (*Driver, *tally.Tally) {
	t.Helper()
	tl := tally.New(tally.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Payload: 64, Tag: "a1b2c3d4"})
	cfg := Config{Targets: urls, Key: ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)), Tag: "a1b2c3d4",
		Pairs: pairs, Wait: 2, Payload: 64, Codec: "json", Expires: time.Now().Add(time.Hour)}
	for _, f := range with {
		f(&cfg)
	}
	d, err := New(cfg, tl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d, tl
}

// TestPairsCrossReplicas: with two relays every pair's sender is on the
// other relay than its recipient, and each relay holds half the polls.
func TestPairsCrossReplicas(t *testing.T) {
	r, _ := testDriver(t, []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}, 10)
	held := map[string]int{}
	for _, p := range r.pairs {
		if p.sendRelay == p.pollRelay {
			t.Errorf("pair %d sends and polls on %s", p.idx, r.cfg.Targets[p.pollRelay])
		}
		held[r.cfg.Targets[p.pollRelay]]++
	}
	if held["http://127.0.0.1:1"] != 5 || held["http://127.0.0.1:2"] != 5 {
		t.Errorf("polls per relay = %v", held)
	}
	one, _ := testDriver(t, []string{"http://127.0.0.1:1"}, 3)
	for _, p := range one.pairs {
		if p.sendRelay != p.pollRelay {
			t.Errorf("one relay: pair %d spread over two", p.idx)
		}
	}
}

// TestHop: with -hop 1 and three relays a recipient's every poll goes to
// another relay than the one before, and in time to each of them; with
// -hop 0 every poll goes to its own. Sends follow: drawn at random with
// hopping (the same for a campaign's seed), the pair's own relay without.
func TestHop(t *testing.T) {
	const epoch = "AAAAAAAAAAAAAAAA"
	var relays []*epochtest.Relay
	var urls []string
	for range 3 {
		relays = append(relays, epochtest.Start(t, epoch))
		urls = append(urls, relays[len(relays)-1].URL)
	}
	asked := func() []int {
		n := make([]int, len(relays))
		for i, r := range relays {
			n[i] = len(r.Requests())
		}
		return n
	}
	ctx := context.Background()
	for _, hop := range []float64{1, 0} {
		r, _ := testDriver(t, urls, 2, func(c *Config) { c.Hop = hop })
		p := r.pairs[1]
		last, used := p.home, make([]int, len(relays))
		for k := range 60 {
			before := asked()
			if _, err := r.pollOnce(ctx, p, 0); err != nil {
				t.Fatalf("hop %v, poll %d: %v", hop, k, err)
			}
			after, at := asked(), -1
			for i := range relays {
				if after[i] != before[i] {
					if at >= 0 || after[i] != before[i]+1 {
						t.Fatalf("hop %v, poll %d: requests per relay %v, then %v", hop, k, before, after)
					}
					at = i
				}
			}
			switch {
			case at != p.pollRelay:
				t.Errorf("hop %v, poll %d: went to relay %d, recorded as %d", hop, k, at, p.pollRelay)
			case hop == 1 && at == last:
				t.Errorf("hop 1, poll %d: relay %d twice in a row", k, at)
			case hop == 0 && at != p.home:
				t.Errorf("hop 0, poll %d: relay %d, not its own %d", k, at, p.home)
			}
			last = at
			used[at]++
		}
		if hop == 1 && slices.Contains(used, 0) {
			t.Errorf("hop 1: polls per relay %v, want every relay", used)
		}

		sent := make([]int, len(relays))
		for i := range 300 {
			sent[r.sendRelayOf(p, i)]++
		}
		if hop == 0 && sent[p.sendRelay] != 300 || hop == 1 && slices.Contains(sent, 0) {
			t.Errorf("hop %v: sends per relay %v (the pair's own %d)", hop, sent, p.sendRelay)
		}
	}
	seed := uint64(7)
	a, _ := testDriver(t, urls, 2, func(c *Config) { c.Hop, c.Seed = 0.5, &seed })
	b, _ := testDriver(t, urls, 2, func(c *Config) { c.Hop, c.Seed = 0.5, &seed })
	for i := range 50 {
		pa, pb := a.pairs[a.PairOf(i)], b.pairs[b.PairOf(i)]
		if sa, sb := a.sendRelayOf(pa, i), b.sendRelayOf(pb, i); sa != sb {
			t.Fatalf("seed %d: send %d to relay %d, then %d", seed, i, sa, sb)
		}
		ra, rb := nextRelay(pa.hops, pa.pollRelay, len(urls), 0.5), nextRelay(pb.hops, pb.pollRelay, len(urls), 0.5)
		if ra != rb {
			t.Fatalf("seed %d: hop %d of pair %d to relay %d, then %d", seed, i, pa.idx, ra, rb)
		}
		pa.pollRelay, pb.pollRelay = ra, rb
	}
}

// TestRequestTimeoutStreams: a stream run's requests have no client
// Timeout, which would cut every stream at it (seen: all 5,000 streams
// cut together 50 s into a run); a poll run's outlasts a held poll.
func TestRequestTimeoutStreams(t *testing.T) {
	if d := requestTimeout(true, 20); d != 0 {
		t.Errorf("stream run: timeout %v, want none", d)
	}
	if d := requestTimeout(false, 20); d <= 20*time.Second {
		t.Errorf("poll run: timeout %v, not above the 20 s wait", d)
	}
}

// TestResyncAfterRollback: a recipient's poll with the epoch of a store
// whose history went back since is answered 409 cursor_ahead; the tester
// counts it, polls once without cursor and epoch, counts the resync, and
// goes on in the new epoch. The envelope handed again after it is
// redelivered, not a duplicate; the one the rollback took before it
// arrived is lost. With explicit acks, a stale ack resyncs the same way.
func TestResyncAfterRollback(t *testing.T) {
	const epochA, epochB = "AAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBB"
	relay := epochtest.Start(t, epochA)
	r, tl := testDriver(t, []string{relay.URL}, 1)
	p := r.pairs[0]
	tl.Plan(4)
	env := func(i int) epochtest.Envelope {
		return epochtest.Envelope{From: p.sender, ID: tl.SendID(i), Payload: check.Payload(tl.SendID(i), r.cfg.Payload)}
	}
	ctx := context.Background()
	if err := r.registerOne(ctx, p); err != nil || p.epoch != epochA {
		t.Fatalf("register: %v, epoch %q", err, p.epoch)
	}
	// Every send accepted, send i at seq i+1.
	now := time.Now()
	tl.Schedule(func(int) int { return 0 }, func(int) time.Time { return now })
	for i := range 4 {
		tl.Started(i, now, now)
		tl.Answered(ctx, i, 0, client.SendResult{ID: tl.SendID(i), Deliveries: []client.Delivery{{Device: p.recipient, Seq: int64(i + 1)}}}, nil, now, now)
	}
	for i := range 2 {
		e := env(i)
		relay.Add(e.From, e.ID, e.Payload)
	}
	if _, err := r.pollOnce(ctx, p, 0); err != nil || p.cursor != 2 {
		t.Fatalf("poll: %v, cursor %d", err, p.cursor)
	}
	e := env(3)
	relay.Add(e.From, e.ID, e.Payload) // seq 4, lost with the rollback
	// The store keeps seq 1 and 2 but lost the ack of 2; send 2 is stored
	// anew at seq 3.
	relay.Rollback(2, 1, epochB, env(2))
	if _, err := r.pollOnce(ctx, p, 0); err == nil {
		t.Fatal("the poll in the old epoch was answered")
	}
	for range 2 {
		if _, err := r.pollOnce(ctx, p, 0); err != nil {
			t.Fatal(err)
		}
	}
	var res check.Result
	tl.Fill(&res)
	if p.cursor != 3 || p.epoch != epochB || res.CursorAhead != 1 || res.Resyncs != 1 || len(res.Errors) != 0 {
		t.Fatalf("cursor %d epoch %q, cursor_ahead %d, resyncs %d, errors %v", p.cursor, p.epoch, res.CursorAhead, res.Resyncs, res.Errors)
	}
	var sent []string
	for _, q := range relay.Requests() {
		c, e := "-", cmp.Or(q.Epoch, "-")
		if q.Cursor != nil {
			c = strconv.FormatInt(*q.Cursor, 10)
		}
		sent = append(sent, fmt.Sprintf("%s %s %s %d", q.Op, c, e, q.Status))
	}
	want := []string{"poll 0 " + epochA + " 0", "poll 2 " + epochA + " 409", "poll - - 0", "poll 3 " + epochB + " 0"}
	if !slices.Equal(sent, want) {
		t.Errorf("requests\n%q, want\n%q", sent, want)
	}
	v := check.Check(res.Sends, res.Recipients, check.Opts{})
	if v.Delivered != 3 || v.Redelivered != 1 || v.Duplicates != 0 || v.Reordered != 0 || v.Lost != 1 || len(v.Errors) != 0 {
		t.Errorf("verdict %+v", v)
	}

	// Explicit acks: the ack in the old epoch is refused, and the next
	// poll leaves the epoch out.
	r.cfg.Explicit = true
	relay.Rollback(3, 3, epochA)
	r.ack(ctx, p, r.current(p), client.Position{Cursor: 3, Epoch: epochB})
	if _, err := r.pollOnce(ctx, p, 0); err != nil {
		t.Fatal(err)
	}
	reqs := relay.Requests()
	if ack, poll := reqs[len(reqs)-2], reqs[len(reqs)-1]; ack.Op != "ack" || ack.Epoch != epochB || ack.Status != 409 || poll.Cursor != nil || poll.Epoch != "" {
		t.Errorf("ack %+v then poll %+v", ack, poll)
	}
	tl.Fill(&res)
	if p.epoch != epochA || res.CursorAhead != 2 || res.Resyncs != 2 || len(res.Errors) != 0 {
		t.Errorf("epoch %q, cursor_ahead %d, resyncs %d, errors %v", p.epoch, res.CursorAhead, res.Resyncs, res.Errors)
	}
}
