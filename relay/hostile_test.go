package relay

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flamenet/relay/internal/ready"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/token"
)

// rawRequest writes head (a request line and headers, without the blank
// line that ends them) on a fresh connection, then body (which may be
// shorter than what head declares), reads the response's status, and
// reports how long the server took to close the connection after it.
func rawRequest(t *testing.T, h *harness, head, body string, within time.Duration) (status int, closedAfter time.Duration, err error) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	if _, err := io.WriteString(c, head+"\r\nHost: relay\r\n\r\n"+body); err != nil {
		return 0, 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(within))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("reading the response: %w", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	answered := time.Now()
	// The server must close the connection: nothing more will come.
	if _, err := io.Copy(io.Discard, br); err != nil {
		return resp.StatusCode, 0, fmt.Errorf("connection still open %v after the answer: %w", time.Since(answered).Round(time.Millisecond), err)
	}
	return resp.StatusCode, time.Since(answered), nil
}

// TestUnreadBodyClosesConnection: a request that declares a body and never
// sends it, on a path that answers without reading it (401, 404, 405,
// /live, /ready), is answered and its connection closed at once, however
// many of them there are. Before the guard (a read deadline on every
// request with a body, and "Connection: close" when a handler answered
// without reading it), net/http waited with no deadline to discard the
// body, and each such connection stayed open for ever.
func TestUnreadBodyClosesConnection(t *testing.T) {
	h := newHarness(t, nil)
	heads := []struct {
		name, head string
		status     int
	}{
		{"401 content-length", "POST /v1/send HTTP/1.1\r\nContent-Length: 1000", 401},
		{"401 chunked", "POST /v1/send HTTP/1.1\r\nTransfer-Encoding: chunked", 401},
		{"404", "POST /nowhere HTTP/1.1\r\nContent-Length: 1000", 404},
		{"405", "POST /live HTTP/1.1\r\nContent-Length: 1000", 405},
		{"live", "GET /live HTTP/1.1\r\nContent-Length: 1000", 200},
		{"ready", "GET /ready HTTP/1.1\r\nContent-Length: 1000", 200},
		{"ready chunked", "GET /ready HTTP/1.1\r\nTransfer-Encoding: chunked", 200},
	}
	const perHead = 40 // 280 connections at once
	var wg sync.WaitGroup
	for _, tc := range heads {
		for range perHead {
			wg.Go(func() {
				status, closed, err := rawRequest(t, h, tc.head, "", 5*time.Second)
				if err != nil || status != tc.status {
					t.Errorf("%s: status %d, %v", tc.name, status, err)
					return
				}
				if closed > 2*time.Second {
					t.Errorf("%s: connection closed %v after the answer", tc.name, closed)
				}
			})
		}
	}
	wg.Wait()
}

// TestOversizedBodyGets413: a client that sends a whole body over the
// limit reads the 413, not a reset: the relay reads on past the limit for
// a moment before it closes, since closing with the body unread makes the
// kernel answer the rest with RST, which destroys the 413 in the client's
// receive buffer if it has not read it yet.
func TestOversizedBodyGets413(t *testing.T) {
	h := newHarness(t, nil)
	tok := h.register("home", "phone")
	body := `{"id":"big","to":["phone"],"pad":"` + strings.Repeat("x", 200<<10) + `"}`
	head := "POST /v1/send HTTP/1.1\r\nAuthorization: Bearer " + tok + "\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body))
	for i := range 20 {
		status, _, err := rawRequest(t, h, head, body, 5*time.Second)
		if err != nil || status != http.StatusRequestEntityTooLarge {
			t.Fatalf("try %d: status %d, %v; want 413 and a closed connection", i, status, err)
		}
	}
}

// TestSlowBodyHasDeadline: a body that starts and then stops is cut off by
// the body deadline; the relay answers 400 and closes the connection, and
// nothing is stored.
func TestSlowBodyHasDeadline(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.BodyTimeout = time.Second })
	tok := h.register("home", "phone")
	head := "POST /v1/send HTTP/1.1\r\nAuthorization: Bearer " + tok + "\r\nContent-Type: application/json\r\nContent-Length: 200"
	start := time.Now()
	status, _, err := rawRequest(t, h, head, `{"id":"slow","to":["phone"],`, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", status)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the stalled body was held %v", d)
	}
	if p := h.poll(tok, "wait=0"); len(p.Envelopes) != 0 {
		t.Fatalf("a cut-off send stored %+v", p.Envelopes)
	}
}

