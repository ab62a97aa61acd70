package relay

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/token"
)

// rawPoll writes requests on a connection of its own, so that a test sees
// what happens to the connection itself.
func rawConn(t *testing.T, h *harness) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c, bufio.NewReader(c)
}

func getRequest(h *harness, path, tok string) string {
	host := strings.TrimPrefix(h.url, "http://")
	return fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", path, host, tok)
}

func readReply(t *testing.T, br *bufio.Reader) (int, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := bufio.NewReader(resp.Body).WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b.String()
}

// TestParkedPollAnswersOnItsConnection: a held poll parks (its request's
// goroutine gone), is woken by a send, answers on its own connection, and
// the connection then serves the next request. It is logged once, when it
// answers, with its whole wait in its duration.
func TestParkedPollAnswersOnItsConnection(t *testing.T) {
	h, log := accessHarness(t, nil)
	phone, laptop := h.register("home", "phone"), h.register("home", "laptop")
	c, br := rawConn(t, h)
	if _, err := c.Write([]byte(getRequest(h, "/v1/poll?wait=30", phone))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the poll to park", func() bool { return h.srv.parking.Parked.Load() == 1 })
	const parkedFor = 300 * time.Millisecond
	time.Sleep(parkedFor) // a wait for the duration to show, not a synchronisation
	h.send(laptop, "m1", []byte("hello"), "phone")
	sent := time.Now()

	status, body := readReply(t, br)
	if d := time.Since(sent); d > 10*time.Second {
		t.Errorf("the parked poll answered %v after the send, not when woken", d)
	}
	var p pollResponse
	if err := json.Unmarshal([]byte(body), &p); status != http.StatusOK || err != nil || len(p.Envelopes) != 1 || string(p.Envelopes[0].Payload) != "hello" {
		t.Fatalf("parked poll answered %d %s", status, body)
	}
	if _, err := c.Write([]byte(getRequest(h, "/live", ""))); err != nil {
		t.Fatal(err)
	}
	if status, body := readReply(t, br); status != http.StatusOK || body != "ok\n" {
		t.Fatalf("next request on the connection: %d %q", status, body)
	}
	line := waitLine(t, log, func(l map[string]any) bool { return l["route"] == "/v1/poll" })
	if field(line, "outcome") != pollDelivered || field(line, "status") != "200" {
		t.Errorf("poll's line = %v", line)
	}
	if d, err := time.ParseDuration(field(line, "duration")); err != nil || d < parkedFor {
		t.Errorf("poll's duration %s, want its whole wait (at least %v)", field(line, "duration"), parkedFor)
	}
	waitLine(t, log, func(l map[string]any) bool { return l["route"] == "/live" })
	n := 0
	for _, l := range accessLines(t, log) {
		if l["route"] == "/v1/poll" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d access lines for one poll, want 1", n)
	}
	if h.srv.HeldPolls() != 0 || h.srv.parking.Parked.Load() != 0 {
		t.Errorf("after the answer: %d held, %d parked", h.srv.HeldPolls(), h.srv.parking.Parked.Load())
	}
}

// TestParkedPollHangup: a client that goes away while its poll is parked
// is a hang-up: the poll is no longer held (so its device gets pushes),
// and it is logged and counted as one.
func TestParkedPollHangup(t *testing.T) {
	h, log := accessHarness(t, nil)
	phone := h.register("home", "phone")
	c, _ := rawConn(t, h)
	if _, err := c.Write([]byte(getRequest(h, "/v1/poll?wait=30", phone))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the poll to park", func() bool { return h.srv.parking.Parked.Load() == 1 })
	before := pollCounts(h)
	c.Close()
	eventually(t, "the poll to end", func() bool { return h.srv.HeldPolls() == 0 && h.srv.parking.Parked.Load() == 0 })
	line := waitLine(t, log, func(l map[string]any) bool { return l["route"] == "/v1/poll" })
	if field(line, "status") != "499" || field(line, "outcome") != pollHangup || field(line, "device") != "phone" || field(line, "wait") != "30" {
		t.Errorf("hang-up's line = %v", line)
	}
	countedOnce(t, h, before, pollHangup)
}

// TestParkedPollClientSendsMore: a client that sends another request while
// its poll is parked gets the poll answered at once (empty), then the
// other request, in order, on the same connection.
func TestParkedPollClientSendsMore(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	for _, together := range []bool{true, false} {
		t.Run(fmt.Sprint("together=", together), func(t *testing.T) {
			c, br := rawConn(t, h)
			poll, live := getRequest(h, "/v1/poll?wait=30", phone), getRequest(h, "/live", "")
			start := time.Now()
			if together {
				if _, err := c.Write([]byte(poll + live)); err != nil {
					t.Fatal(err)
				}
			} else {
				if _, err := c.Write([]byte(poll)); err != nil {
					t.Fatal(err)
				}
				eventually(t, "the poll to park", func() bool { return h.srv.parking.Parked.Load() == 1 })
				if _, err := c.Write([]byte(live)); err != nil {
					t.Fatal(err)
				}
			}
			if status, body := readReply(t, br); status != http.StatusOK || !strings.Contains(body, `"envelopes":[]`) {
				t.Fatalf("poll: %d %s", status, body)
			}
			if status, body := readReply(t, br); status != http.StatusOK || body != "ok\n" {
				t.Fatalf("the request after it: %d %q", status, body)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("the poll held the next request for %v", d)
			}
		})
	}
}

// TestParkPollsOff: with FN_PARK_POLLS=off a held poll stays in its
// handler, and is woken there.
func TestParkPollsOff(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ParkPolls = false })
	phone, laptop := h.register("home", "phone"), h.register("home", "laptop")
	got := heldPoll(h, phone, "wait=30")
	eventually(t, "the poll held", func() bool { return h.srv.HeldPolls() == 1 })
	if n := h.srv.parking.Parked.Load(); n != 0 {
		t.Fatalf("%d polls parked with parking off", n)
	}
	h.send(laptop, "m1", []byte("x"), "phone")
	if p := <-got; len(p.Envelopes) != 1 {
		t.Fatalf("poll = %+v", p)
	}
}

