package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flamenet/relay/store"
)

var t0 = time.Date(2026, 11, 29, 18, 2, 3, 123456000, time.UTC)

func register(tb testing.TB, db *DB, household string, devices ...string) {
	tb.Helper()
	for _, d := range devices {
		if _, err := db.Register(testCtx(tb), store.RegisterParams{Household: household, Device: d, Now: t0}); err != nil {
			tb.Fatalf("Register(%s/%s): %v", household, d, err)
		}
	}
}

// answer prints a send's deliveries as "device:seq ...".
func answer(res store.SendResult) string {
	var b strings.Builder
	for i, d := range res.Deliveries {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%d", d.Device, d.Seq)
	}
	return b.String()
}

// checkCounters compares every device's pending counters with the
// envelopes actually stored for it.
func checkCounters(tb testing.TB, db *DB) {
	tb.Helper()
	rows, err := db.pool.Query(testCtx(tb), `
SELECT d.household, d.name, d.pending_count, d.pending_bytes,
       count(e.seq), coalesce(sum(e.size), 0)
FROM devices d LEFT JOIN envelopes e ON e.household = d.household AND e.device = d.name
GROUP BY d.household, d.name, d.pending_count, d.pending_bytes`)
	if err != nil {
		tb.Fatalf("counters: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			h, d                  string
			pending, pendingBytes int64
			stored, storedBytes   int64
		)
		if err := rows.Scan(&h, &d, &pending, &pendingBytes, &stored, &storedBytes); err != nil {
			tb.Fatalf("counters: %v", err)
		}
		if pending != stored || pendingBytes != storedBytes {
			tb.Errorf("%s/%s: counters say %d envelopes, %d bytes; %d, %d are stored", h, d, pending, pendingBytes, stored, storedBytes)
		}
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("counters: %v", err)
	}
}

// TestConcurrentFanOut has 50 senders fan out to overlapping recipients,
// each naming them in its own random order, while one poller per device
// fetches and acks. No send may fail (in particular with a deadlock,
// SQLSTATE 40P01), every envelope arrives exactly once, and each device's
// seqs run 1, 2, 3, ... without a gap.
//
// The guard is the one lock order: with the recipients locked in the
// caller's order instead of by name, this test failed with 40P01 deadlocks
// (checked once by hand).
func TestConcurrentFanOut(t *testing.T) {
	const (
		senders       = 50
		sendsEach     = 12
		devices       = 10
		maxRecipients = 6
	)
	db := openDB(t, 10)
	names := make([]string, devices)
	for i := range names {
		names[i] = fmt.Sprintf("d%02d", i)
	}
	register(t, db, "home", names...)

	type sent struct {
		id, sender string
		to         []string
		res        store.SendResult
	}
	var (
		mu      sync.Mutex
		all     []sent
		wakes   = make(map[string]chan struct{}, devices)
		stop    = make(chan struct{})
		sendsWG sync.WaitGroup
		pollWG  sync.WaitGroup
	)
	for _, n := range names {
		wakes[n] = make(chan struct{}, 1)
	}
	ctx := testCtx(t)

	errs := make(chan error, senders+devices)
	for s := range senders {
		sendsWG.Add(1)
		go func() {
			defer sendsWG.Done()
			rng := rand.New(rand.NewPCG(uint64(s), 7))
			sender := fmt.Sprintf("s%02d", s)
			for i := range sendsEach {
				to := slices.Clone(names)
				rng.Shuffle(len(to), func(a, b int) { to[a], to[b] = to[b], to[a] })
				to = to[:2+rng.IntN(maxRecipients-1)]
				id := fmt.Sprintf("%s-%d", sender, i)
				res, err := db.Send(ctx, store.SendParams{
					Household: "home", Sender: sender, ID: id, To: to,
					Payload: []byte(id), Now: t0,
				})
				if err != nil {
					var pgErr *pgconn.PgError
					if errors.As(err, &pgErr) && pgErr.Code == codeDeadlock {
						err = fmt.Errorf("deadlock: %w", err)
					}
					errs <- fmt.Errorf("send %s to %v: %w", id, to, err)
					return
				}
				mu.Lock()
				all = append(all, sent{id: id, sender: sender, to: to, res: res})
				mu.Unlock()
				for _, d := range to {
					select {
					case wakes[d] <- struct{}{}:
					default:
					}
				}
			}
		}()
	}

	got := make(map[string][]store.Envelope, devices)
	for _, n := range names {
		pollWG.Add(1)
		go func() {
			defer pollWG.Done()
			var cursor int64
			var mine []store.Envelope
			defer func() {
				mu.Lock()
				got[n] = mine
				mu.Unlock()
			}()
			stopping := false
			for {
				b, err := db.Fetch(ctx, store.FetchParams{Household: "home", Device: n, After: cursor, Limit: 7, Budget: 1 << 20})
				if err != nil {
					errs <- fmt.Errorf("fetch %s: %w", n, err)
					return
				}
				mine = append(mine, b.Envelopes...)
				if len(b.Envelopes) > 0 {
					cursor = b.Envelopes[len(b.Envelopes)-1].Seq
					if _, err := db.Ack(ctx, store.AckParams{Household: "home", Device: n, Cursor: cursor, Now: t0}); err != nil {
						errs <- fmt.Errorf("ack %s: %w", n, err)
						return
					}
					continue
				}
				if stopping {
					return // drained after every send returned
				}
				select {
				case <-wakes[n]:
				case <-stop:
					stopping = true
				}
			}
		}()
	}

	sendsWG.Wait()
	close(stop)
	pollWG.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}

	// Every send reached each of its recipients once, with the seq its
	// answer named.
	want := make(map[string]map[int64]string, devices) // device -> seq -> id
	for _, n := range names {
		want[n] = make(map[int64]string)
	}
	for _, s := range all {
		sorted := slices.Sorted(slices.Values(s.to))
		if len(s.res.Deliveries) != len(sorted) {
			t.Fatalf("send %s: %d deliveries for %d recipients", s.id, len(s.res.Deliveries), len(sorted))
		}
		for i, d := range s.res.Deliveries {
			if d.Device != sorted[i] {
				t.Fatalf("send %s: delivery %d is for %s, want %s (sorted)", s.id, i, d.Device, sorted[i])
			}
			if prev, dup := want[d.Device][d.Seq]; dup {
				t.Fatalf("%s seq %d given to both %s and %s", d.Device, d.Seq, prev, s.id)
			}
			want[d.Device][d.Seq] = s.id
		}
	}
	total := 0
	for _, n := range names {
		es := got[n]
		total += len(es)
		if len(es) != len(want[n]) {
			t.Errorf("%s received %d envelopes, want %d", n, len(es), len(want[n]))
		}
		for i, e := range es {
			if e.Seq != int64(i+1) {
				t.Errorf("%s: envelope %d has seq %d, want %d (consecutive)", n, i, e.Seq, i+1)
				break
			}
			if id := want[n][e.Seq]; e.ID != id || string(e.Payload) != id {
				t.Errorf("%s seq %d: got send %q payload %q, want %q", n, e.Seq, e.ID, e.Payload, id)
			}
		}
	}
	if len(all) != senders*sendsEach {
		t.Errorf("%d sends answered, want %d", len(all), senders*sendsEach)
	}
	t.Logf("%d sends, %d envelopes delivered", len(all), total)
	checkCounters(t, db)
}