// countingStore counts Ping calls.
type countingStore struct {
	store.Store
	mu    sync.Mutex
	pings int
}

func (c *countingStore) Ping(ctx context.Context) error {
	c.mu.Lock()
	c.pings++
	c.mu.Unlock()
	return c.Store.Ping(ctx)
}

// TestReadyIsCheap: however many probes arrive, the store is asked at most
// once at a time and at most about once per ready.TTL. Without the cache
// and the single flight, every probe pinged the store (on Postgres, one
// new connection each).
func TestReadyIsCheap(t *testing.T) {
	base := newHarness(t, nil)
	cs := &countingStore{Store: base.db}
	h := newHarnessWith(t, Deps{Store: cs, Hub: newLocalHub()}, nil)
	start := time.Now()
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for time.Since(start) < time.Second {
				r, err := h.do(context.Background(), "GET", "/ready", "", nil)
				if err != nil || r.status != http.StatusOK {
					t.Errorf("ready: %v %d", err, r.status)
					return
				}
			}
		})
	}
	wg.Wait()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if limit := int(time.Since(start)/ready.TTL) + 2; cs.pings > limit {
		t.Fatalf("the store was pinged %d times in %v; want at most %d", cs.pings, time.Since(start).Round(time.Millisecond), limit)
	}
}

// TestRemovalEndsHeldPoll: removing a device answers its held poll at once
// with 401, and the poll never hands the old token a re-registered
// device's envelopes.
func TestRemovalEndsHeldPoll(t *testing.T) {
	h := newHarness(t, nil)
	testRemovalEndsHeldPoll(t, h, h)
}

// TestRedisRemovalEndsHeldPoll: the same across two replicas on Redis: the
// device is removed through one relay while its poll is held on the other.
func TestRedisRemovalEndsHeldPoll(t *testing.T) {
	a, b := replicas(t, servicetest.RedisURL(t), 8)
	testRemovalEndsHeldPoll(t, b, a)
}

// testRemovalEndsHeldPoll holds a poll on at and removes the device
// through from.
func testRemovalEndsHeldPoll(t *testing.T, at, from *harness) {
	old := at.register("home", "phone")
	admin := from.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	laptop := from.register("home", "laptop")
	ended := make(chan reply, 1)
	go func() {
		r, err := at.do(context.Background(), "GET", "/v1/poll?wait=20", old, nil)
		if err != nil {
			t.Errorf("held poll: %v", err)
		}
		ended <- r
	}()
	eventually(t, "the poll is held", func() bool { return at.srv.HeldPolls() == 1 })
	removed := time.Now()
	from.must("DELETE", "/v1/devices/phone", admin, nil, http.StatusNoContent)
	// Register the name again and send to it at once: the old poll must
	// not hand this envelope to the old token.
	// iat has whole seconds; a token issued in the second of the removal
	// counts as issued before it.
	fresh := from.mint(token.Claims{Household: "home", Device: "phone", IssuedAt: time.Now().Add(time.Second), Expires: time.Now().Add(time.Hour)})
	from.must("POST", "/v1/register", fresh, nil, http.StatusOK)
	from.send(laptop, "after-removal", []byte("for the new phone"), "phone")
	select {
	case r := <-ended:
		if r.status != http.StatusUnauthorized {
			t.Fatalf("the removed device's held poll answered %d %s, want 401", r.status, r.body)
		}
		if d := time.Since(removed); d > 3*time.Second {
			t.Fatalf("the held poll ended %v after the removal", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the removed device's held poll was not ended")
	}
	if p := at.poll(fresh, "wait=0"); len(p.Envelopes) != 1 {
		t.Fatalf("the new device's poll = %+v", p)
	}
	at.must("GET", "/v1/poll?wait=0", old, nil, http.StatusUnauthorized)
}

// TestHouseholdSendRate: one household's burst is refused by its own
// bucket, with Retry-After and a limit that names it, while another
// household's sends go through.
func TestHouseholdSendRate(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.HouseholdSendRate = 5; c.HouseholdSendBurst = 10 })
	loud := h.register("loud", "a")
	quiet := h.register("quiet", "a")
	refused := 0
	for i := range 40 {
		r, err := h.do(context.Background(), "POST", "/v1/send", loud, map[string]any{"id": fmt.Sprint(i), "to": []string{"a"}, "payload": []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		switch r.status {
		case http.StatusAccepted:
		case http.StatusTooManyRequests:
			var e errorBody
			r.json(t, &e)
			if e.Error != codeRateLimited || e.Limit != limitHouseholdRate || r.header.Get("Retry-After") == "" {
				t.Fatalf("refusal = %s %v", r.body, r.header)
			}
			refused++
		default:
			t.Fatalf("send %d: %d %s", i, r.status, r.body)
		}
	}
	if refused < 20 {
		t.Fatalf("a 40-send burst against a bucket of 10 was refused %d times", refused)
	}
	for i := range 10 {
		h.send(quiet, fmt.Sprint(i), []byte("x"), "a")
	}
}

// TestHouseholdPendingBytes: one household cannot store more than its
// pending-bytes bound, whichever of its devices the envelopes are for.
func TestHouseholdPendingBytes(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxHouseholdPending = 10 << 10 })
	sender := h.register("home", "sender")
	var to []string
	for i := range 4 {
		to = append(to, fmt.Sprint("d", i))
		h.register("home", to[i])
	}
	payload := make([]byte, 1<<10)
	// 4 recipients x 1 KiB per send: two sends fit in 10 KiB, a third
	// does not.
	h.send(sender, "1", payload, to...)
	h.send(sender, "2", payload, to...)
	r := h.must("POST", "/v1/send", sender, map[string]any{"id": "3", "to": to, "payload": payload}, http.StatusTooManyRequests)
	var e errorBody
	r.json(t, &e)
	if e.Error != codeQueueFull || e.Limit != limitHouseholdPending {
		t.Fatalf("refusal = %s", r.body)
	}
	other := h.register("other", "sender")
	h.register("other", "d0")
	h.send(other, "1", payload, "d0")
}