// TestParkedPollOutlivesItsToken: a token that expires while its poll is
// parked does not refuse the answer when the poll is read again, as it
// would not for a poll held in its handler. Judged by the clock at the
// second reading, this goes red (tried): 401.
func TestParkedPollOutlivesItsToken(t *testing.T) {
	base := newHarness(t, nil)
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	h := newHarnessWith(t, Deps{Store: base.db, Hub: newLocalHub(), Now: func() time.Time { return time.Unix(0, clock.Load()) }}, nil)
	laptop := h.register("home", "laptop")
	phone := h.mint(token.Claims{Household: "home", Device: "phone", IssuedAt: time.Now(), Expires: time.Now().Add(time.Minute)})
	h.must("POST", "/v1/register", phone, nil, http.StatusOK)
	got := heldPoll(h, phone, "wait=30")
	eventually(t, "the poll to park", func() bool { return h.srv.parking.Parked.Load() == 1 })
	clock.Add(int64(time.Hour)) // the token is long expired, skew included
	h.send(laptop, "m1", []byte("x"), "phone")
	if p := <-got; len(p.Envelopes) != 1 {
		t.Fatalf("poll = %+v", p)
	}
	// A new request with the token is refused: only the held poll lives on.
	h.must("GET", "/v1/poll", phone, nil, http.StatusUnauthorized)
}

// TestParkedPollWithManyHeaders: a poll whose headers fit net/http's limit
// as sent, but not as a parked poll's replay rebuilds them (Header.Write
// adds a space to each "X:1" line), is answered as a held poll is, woken
// or at the end of its wait, and logged and counted once. Replayed, it was
// refused 431 by net/http after its whole hold, with no line and no count.
func TestParkedPollWithManyHeaders(t *testing.T) {
	for _, woken := range []bool{true, false} {
		t.Run(fmt.Sprint("woken=", woken), func(t *testing.T) {
			h, log := accessHarness(t, nil)
			phone, laptop := h.register("home", "phone"), h.register("home", "laptop")
			wait, want, envelopes := "30", pollDelivered, 1
			if !woken {
				wait, want, envelopes = "1", pollEmpty, 0
			}
			req := getRequest(h, "/v1/poll?wait="+wait, phone)
			req = strings.TrimSuffix(req, "\r\n") + strings.Repeat("X:1\r\n", 3600) + "\r\n"
			// net/http reads a request's head up to MaxHeaderBytes and 4 KiB
			// of its reader's slack; one byte more per line must cross that.
			if limit := maxHeaderBytes + 4096; len(req) > limit || len(req)+3600 <= limit {
				t.Fatalf("a request of %d bytes does not cross the line at %d", len(req), limit)
			}
			before := pollCounts(h)
			c, br := rawConn(t, h)
			if _, err := c.Write([]byte(req)); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the poll held", func() bool { return h.srv.HeldPolls() == 1 })
			if woken {
				h.send(laptop, "m1", []byte("hello"), "phone")
			}

			status, body := readReply(t, br)
			var p pollResponse
			if err := json.Unmarshal([]byte(body), &p); status != http.StatusOK || err != nil || len(p.Envelopes) != envelopes {
				t.Fatalf("poll answered %d %s", status, body)
			}
			if _, err := c.Write([]byte(getRequest(h, "/live", ""))); err != nil {
				t.Fatal(err)
			}
			if status, body := readReply(t, br); status != http.StatusOK || body != "ok\n" {
				t.Fatalf("next request on the connection: %d %q", status, body)
			}
			line := waitLine(t, log, func(l map[string]any) bool { return l["route"] == "/v1/poll" })
			if field(line, "status") != "200" || field(line, "outcome") != want || field(line, "device") != "phone" {
				t.Errorf("poll's line = %v", line)
			}
			countedOnce(t, h, before, want)
		})
	}
}
