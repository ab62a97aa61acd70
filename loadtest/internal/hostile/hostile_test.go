package hostile

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	relayconfig "github.com/flamenet/relay/internal/config"
)

// lenientRelay is a fake relay that accepts everything: every request is
// answered 200 (a send 202, the /ready probe 500) before its body is read,
// and no connection is ever closed by it.
func lenientRelay(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						// Hold the connection open, as a careless server
						// would, until the test ends.
						_, _ = io.Copy(io.Discard, c)
						return
					}
					status := "200 OK"
					switch req.URL.Path {
					case "/ready":
						status = "500 Internal Server Error"
					case "/v1/send":
						status = "202 Accepted"
					}
					if _, err := io.WriteString(c, "HTTP/1.1 "+status+"\r\nContent-Length: 2\r\n\r\nok"); err != nil {
						return
					}
					// Then the body, however long it takes to come.
					_, _ = io.Copy(io.Discard, req.Body)
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + ln.Addr().String()
}

// testConfig is the hostile connections' config against a lenient relay,
// with the relay's default limits.
func testConfig(t *testing.T, connections, slowReaders int) Config {
	return Config{Connections: connections, SlowReaders: slowReaders, Relay: relayconfig.Default(),
		Targets: []string{lenientRelay(t)}, Key: ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)), Tag: "test"}
}

// noWindows: no relay was ever down for a fault the tester caused.
type noWindows struct{}

func (noWindows) InCrashWindow(int, time.Time, time.Time, error) bool { return false }

// TestHostileCatchesALenientRelay runs the hostile connections against a
// relay that accepts forged tokens and malformed bodies, keeps connections
// whose body never comes open, and fails its readiness probe with a 500:
// each of those must be a failure of its own kind. Judging only by status
// (dropping the "accepted" check in answerOutcome), or not waiting for the
// close in stall, turned this test red.
func TestHostileCatchesALenientRelay(t *testing.T) {
	h := New(testConfig(t, 2, 0), noWindows{})
	h.closeLimit = 300 * time.Millisecond
	h.burstFor = 200 * time.Millisecond
	h.householdRate, h.householdBurst = 1, 5
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.Run(ctx, time.Now())
	if ctx.Err() != nil {
		t.Fatal("the hostile connections did not stop once every kind was sent")
	}
	got := h.Summary()
	for _, want := range []string{
		"token forged: accepted",
		"token alg none: accepted",
		"token HS256: accepted",
		"token expired: accepted",
		"msgpack send, payload declared bin32 4 GiB: accepted",
		"msgpack send, 95,000 nested arrays: accepted",
		"json send, trailing bytes: accepted",
		"unsent body (content-length), GET /live: connection not closed within 300ms",
		"unsent body (chunked), POST /v1/send without token: accepted; connection not closed within 300ms",
		"send body stalls halfway (content-length): accepted; connection not closed within 300ms",
		"ready flood: 5xx",
		"household burst: household bucket never refused",
		"pair, guessed code: accepted",
		"renew, guessed secret: accepted",
		"pair, body over 1 KiB: accepted",
		"invitation with a device token: accepted",
	} {
		if got.Failures[want] == 0 {
			t.Errorf("no failure %q; failures:\n%s", want, failureList(got.Failures))
		}
	}
	for _, k := range hostileKinds {
		if len(got.Outcomes[k.name]) == 0 {
			t.Errorf("kind %q never sent", k.name)
		}
	}
}

// TestBurstWithinTheBucketIsNoFailure: a burst that the bucket may let
// through in full is not held against the relay.
func TestBurstWithinTheBucketIsNoFailure(t *testing.T) {
	h := New(testConfig(t, 1, 0), noWindows{})
	h.closeLimit = time.Second
	h.burstFor = 100 * time.Millisecond
	h.householdRate, h.householdBurst = 1, 1e9
	w := &hworker{h: h, target: h.targets[0]}
	w.mintTokens()
	defer w.closeConn()
	w.burst(context.Background(), "household burst")
	got := h.Summary()
	if len(got.Failures) != 0 || got.Outcomes["household burst"]["bucket not emptied in time"] != 1 {
		t.Errorf("outcomes %v failures %v", got.Outcomes, got.Failures)
	}
}

func failureList(m map[string]int) string {
	var b strings.Builder
	for k, n := range m {
		b.WriteString("  " + k + ": " + strconv.Itoa(n) + "\n")
	}
	return b.String()
}

// TestSlowReadersCatchALenientRelay: a relay that hands a client that
// never reads its whole answer, as one without a bound on what the kernel
// holds unsent does, fails the run; so would one that never cuts such an
// answer. Judging a slow reader by its status alone turned this red.
func TestSlowReadersCatchALenientRelay(t *testing.T) {
	h := New(testConfig(t, 1, 3), noWindows{})
	h.slow.limit = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.slow.run(ctx, time.Now())
	got := h.Summary()
	if n := got.Failures[SlowReaderKind+": an answer handed whole to a client that did not read"]; n != 3 {
		t.Errorf("slow readers failed %d times, want 3; failures:\n%s", n, failureList(got.Failures))
	}
	if got.SlowReaders != 3 || got.SlowReaderRounds != 1 || got.SlowReaderConnections != 3 {
		t.Errorf("slow readers %d, rounds %d, connections %d; want 3, 1, 3", got.SlowReaders, got.SlowReaderRounds, got.SlowReaderConnections)
	}
}

// TestJudgeGuess: a guess must meet the one refusal or a pair bucket.
func TestJudgeGuess(t *testing.T) {
	for _, c := range []struct {
		status int
		body   string
		want   string
	}{
		{401, pairRefusal + "\n", ""},
		{401, `{"error":"unauthorized","message":"The code has expired."}`, "a refusal unlike the others"},
		{429, `{"error":"rate_limited","message":"x","limit":"pair_address_rate"}`, ""},
		{429, `{"error":"rate_limited","message":"x","limit":"pair_rate"}`, ""},
		{429, `{"error":"rate_limited","message":"x","limit":"household_send_rate"}`, "429 from another bucket (household_send_rate)"},
		{404, `{"error":"not_found","message":"x"}`, "answered 404 to a guess"},
		{503, `{"error":"unavailable","message":"x"}`, ""},
		{200, `{}`, ""}, // answerOutcome's "accepted"
	} {
		if got := judgeGuess(&http.Response{StatusCode: c.status}, []byte(c.body)); got != c.want {
			t.Errorf("%d %s: %q, want %q", c.status, c.body, got, c.want)
		}
	}
}
