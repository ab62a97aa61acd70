package relay

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flamenet/relay/internal/accesslog"
	"github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/internal/position"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/push"
	"github.com/flamenet/relay/token"
)

// accessHarness is a relay whose log is JSON lines in a buffer.
func accessHarness(t *testing.T, mutate func(*Config)) (*harness, *servicetest.Buffer) {
	t.Helper()
	log := &servicetest.Buffer{}
	base := newHarness(t, nil)
	h := newHarnessWith(t, Deps{Store: base.db, Hub: newLocalHub(), Logger: slog.New(slog.NewJSONHandler(log, nil))}, mutate)
	h.db = base.db
	return h, log
}

// accessLines are the log's access lines, in order.
func accessLines(t *testing.T, log *servicetest.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(log.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

// waitLine waits for the access line that match accepts and returns it.
func waitLine(t *testing.T, log *servicetest.Buffer, match func(map[string]any) bool) map[string]any {
	t.Helper()
	var found map[string]any
	eventually(t, "an access log line", func() bool {
		for _, l := range accessLines(t, log) {
			if match(l) {
				found = l
				return true
			}
		}
		return false
	})
	return found
}

func field(l map[string]any, k string) string {
	v, ok := l[k]
	if !ok {
		return "<absent>"
	}
	return fmt.Sprint(v)
}

// TestAccessLogLines: each finished request is one line with its route
// pattern, status, duration, size, device, poll outcome and client, and
// nothing a client keeps secret (tokens, payloads, push addresses, query
// values other than cursor, wait and limit) is in the log at all.
func TestAccessLogLines(t *testing.T) {
	h, log := accessHarness(t, nil)
	fake := newUPFake(t)
	q, err := push.New(push.Config{AllowPrivate: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close(context.Background())
	h.srv.push = q

	phone := h.token("home", "phone")
	endpoint := fake.srv.URL + "/secret-push-path"
	regBody := h.must("POST", "/v1/register", phone, map[string]any{"push": map[string]string{"kind": "unifiedpush", "endpoint": endpoint}}, http.StatusOK).body
	laptop := h.register("home", "laptop")
	admin := h.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	payload := []byte("secret-payload-marker")
	h.send(laptop, "m1", payload, "phone")
	pollBody := h.must("GET", "/v1/poll?cursor=0&wait=0&limit=5&junk=secret-query-value", phone, nil, http.StatusOK).body
	h.must("GET", "/v1/devices?after=secret-after-value&limit=7", laptop, nil, http.StatusOK)
	h.must("DELETE", "/v1/devices/laptop", admin, nil, http.StatusNoContent)
	h.must("GET", "/no/such/path", "", nil, http.StatusNotFound)
	h.must("GET", "/v1/poll?wait=abc", phone, nil, http.StatusBadRequest)

	// A held poll is logged when it ends: woken by a send.
	other := h.register("home", "tablet")
	done := make(chan reply, 1)
	go func() {
		r, _ := h.do(context.Background(), "GET", "/v1/poll?cursor=1&wait=30", phone, nil)
		done <- r
	}()
	eventually(t, "the poll held", func() bool { return h.srv.HeldPolls() == 1 })
	for _, l := range accessLines(t, log) {
		if field(l, "wait") == "30" {
			t.Fatalf("a held poll was logged before it ended: %v", l)
		}
	}
	h.send(other, "m2", []byte("x"), "phone")
	if r := <-done; r.status != http.StatusOK {
		t.Fatalf("held poll: %d %s", r.status, r.body)
	}

	reg := waitLine(t, log, func(l map[string]any) bool { return l["route"] == "/v1/register" && l["device"] == "phone" })
	for k, want := range map[string]string{"method": "POST", "status": "200", "household": "home", "client": "127.0.0.1", "bytes": fmt.Sprint(len(regBody)), "outcome": "<absent>", "error": "<absent>"} {
		if got := field(reg, k); got != want {
			t.Errorf("register line: %s=%s, want %s (%v)", k, got, want, reg)
		}
	}
	if d, err := time.ParseDuration(field(reg, "duration")); err != nil || d <= 0 {
		t.Errorf("register line: duration %q is not a Go duration: %v", field(reg, "duration"), err)
	}
	poll := waitLine(t, log, func(l map[string]any) bool { return l["route"] == "/v1/poll" && l["cursor"] == "0" })
	for k, want := range map[string]string{"method": "GET", "status": "200", "outcome": "delivered", "device": "phone", "wait": "0", "limit": "5", "bytes": fmt.Sprint(len(pollBody))} {
		if got := field(poll, k); got != want {
			t.Errorf("poll line: %s=%s, want %s (%v)", k, got, want, poll)
		}
	}
	held := waitLine(t, log, func(l map[string]any) bool { return l["route"] == "/v1/poll" && l["wait"] == "30" })
	if field(held, "outcome") != "delivered" || field(held, "status") != "200" {
		t.Errorf("woken poll line: %v", held)
	}
	del := waitLine(t, log, func(l map[string]any) bool { return l["method"] == "DELETE" })
	if field(del, "route") != "/v1/devices/{device}" || field(del, "status") != "204" || field(del, "device") != "admin" {
		t.Errorf("delete line: route is the pattern, not the path; %v", del)
	}
	nf := waitLine(t, log, func(l map[string]any) bool { return l["status"] == float64(404) })
	if field(nf, "route") != "-" || field(nf, "error") != "not_found" || field(nf, "household") != "<absent>" {
		t.Errorf("404 line: %v", nf)
	}
	bad := waitLine(t, log, func(l map[string]any) bool { return l["status"] == float64(400) })
	if field(bad, "wait") != "invalid" || field(bad, "outcome") != "client_error" || field(bad, "error") != "bad_request" {
		t.Errorf("400 poll line: %v", bad)
	}
	devs := waitLine(t, log, func(l map[string]any) bool { return l["route"] == "/v1/devices" })
	if field(devs, "limit") != "7" {
		t.Errorf("devices line: %v", devs)
	}

	all := log.String()
	for _, secret := range []string{phone, laptop, admin, string(payload), base64.StdEncoding.EncodeToString(payload),
		endpoint, "secret-push-path", "secret-query-value", "secret-after-value", "Bearer"} {
		if strings.Contains(all, secret) {
			t.Errorf("the log holds %q:\n%s", secret, all)
		}
	}
}

// TestAccessLogHeldPollEnds: held polls that run out, are superseded or
// are given up by their client are each logged once, when they end.
func TestAccessLogHeldPollEnds(t *testing.T) {
	h, log := accessHarness(t, func(c *Config) { c.MaxWait = 2 * time.Second })
	tok := h.register("home", "phone")
	h.must("GET", "/v1/poll?wait=1", tok, nil, http.StatusOK)
	empty := waitLine(t, log, func(l map[string]any) bool { return l["wait"] == "1" })
	if d, _ := time.ParseDuration(field(empty, "duration")); field(empty, "outcome") != "empty" || d < 900*time.Millisecond {
		t.Errorf("timed-out poll: %v", empty)
	}

	first := make(chan reply, 1)
	go func() {
		r, _ := h.do(context.Background(), "GET", "/v1/poll?wait=2&limit=1", tok, nil)
		first <- r
	}()
	eventually(t, "the first poll held", func() bool { return h.srv.HeldPolls() == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan struct{})
	go func() {
		defer close(second)
		_, _ = h.do(ctx, "GET", "/v1/poll?wait=2&limit=2", tok, nil)
	}()
	<-first
	sup := waitLine(t, log, func(l map[string]any) bool { return l["limit"] == "1" })
	if field(sup, "outcome") != "superseded" {
		t.Errorf("superseded poll: %v", sup)
	}
	eventually(t, "the second poll held", func() bool { return h.srv.HeldPolls() == 1 })
	cancel()
	<-second
	gone := waitLine(t, log, func(l map[string]any) bool { return l["limit"] == "2" })
	if field(gone, "outcome") != "hangup" || field(gone, "status") != "499" {
		t.Errorf("abandoned poll: %v", gone)
	}
}

// TestAccessLogOff: FN_ACCESS_LOG=off writes no access line.
func TestAccessLogOff(t *testing.T) {
	h, log := accessHarness(t, func(c *Config) { c.AccessLog = false })
	tok := h.register("home", "phone")
	h.poll(tok, "wait=0")
	h.must("GET", "/nowhere", "", nil, http.StatusNotFound)
	if lines := accessLines(t, log); len(lines) != 0 {
		t.Fatalf("access log off, yet: %v", lines)
	}
	if !DefaultConfig().AccessLog {
		t.Fatal("the access log is off by default")
	}
}

// TestAccessLogRefusalsBounded: junk anyone can send, and 429s one token
// provokes in a loop, write at most accesslog.LinesPerSecond lines a second,
// and a summary says how many were left out. With 429s exempt from the
// bound this goes red (tried: a line for every refused poll).
func TestAccessLogRefusalsBounded(t *testing.T) {
	h, log := accessHarness(t, func(c *Config) { c.DevicePollRate, c.DevicePollBurst = 1e-9, 1 })
	tok := h.register("home", "phone")
	h.must("GET", "/v1/poll?cursor=0", tok, nil, http.StatusOK) // its bucket's one poll
	const junk = 300
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := range junk / 6 {
				path, bearer := "/v1/poll", fmt.Sprintf("junk.%d.%d", w, i)
				switch i % 3 {
				case 0:
					path, bearer = fmt.Sprintf("/junk/%d/%d", w, i), ""
				case 1:
					path, bearer = "/v1/poll?cursor=0", tok // past its bucket: 429
				}
				r, err := h.do(context.Background(), "GET", path, bearer, nil)
				if err != nil || r.status/100 != 4 {
					t.Errorf("junk: %v %d", err, r.status)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	var logged, dropped int
	eventually(t, "every junk request logged or counted", func() bool {
		logged, dropped = 0, 0
		for line := range strings.Lines(log.String()) {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatal(err)
			}
			switch {
			case m["msg"] == "request" && (m["status"] == float64(401) || m["status"] == float64(404) || m["status"] == float64(429)):
				logged++
			case m["msg"] == "requests refused and not logged":
				dropped += int(m["dropped"].(float64))
			}
		}
		return logged+dropped == junk
	})
	if most := accesslog.LinesPerSecond * (int(elapsed/time.Second) + 2); logged > most || dropped == 0 {
		t.Errorf("%d junk requests in %v wrote %d lines (at most %d) and %d were counted", junk, elapsed, logged, most, dropped)
	}
}

// TestCursorAheadLoop: one token repeating a cursor above its device's
// head is answered from memory once the store said so (a store read per
// position.AheadFor at most), and its lines are bounded as junk's are.
// Red without State.AheadOf in acknowledge (tried: a store read for every
// poll) and with cursor_ahead exempt from refusal (tried: a line for every
// poll).
func TestCursorAheadLoop(t *testing.T) {
	h, log := accessHarness(t, nil)
	tok := h.register("home", "phone")
	reads := func() float64 { return testutil.ToFloat64(h.srv.metrics.storeCalls.WithLabelValues("state")) }
	before := reads()
	const polls = 300
	start := time.Now()
	for range polls {
		h.must("GET", "/v1/poll?cursor=99&wait=0", tok, nil, http.StatusConflict)
	}
	elapsed := time.Since(start)
	seconds := int(elapsed/position.AheadFor) + 2
	if n := int(reads() - before); n > seconds {
		t.Errorf("%d polls above the head in %v made %d store reads, want at most %d", polls, elapsed, n, seconds)
	}
	var lines, dropped int
	eventually(t, "every cursor_ahead logged or counted", func() bool {
		lines, dropped = 0, 0
		for line := range strings.Lines(log.String()) {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatal(err)
			}
			switch {
			case m["msg"] == "request" && m["error"] == codeCursorAhead:
				lines++
			case m["msg"] == "requests refused and not logged":
				dropped += int(m["dropped"].(float64))
			}
		}
		return lines+dropped == polls
	})
	if most := accesslog.LinesPerSecond * (int(elapsed/time.Second) + 2); lines > most {
		t.Errorf("%d polls above the head in %v wrote %d lines, want at most %d", polls, elapsed, lines, most)
	}

	// News that moves the head ends memory's word at once.
	for i := range 3 {
		h.send(tok, fmt.Sprint(i), []byte("x"), "phone")
	}
	if p := h.poll(tok, "cursor=3&wait=0"); p.Cursor != 3 {
		t.Fatalf("after the head reached the cursor: %+v", p)
	}
}

// TestAccessLogSpoofing: over real HTTP, a peer outside FN_TRUSTED_PROXIES
// is logged with its own address whatever X-Forwarded-For says, and a
// trusted one has its header believed.
func TestAccessLogSpoofing(t *testing.T) {
	for _, tt := range []struct {
		trusted string
		want    string
	}{
		{"", "127.0.0.1"},
		{"10.0.0.0/8, ::1", "127.0.0.1"},
		{"127.0.0.0/8", "198.51.100.1"},
	} {
		t.Run(tt.trusted, func(t *testing.T) {
			ps, err := config.ParseTrustedProxies(tt.trusted)
			if err != nil {
				t.Fatal(err)
			}
			h, log := accessHarness(t, func(c *Config) { c.TrustedProxies = ps })
			h.must("GET", "/live", "", nil, http.StatusOK, "X-Forwarded-For", "198.51.100.1")
			l := waitLine(t, log, func(l map[string]any) bool { return l["route"] == "/live" })
			if got := field(l, "client"); got != tt.want {
				t.Errorf("trusted %q: client %s, want %s", tt.trusted, got, tt.want)
			}
		})
	}
}

// BenchmarkAccessLog is what the access log adds to a request: a cached
// token's poll that answers at once, served in process, with the log on
// (JSON to io.Discard) and off. Run:
//
//	go test -run '^$' -bench AccessLog -benchmem ./relay/
func BenchmarkAccessLog(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			base := newHarness(b, nil)
			h := newHarnessWith(b, Deps{Store: base.db, Hub: newLocalHub(), Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))},
				func(c *Config) { c.AccessLog = on })
			tok := h.register("home", "phone")
			handler := h.srv.Handler()
			req := httptest.NewRequest("GET", "/v1/poll?cursor=0&wait=0", nil)
			req.Header.Set("Authorization", "Bearer "+tok)
			req.RemoteAddr = "127.0.0.1:5000"
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				w := httptest.NewRecorder()
				handler.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}