// TestSendLocksOnlyItsRecipients holds one device's row as a long send
// would: a send to another device goes through at once, a send to the held
// one waits (and gives up with ErrUnavailable when its ctx ends, storing
// nothing and spending no seq).
func TestSendLocksOnlyItsRecipients(t *testing.T) {
	db := openDB(t, 4)
	register(t, db, "home", "a", "b")
	ctx := testCtx(t)

	holder := schemaConn(t, db)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM devices WHERE household = 'home' AND name = 'a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	res, err := db.Send(ctx, store.SendParams{Household: "home", Sender: "x", ID: "to-b", To: []string{"b"}, Payload: []byte("x"), Now: t0})
	if err != nil {
		t.Fatalf("send to b while a is held: %v", err)
	}
	if res.Deliveries[0].Seq != 1 {
		t.Errorf("b seq = %d, want 1", res.Deliveries[0].Seq)
	}

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = db.Send(short, store.SendParams{Household: "home", Sender: "x", ID: "to-ab", To: []string{"a", "b"}, Payload: []byte("x"), Now: t0})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("send to held a = %v, want ErrUnavailable once its ctx ends", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("send gave up after %v, want about its 300ms deadline", d)
	}

	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = db.Send(ctx, store.SendParams{Household: "home", Sender: "x", ID: "to-ab", To: []string{"a", "b"}, Payload: []byte("x"), Now: t0})
	if err != nil {
		t.Fatalf("send to a after release: %v", err)
	}
	if got := answer(res); res.Repeat || got != "a:1 b:2" {
		t.Errorf("after release: %s (repeat %v), want a:1 b:2, not a repeat: the cancelled send stored nothing", got, res.Repeat)
	}
	checkCounters(t, db)
}

// TestConcurrentIdenticalSends sends the same send from many goroutines at
// once: one stores it, every other gets the same answer as a repeat.
//
// The guard is ON CONFLICT DO NOTHING on the claim: with a plain INSERT in
// its place, this test failed with unique violations (checked once by
// hand).
func TestConcurrentIdenticalSends(t *testing.T) {
	const n = 12
	db := openDB(t, n)
	register(t, db, "home", "a", "b", "c")
	ctx := testCtx(t)

	p := store.SendParams{Household: "home", Sender: "a", ID: "same", To: []string{"b", "c"}, Payload: []byte("once"), Now: t0}
	results := make([]store.SendResult, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = db.Send(ctx, p)
		}()
	}
	close(start)
	wg.Wait()

	firsts := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("send %d: %v", i, errs[i])
		}
		if !results[i].Repeat {
			firsts++
		}
		if got := answer(results[i]); got != "b:1 c:1" {
			t.Errorf("send %d answered %s, want b:1 c:1", i, got)
		}
	}
	if firsts != 1 {
		t.Errorf("%d sends stored it, want exactly 1", firsts)
	}
	for _, d := range []string{"b", "c"} {
		b, err := db.Fetch(ctx, store.FetchParams{Household: "home", Device: d, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Envelopes) != 1 {
			t.Errorf("%s holds %d envelopes, want 1", d, len(b.Envelopes))
		}
	}
}