// TestRefusedTokensDoNotFloodTheLog: thousands of bad tokens write a
// bounded number of log lines and are all counted.
func TestRefusedTokensDoNotFloodTheLog(t *testing.T) {
	var log servicetest.Buffer
	base := newHarness(t, nil)
	h := newHarnessWith(t, Deps{Store: base.db, Hub: newLocalHub(), Logger: newTestLogger(&log)}, nil)
	const n = 2000
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range n / 8 {
				r, err := h.do(context.Background(), "GET", "/v1/poll", fmt.Sprintf("junk.%d.%d", w, i), nil)
				if err != nil || r.status != http.StatusUnauthorized {
					t.Errorf("junk token: %v %d", err, r.status)
					return
				}
			}
		})
	}
	wg.Wait()
	if lines := strings.Count(log.String(), "token refused"); lines > 5 {
		t.Fatalf("%d bad tokens wrote %d log lines", n, lines)
	}
	if got := testutil.ToFloat64(h.srv.metrics.tokensRefused.WithLabelValues("malformed")); got != n {
		t.Fatalf("fn_tokens_refused_total{reason=malformed} = %v, want %d", got, n)
	}
}

func newTestLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestHouseholdsApart: a device sees and reaches only its own household:
// a name that exists only in another household is unknown to it, and an
// admin of one household cannot remove another's device.
func TestHouseholdsApart(t *testing.T) {
	h := newHarness(t, nil)
	home := h.register("home", "phone")
	h.register("other", "stranger")
	stranger := h.token("other", "stranger")
	r := h.must("POST", "/v1/send", home, map[string]any{"id": "x", "to": []string{"stranger"}, "payload": []byte("x")}, http.StatusNotFound)
	if r.errCode(t) != codeUnknownDevice {
		t.Fatalf("send across households: %s", r.body)
	}
	if p := h.poll(stranger, "wait=0"); len(p.Envelopes) != 0 {
		t.Fatalf("the other household's device received %+v", p)
	}
	admin := h.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	h.must("DELETE", "/v1/devices/stranger", admin, nil, http.StatusNotFound)
	h.poll(stranger, "wait=0") // still there, token still good
}

// TestHeadProbes: /live and /ready answer HEAD as they answer GET.
func TestHeadProbes(t *testing.T) {
	h := newHarness(t, nil)
	h.must("HEAD", "/live", "", nil, http.StatusOK)
	h.must("HEAD", "/ready", "", nil, http.StatusOK)
}
