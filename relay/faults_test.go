package relay

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flamenet/relay/internal/fleet"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/store/postgres"
	"github.com/flamenet/relay/store/sqlite"
)

// pgHarness serves a relay on a throwaway Postgres database (through url,
// which may be a proxy's) with a pool of conns.
func pgHarness(t testing.TB, url string, conns int32, mutate func(*Config)) (*harness, *postgres.DB) {
	t.Helper()
	st, err := postgres.Open(context.Background(), postgres.Config{URL: url, MaxConns: conns, LockTimeout: DefaultConfig().LockTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return newHarnessWith(t, Deps{Store: st, Hub: newLocalHub()}, mutate), st
}

// timedSend sends one envelope and reports its status and how long the
// answer took.
func timedSend(h *harness, tok, id string, to ...string) (int, time.Duration) {
	start := time.Now()
	r, err := h.do(context.Background(), "POST", "/v1/send", tok, map[string]any{"id": id, "to": to, "payload": []byte("x")})
	if err != nil {
		return 0, time.Since(start)
	}
	return r.status, time.Since(start)
}

// TestLockedDeviceDoesNotSpread: while a client of the database holds a
// device's row (SELECT ... FOR UPDATE in an open transaction, as a frozen
// replica or an operator's session would), sends to that device answer 503
// with Retry-After within about the lock timeout, and sends of another
// household through the same relay and pool are not held up.
//
// Two guards, each broken once: without the per-device gate (gates.enter)
// the held device's sends took every pooled connection and the other
// household's p99 went to 1.0 s; with a lock timeout of a minute the held
// device's sends took the whole store timeout.
func TestLockedDeviceDoesNotSpread(t *testing.T) {
	dbURL := servicetest.PostgresDatabase(t)
	h, _ := pgHarness(t, dbURL, 8, func(c *Config) { c.StoreTimeout = 5 * time.Second })
	held := h.register("home", "held")
	other := h.register("away", "other")

	holder, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	tx, err := holder.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), `SELECT * FROM devices WHERE household = 'home' AND name = 'held' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var heldTimes []time.Duration
	for w := range 12 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				status, d := timedSend(h, held, fmt.Sprintf("held-%d-%d", w, i), "held")
				if status != http.StatusServiceUnavailable {
					t.Errorf("send to the held device: %d, want 503", status)
					return
				}
				mu.Lock()
				heldTimes = append(heldTimes, d)
				mu.Unlock()
			}
		})
	}
	var otherTimes []time.Duration
	for i := range 40 {
		status, d := timedSend(h, other, fmt.Sprint("other-", i), "other")
		if status != http.StatusAccepted {
			t.Fatalf("send of another household while a device is held: %d", status)
		}
		otherTimes = append(otherTimes, d)
	}
	close(stop)
	wg.Wait()
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	slices.Sort(otherTimes)
	if p99 := otherTimes[len(otherTimes)*99/100]; p99 > time.Second {
		t.Errorf("the other household's send p99 = %v while a device was held (all: %v)", p99, otherTimes)
	}
	slices.Sort(heldTimes)
	if len(heldTimes) == 0 || heldTimes[len(heldTimes)-1] > h.srv.cfg.LockTimeout+2*time.Second {
		t.Errorf("sends to the held device took up to %v", heldTimes)
	}
	// Nothing was lost: the other household got all 40, and the held
	// device takes sends again.
	if p := h.poll(other, "limit=1000"); len(p.Envelopes) != 40 {
		t.Errorf("the other household received %d of 40", len(p.Envelopes))
	}
	h.send(held, "after", []byte("x"), "held")
}

// TestPassingStoreErrorsAre503: a database that turned read-only (a
// standby after a failover) or lost the relay's tables (recreated empty)
// answers sends with 503 and Retry-After, not 500, and /ready says it is
// not ready. Before, both were 500 internal, and /ready stayed 200.
func TestPassingStoreErrorsAre503(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ []string
	}{
		{"read-only", []string{`ALTER DATABASE %s SET default_transaction_read_only = on`}},
		{"tables gone", []string{`DROP TABLE envelopes CASCADE`, `DROP FUNCTION relay_send`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dbURL := servicetest.PostgresDatabase(t)
			h, _ := pgHarness(t, dbURL, 4, nil)
			tok := h.register("home", "phone")
			h.send(tok, "before", []byte("x"), "phone")
			admin, err := pgx.Connect(context.Background(), dbURL)
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(context.Background())
			var db string
			if err := admin.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
				t.Fatal(err)
			}
			for _, q := range tc.break_ {
				if strings.Contains(q, "%s") {
					q = fmt.Sprintf(q, pgx.Identifier{db}.Sanitize())
				}
				if _, err := admin.Exec(context.Background(), q); err != nil {
					t.Fatal(err)
				}
			}
			// Sessions opened from now on see the change.
			if _, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db); err != nil {
				t.Fatal(err)
			}
			eventually(t, "sends answered 503", func() bool {
				r, err := h.do(context.Background(), "POST", "/v1/send", tok, map[string]any{"id": "during", "to": []string{"phone"}, "payload": []byte("x")})
				if err != nil {
					return false
				}
				if r.status >= 500 && r.status != http.StatusServiceUnavailable {
					t.Fatalf("send: %d %s", r.status, r.body)
				}
				return r.status == http.StatusServiceUnavailable && r.header.Get("Retry-After") != ""
			})
			eventually(t, "/ready 503", func() bool {
				r, err := h.do(context.Background(), "GET", "/ready", "", nil)
				return err == nil && r.status == http.StatusServiceUnavailable
			})
		})
	}
}

// TestRetryAfterLostAnswerWakes: a send whose commit reached Postgres but
// whose answer was lost (the relay answered 503 and woke nobody) is retried
// by its client with the same id; the retry gets the stored answer (202)
// and wakes the recipient's held poll at once, as a first send would.
// Before, a repeat woke nobody, and the poll waited out its wait.
func TestRetryAfterLostAnswerWakes(t *testing.T) {
	px, viaProxy := postgresBehindProxy(t)
	// One pooled connection, and no background writes meanwhile: the send
	// is the only thing the proxy carries when it loses an answer.
	h, st := pgHarness(t, viaProxy, 1, func(c *Config) { c.AckInterval = time.Minute })
	phone := h.register("home", "phone")
	laptop := h.register("home", "laptop")
	// A first send prepares the send's statement on the connection, so
	// that the answer lost below is the commit's, not the prepare's.
	h.send(laptop, "warm", []byte("x"), "phone")
	held := heldPoll(h, phone, "cursor=1&wait=30")
	eventually(t, "the poll held", func() bool { return h.srv.HeldPolls() == 1 })

	px.LoseNextAnswer()
	if status, _ := timedSend(h, laptop, "lost", "phone"); status != http.StatusServiceUnavailable {
		t.Fatalf("send whose answer was lost: %d, want 503", status)
	}
	if s, err := st.State(context.Background(), "home", "phone"); err != nil || s.Head != 2 {
		t.Fatalf("the lost send was not committed (%+v, %v): the test lost the wrong answer", s, err)
	}
	select {
	case p := <-held:
		t.Fatalf("the poll answered %+v before the retry: the test did not lose the wake-up", p)
	case <-time.After(500 * time.Millisecond):
	}
	retried := time.Now()
	res := h.send(laptop, "lost", []byte("x"), "phone")
	if len(res.Deliveries) != 1 || res.Deliveries[0].Seq != 2 {
		t.Fatalf("retry = %+v, want the first answer", res)
	}
	select {
	case p := <-held:
		if len(p.Envelopes) != 1 || p.Envelopes[0].ID != "lost" {
			t.Fatalf("poll = %+v", p)
		}
		if d := time.Since(retried); d > 2*time.Second {
			t.Fatalf("the poll answered %v after the retry", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the retry woke nobody")
	}
}

// fleetReplicas serves two relays as two replicas of one fleet (the fleet's
// health reports on), sharing one SQLite store and the Redis at redisURL;
// a reaches it at aRedisURL (a proxy's, say), b directly.
func fleetReplicas(t *testing.T, aRedisURL, redisURL string) (a, b *harness) {
	t.Helper()
	db, err := sqlite.Open(context.Background(), sqlite.Config{Path: filepath.Join(t.TempDir(), "relay.db"), Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	prefix := servicetest.KeyPrefix()
	fleet := func(c *Config) { c.RelayReplicas = 2 }
	a = newHarnessWith(t, Deps{Store: db, Hub: redisHub(t, aRedisURL, prefix, 2)}, fleet)
	b = newHarnessWith(t, Deps{Store: db, Hub: redisHub(t, redisURL, prefix, 2)}, fleet)
	b.key, b.srv.keys = a.key, a.srv.keys
	return a, b
}

// fallbackBound is how late a delivery may be while wake-ups are lost: the
// troubled relay notices (heartbeat timeout, 1 s), reports it (a fleet
// round, 1 s), the other relay reads it (1 s) and runs a fallback round
// (1 s); plus a margin for a busy machine.
const fallbackBound = 6 * time.Second

// acrossWithin holds a poll on at from cursor i, sends envelope i+1 through
// from, and fails unless the poll gets it within bound of the send's 202.
// It returns how long the send took.
func acrossWithin(t *testing.T, from, at *harness, sender, recipient string, i int, bound time.Duration) time.Duration {
	t.Helper()
	held := heldPoll(at, recipient, fmt.Sprintf("cursor=%d&wait=30", i))
	eventually(t, "the poll held", func() bool { return at.srv.HeldPolls() == 1 })
	status, took := timedSend(from, sender, fmt.Sprint("m", i), "phone")
	if status != http.StatusAccepted {
		t.Fatalf("send %d: %d", i, status)
	}
	sent := time.Now()
	select {
	case p := <-held:
		if len(p.Envelopes) != 1 || p.Envelopes[0].Seq != int64(i+1) {
			t.Fatalf("poll = %+v", p)
		}
		if d := time.Since(sent); d > bound {
			t.Fatalf("send %d reached the poll on the other relay %v after it was accepted", i, d)
		}
	case <-time.After(25 * time.Second):
		t.Fatalf("send %d never reached the poll on the other relay", i)
	}
	return took
}

// TestSickReplica: one relay loses Redis (its connection is cut; the
// others' is fine). Its sends still reach polls held on the other relay
// within fallbackBound, through the store's health reports and the other
// relay's fallback rounds; after fleet.SickAfter it says it is not ready while
// the other stays ready; when Redis is back it is ready again. Before, the
// other relay never learned of the lost wake-ups and its polls waited out
// their whole wait; with the fleet's Degrade call removed, this went red
// the same way ("never reached the poll on the other relay"), which was
// tried.
func TestSickReplica(t *testing.T) {
	rs := servicetest.StartRedis(t)
	px := servicetest.NewProxy(t, rs.Addr())
	a, b := fleetReplicas(t, "redis://"+px.Addr+"/0", rs.URL())
	phone := b.register("home", "phone")
	laptop := a.register("home", "laptop")

	px.Cut()
	cut := time.Now()
	for i := range 3 {
		acrossWithin(t, a, b, laptop, phone, i, fallbackBound)
	}
	eventually(t, "the sick relay not ready", func() bool {
		r, err := a.do(context.Background(), "GET", "/ready", "", nil)
		return err == nil && r.status == http.StatusServiceUnavailable
	})
	if d := time.Since(cut); d < fleet.SickAfter {
		t.Fatalf("the sick relay said not ready %v after the cut, before fleet.SickAfter", d)
	}
	b.must("GET", "/ready", "", nil, http.StatusOK)
	px.Restore()
	eventually(t, "the relay ready again", func() bool {
		r, err := a.do(context.Background(), "GET", "/ready", "", nil)
		return err == nil && r.status == http.StatusOK
	})
}

// TestPausedRedis: with Redis stopped in its tracks (SIGSTOP: connections
// stay open and nothing answers), sends answer quickly without waiting on
// Redis, and polls held on the other relay get them within fallbackBound;
// when Redis resumes, wake-ups are prompt again. Before, sends waited up
// to a second on Redis and deliveries came up to 13 s late.
func TestPausedRedis(t *testing.T) {
	rs := servicetest.StartRedis(t)
	a, b := fleetReplicas(t, rs.URL(), rs.URL())
	phone := b.register("home", "phone")
	laptop := a.register("home", "laptop")

	rs.Pause()
	paused := true
	defer func() {
		if paused {
			rs.Resume()
		}
	}()
	var sendTimes []time.Duration
	for i := range 4 {
		sendTimes = append(sendTimes, acrossWithin(t, a, b, laptop, phone, i, fallbackBound))
	}
	if slices.Max(sendTimes) > 750*time.Millisecond {
		t.Fatalf("sends took %v with Redis paused", sendTimes)
	}
	rs.Resume()
	paused = false
	for _, h := range []*harness{a, b} {
		eventually(t, "wake-ups healthy again", func() bool { return h.srv.hub.(fleet.Hub).Health() == nil })
	}
	if d := sendAndWait(t, a, b, phone, laptop, 4); d > time.Second {
		t.Fatalf("after Redis resumed, a wake-up took %v", d)
	}
}

// slowStore makes State and Send each take most of a store timeout.
type slowStore struct {
	store.Store
	delay time.Duration
}

func (s slowStore) pause(ctx context.Context) error {
	select {
	case <-time.After(s.delay):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s slowStore) State(ctx context.Context, household, device string) (store.DeviceState, error) {
	if err := s.pause(ctx); err != nil {
		return store.DeviceState{}, err
	}
	return s.Store.State(ctx, household, device)
}

// Removals fails: with the list of removals never read, a sender's first
// request reads its device's removal from the store.
func (s slowStore) Removals(context.Context, int) ([]store.Removal, error) {
	return nil, store.ErrUnavailable
}

func (s slowStore) Send(ctx context.Context, p store.SendParams) (store.SendResult, error) {
	if err := s.pause(ctx); err != nil {
		return store.SendResult{}, err
	}
	return s.Store.Send(ctx, p)
}

// TestStoreDeadlinePerRequest: the store calls of one request share one
// FN_STORE_TIMEOUT: a sender's first request (its removal read) and its
// send, each taking 70% of the timeout, answer 503, not 202 after 140% of
// it. Without the request's budget each call had its own timeout (tried:
// 202).
func TestStoreDeadlinePerRequest(t *testing.T) {
	base := newHarness(t, nil)
	base.register("home", "phone")
	h := newHarnessWith(t, Deps{Store: slowStore{Store: base.db, delay: 700 * time.Millisecond}, Hub: newLocalHub()},
		func(c *Config) { c.StoreTimeout = time.Second })
	h.key, h.srv.keys = base.key, base.srv.keys
	laptop := h.token("home", "laptop") // not seen by this relay: its removal is read first
	r, err := h.do(context.Background(), "POST", "/v1/send", laptop, map[string]any{"id": "1", "to": []string{"phone"}, "payload": []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusServiceUnavailable || r.errCode(t) != codeUnavailable {
		t.Fatalf("a send whose store calls took 1.4 s of a 1 s budget: %d %s", r.status, r.body)
	}
}
