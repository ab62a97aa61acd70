package relay

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/store/sqlite"
	"github.com/flamenet/relay/wake"
	"github.com/flamenet/relay/wake/local"
	wakeredis "github.com/flamenet/relay/wake/redis"
)

// redisHub is a Redis wake hub on url with a channel prefix of the test's
// own, so that hubs of other tests on the server are not heard.
func redisHub(t *testing.T, url, prefix string, pool int) wake.Hub {
	t.Helper()
	client, err := wakeredis.NewClient(url, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hub, err := wakeredis.New(ctx, client, wakeredis.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Close() })
	return hub
}

// replicas serves two relays that share one SQLite store and wake each
// other through Redis at url, as two replicas would.
func replicas(t *testing.T, url string, pool int) (a, b *harness) {
	t.Helper()
	db, err := sqlite.Open(context.Background(), sqlite.Config{Path: filepath.Join(t.TempDir(), "relay.db"), Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	prefix := servicetest.KeyPrefix()
	a = newHarnessWith(t, Deps{Store: db, Hub: redisHub(t, url, prefix, pool)}, nil)
	b = newHarnessWith(t, Deps{Store: db, Hub: redisHub(t, url, prefix, pool)}, nil)
	b.key = a.key
	b.srv.keys = a.srv.keys
	return a, b
}

// TestRedisNoLostWakeup: a send through one replica, committed between a
// poll's first read and its wait on the other, wakes the poll at once (the
// poll waits 5 s; a healthy hub runs no fallback round to hide a lost
// wake). Across replicas the guard is that the hub registers the poll
// locally at Subscribe, before the first read, and hears the device's
// channel from before it is returned: with the local registration moved
// into the first Wait, this went red on its second iteration ("poll
// answered {Cursor:1 More:false Envelopes:[]} after 5.0s: the wake-up was
// lost"), which was tried.
func TestRedisNoLostWakeup(t *testing.T) {
	a, b := replicas(t, servicetest.RedisURL(t), 2)
	testNoLostWakeup(t, b, a, 300)
}

// heldPoll starts a poll on h and returns its answer on a channel.
func heldPoll(h *harness, tok, query string) <-chan pollResponse {
	ch := make(chan pollResponse, 1)
	go func() {
		r, err := h.do(context.Background(), "GET", "/v1/poll?"+query, tok, nil)
		var p pollResponse
		if err != nil || r.status != http.StatusOK {
			h.t.Errorf("poll: %v %d %s", err, r.status, r.body)
		} else {
			r.json(h.t, &p)
		}
		ch <- p
	}()
	return ch
}

// sendAndWait sends one envelope through from to a poll held on at and
// returns how long the poll took to answer after the send was accepted.
func sendAndWait(t *testing.T, from, at *harness, recipient, sender string, cursor int64) time.Duration {
	t.Helper()
	before := at.srv.HeldPolls()
	ch := heldPoll(at, recipient, fmt.Sprintf("cursor=%d&wait=30", cursor))
	eventually(t, "poll held", func() bool { return at.srv.HeldPolls() > before })
	from.send(sender, fmt.Sprint("m", cursor+1), []byte("x"), "phone")
	accepted := time.Now()
	select {
	case p := <-ch:
		if len(p.Envelopes) != 1 || p.Envelopes[0].Seq != cursor+1 {
			t.Fatalf("poll = %+v", p)
		}
		return time.Since(accepted)
	case <-time.After(15 * time.Second):
		t.Fatal("a held poll was not woken within 15 s")
		return 0
	}
}

// TestRedisOutage: with Redis stopped, sends still answer 202 and held
// polls still deliver, by the hub's fallback rounds (one a second);
// nothing is lost; when Redis is back wake-ups are immediate again.
func TestRedisOutage(t *testing.T) {
	rs := servicetest.StartRedis(t)
	a, b := replicas(t, rs.URL(), 2)
	phone := b.register("home", "phone")
	laptop := a.token("home", "laptop")
	var cursor int64

	if d := sendAndWait(t, a, b, phone, laptop, cursor); d > 900*time.Millisecond {
		t.Logf("wake-up with Redis up took %v", d)
	}
	cursor++

	rs.Stop()
	for range 3 {
		d := sendAndWait(t, a, b, phone, laptop, cursor)
		t.Logf("with Redis down, delivered %v after the send", d)
		cursor++
	}

	rs.Start()
	// Immediate again: a wake-up well under the one-second fallback,
	// within a bounded number of tries while the hubs subscribe again.
	deadline := time.Now().Add(20 * time.Second)
	for {
		d := sendAndWait(t, a, b, phone, laptop, cursor)
		cursor++
		if d < 500*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("wake-ups still take %v after Redis came back", d)
		}
	}
	// Nothing lost: sendAndWait checked that each send arrived as the
	// next seq, so every envelope was delivered once and in order; and
	// nothing is left over.
	if p := b.poll(phone, fmt.Sprintf("cursor=%d", cursor)); len(p.Envelopes) != 0 || p.Cursor != cursor {
		t.Fatalf("after the outage: %+v, want cursor %d and nothing waiting", p, cursor)
	}
}

// TestRedisPollsBeyondPool: the Redis pool is no held-poll ceiling. Far
// more polls than it has connections are held on one replica, and a send
// through the other wakes each of them.
func TestRedisPollsBeyondPool(t *testing.T) {
	a, b := replicas(t, servicetest.RedisURL(t), 1)
	const n = 40 // the pool is 1 x GOMAXPROCS
	if n <= maxProcs() {
		t.Skipf("GOMAXPROCS %d too high for this test", maxProcs())
	}
	laptop := a.token("home", "laptop")
	var chans []<-chan pollResponse
	for i := range n {
		tok := b.register("home", fmt.Sprint("d", i))
		chans = append(chans, heldPoll(b, tok, "wait=30"))
	}
	eventually(t, "polls held", func() bool { return b.srv.HeldPolls() == n })
	for i := range n {
		a.send(laptop, fmt.Sprint("m", i), []byte("x"), fmt.Sprint("d", i))
	}
	for i, ch := range chans {
		select {
		case p := <-ch:
			if len(p.Envelopes) != 1 {
				t.Fatalf("d%d: %+v", i, p)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("d%d not delivered", i)
		}
	}
}

// TestPostgresUnreachable: with Postgres unreachable, sends and polls that
// need the store answer 503 unavailable with Retry-After (no hang, no 500),
// /ready says 503, the relay drops what it remembers of devices (the store
// may be another once it answers again: a failover), so that a known
// device's poll needs the store too, and the relay recovers by itself.
func TestPostgresUnreachable(t *testing.T) {
	px, viaProxy := postgresBehindProxy(t)
	h, _ := pgHarness(t, viaProxy, 4, func(c *Config) { c.StoreTimeout = 2 * time.Second })
	phone := h.register("home", "phone")
	h.send(phone, "before", []byte("x"), "phone")
	h.must("POST", "/v1/ack", phone, `{"cursor":1}`, http.StatusNoContent)

	// A device the relay has not seen yet: its poll needs the store.
	tablet := h.token("home", "tablet")
	px.Cut()
	for _, req := range []struct{ method, path, tok, body string }{
		{"POST", "/v1/send", phone, `{"id":"during","to":["phone"],"payload":"eA=="}`},
		{"GET", "/v1/poll?cursor=0&wait=5", tablet, ""},
		{"POST", "/v1/register", phone, ""},
	} {
		start := time.Now()
		r, err := h.do(context.Background(), req.method, req.path, req.tok, req.body)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != http.StatusServiceUnavailable || r.errCode(t) != codeUnavailable || r.header.Get("Retry-After") == "" {
			t.Fatalf("%s %s with Postgres gone: %d %v %s", req.method, req.path, r.status, r.header, r.body)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("%s took %v", req.path, d)
		}
	}
	h.must("GET", "/ready", "", nil, http.StatusServiceUnavailable)
	eventually(t, "a known device's poll needing the store", func() bool {
		r, err := h.do(context.Background(), "GET", "/v1/poll?cursor=1", phone, nil)
		return err == nil && r.status == http.StatusServiceUnavailable
	})

	px.Restore()
	eventually(t, "ready again", func() bool {
		r, err := h.do(context.Background(), "GET", "/ready", "", nil)
		return err == nil && r.status == http.StatusOK
	})
	eventually(t, "sends accepted again", func() bool {
		r, err := h.do(context.Background(), "POST", "/v1/send", phone, `{"id":"after","to":["phone"],"payload":"eA=="}`)
		return err == nil && r.status == http.StatusAccepted
	})
	p := h.poll(phone, "")
	if len(p.Envelopes) != 1 || p.Envelopes[0].ID != "after" {
		t.Fatalf("after recovery: %+v (the ack before the outage covers \"before\")", p)
	}
}

// postgresBehindProxy is a throwaway database reached through a proxy the
// test can cut: the proxy, and the database's URL through it.
func postgresBehindProxy(t *testing.T) (*servicetest.Proxy, string) {
	t.Helper()
	dbURL := servicetest.PostgresDatabase(t)
	target, err := urlWithHost(dbURL, "")
	if err != nil {
		t.Fatal(err)
	}
	px := servicetest.NewProxy(t, target)
	viaProxy, err := urlWithHost(dbURL, px.Addr)
	if err != nil {
		t.Fatal(err)
	}
	return px, viaProxy
}

// urlWithHost returns rawURL's host:port, or rawURL with its host replaced
// when host is not empty.
func urlWithHost(rawURL, host string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	if host == "" {
		return u.Host, nil
	}
	u.Host = host
	return u.String(), nil
}

func newLocalHub() wake.Hub { return local.New(nil) }

func maxProcs() int { return runtime.GOMAXPROCS(0) }

// TestMovedDeviceReadAgain: what a relay learned of a device from wake-ups
// is not trusted once it stopped hearing the device. The phone polls on a,
// moves to b (a leaves its channel), is sent an envelope through b that a
// never hears of, and comes back to a without acknowledging it: a reads
// the store and hands it over at once, rather than waiting on a head it
// remembers from before.
//
// Guard: the hub tells memory to forget the device when its subscription
// is confirmed again. Broken on purpose once (no Forget), this went red:
// the poll on a waited out its 5 s and answered nothing.
func TestMovedDeviceReadAgain(t *testing.T) {
	a, b := replicas(t, servicetest.RedisURL(t), 2)
	phone := a.register("home", "phone")
	laptop := a.register("home", "laptop")
	key := device.Key{Household: "home", Device: "phone"}

	held := heldPoll(a, phone, "cursor=0&wait=10")
	eventually(t, "the phone's poll held on a", func() bool { return a.srv.hub.Held(key) })
	a.send(laptop, "1", []byte("one"), "phone")
	if p := <-held; len(p.Envelopes) != 1 || p.Cursor != 1 {
		t.Fatalf("first poll = %+v", p)
	}

	held = heldPoll(b, phone, "cursor=1&wait=10")
	eventually(t, "a leaves the phone's channel", func() bool { return b.srv.hub.Held(key) && !a.srv.hub.Hears(key) })
	b.send(laptop, "2", []byte("two"), "phone")
	if p := <-held; len(p.Envelopes) != 1 || p.Envelopes[0].ID != "2" {
		t.Fatalf("poll on b = %+v", p)
	}

	// Back on a, "2" unacknowledged.
	if p := a.poll(phone, "cursor=1&wait=5"); len(p.Envelopes) != 1 || p.Envelopes[0].ID != "2" {
		t.Fatalf("poll back on a = %+v, want envelope 2 at once", p)
	}
}
