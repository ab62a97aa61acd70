package push

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// marker is what a careless push would leak: no push body may contain it.
const marker = "ENVELOPE-PAYLOAD-MARKER"

// waitFor polls cond until it holds or 10 s pass.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// newQueue starts a queue that is closed when the test ends.
func newQueue(tb testing.TB, cfg Config, onGone func(context.Context, Job)) *Queue {
	tb.Helper()
	q, err := New(cfg, onGone)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		q.Close(ctx)
	})
	return q
}

// closeQueue closes q and checks that every attempted push ended counted.
func closeQueue(tb testing.TB, q *Queue) Stats {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q.Close(ctx)
	s := q.Stats()
	if s.Sent+s.Dropped+s.Failed != s.Attempted || s.Queued != 0 || s.InFlight != 0 {
		tb.Errorf("after Close: sent %d + dropped %d + failed %d != attempted %d (queued %d, in flight %d)",
			s.Sent, s.Dropped, s.Failed, s.Attempted, s.Queued, s.InFlight)
	}
	return s
}

// goneRecorder collects onGone calls.
type goneRecorder struct {
	mu   sync.Mutex
	jobs []Job
}

func (g *goneRecorder) onGone(_ context.Context, j Job) {
	g.mu.Lock()
	g.jobs = append(g.jobs, j)
	g.mu.Unlock()
}

func (g *goneRecorder) got() []Job {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Job(nil), g.jobs...)
}

// upFake is a UnifiedPush push server: it records every POST and answers
// what answer says for the path and the how-many-th request to it.
type upFake struct {
	srv    *httptest.Server
	answer func(path string, n int) (status int, retryAfter string)
	// gate, when non-nil, holds every request until it is closed or the
	// client gives up.
	gate     chan struct{}
	inFlight atomic.Int64

	mu     sync.Mutex
	hits   map[string]int
	bodies []string
	times  map[string][]time.Time
	held   []time.Duration // how long each request waited at the gate
	bad    []string
}

func newUPFake(tb testing.TB, answer func(path string, n int) (int, string)) *upFake {
	tb.Helper()
	f := &upFake{answer: answer, hits: map[string]int{}, times: map[string][]time.Time{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	tb.Cleanup(f.srv.Close)
	return f
}

func (f *upFake) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.hits[r.URL.Path]++
	n := f.hits[r.URL.Path]
	f.times[r.URL.Path] = append(f.times[r.URL.Path], time.Now())
	f.bodies = append(f.bodies, string(body))
	if r.Method != http.MethodPost || r.Header.Get("TTL") == "" || r.Header.Get("Content-Type") != "application/json" {
		f.bad = append(f.bad, fmt.Sprintf("%s %s TTL=%q Content-Type=%q", r.Method, r.URL.Path, r.Header.Get("TTL"), r.Header.Get("Content-Type")))
	}
	gate := f.gate
	f.mu.Unlock()

	if gate != nil {
		f.inFlight.Add(1)
		arrived := time.Now()
		select {
		case <-gate:
		case <-r.Context().Done():
		}
		f.mu.Lock()
		f.held = append(f.held, time.Since(arrived))
		f.mu.Unlock()
		f.inFlight.Add(-1)
	}
	status, after := http.StatusCreated, ""
	if f.answer != nil {
		status, after = f.answer(r.URL.Path, n)
	}
	if after != "" {
		w.Header().Set("Retry-After", after)
	}
	w.WriteHeader(status)
}

func (f *upFake) url(path string) string { return f.srv.URL + path }

// firstHit is when path was first requested, zero if never.
func (f *upFake) firstHit(path string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ts := f.times[path]; len(ts) > 0 {
		return ts[0]
	}
	return time.Time{}
}

// hitsBefore counts the requests, to any path, that arrived before t.
func (f *upFake) hitsBefore(t time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, ts := range f.times {
		for _, at := range ts {
			if at.Before(t) {
				n++
			}
		}
	}
	return n
}

// heldTimes are how long the requests held at the gate waited there.
func (f *upFake) heldTimes() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.held...)
}

func (f *upFake) hitsFor(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits[path]
}

func (f *upFake) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, h := range f.hits {
		n += h
	}
	return n
}

// checkBodies asserts every recorded body is exactly the wake body.
func (f *upFake) checkBodies(tb testing.TB) {
	tb.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.bodies {
		if b != WakeBody || strings.Contains(b, marker) {
			tb.Errorf("push body %q, want exactly %q", b, WakeBody)
		}
	}
	for _, b := range f.bad {
		tb.Errorf("bad request: %s", b)
	}
}

// jwtParts splits and decodes a compact JWT.
func jwtParts(tok string) (header, claims map[string]any, input string, sig []byte, err error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil, nil, "", nil, fmt.Errorf("%d parts", len(parts))
	}
	dec := func(s string, v any) error {
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil {
			return err
		}
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		return d.Decode(v)
	}
	if err := dec(parts[0], &header); err != nil {
		return nil, nil, "", nil, fmt.Errorf("header: %w", err)
	}
	if err := dec(parts[1], &claims); err != nil {
		return nil, nil, "", nil, fmt.Errorf("claims: %w", err)
	}
	sig, err = base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return nil, nil, "", nil, fmt.Errorf("signature: %w", err)
	}
	return header, claims, parts[0] + "." + parts[1], sig, nil
}

func writeFile(tb testing.TB, name string, data []byte) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

// newP8 makes an APNs-style key: PEM PKCS#8 EC P-256.
func newP8(tb testing.TB) (*ecdsa.PrivateKey, string) {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		tb.Fatal(err)
	}
	return k, writeFile(tb, "AuthKey.p8", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// rsaKey is made once: RSA generation is slow under the race detector.
var rsaKey = sync.OnceValue(func() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
})

func (f *apnsFake) total() int { return totalHits(&f.mu, f.hits) }

func (f *fcmFake) total() int { return totalHits(&f.mu, f.hits) }

// totalHits returns the pushes a provider fake took, under its lock.
func totalHits(mu *sync.Mutex, hits map[string]int) int {
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, h := range hits {
		n += h
	}
	return n
}

// reportProblems fails tb with each problem a provider fake found, under
// its lock.
func reportProblems(tb testing.TB, mu *sync.Mutex, fake string, problems *[]string) {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	for _, p := range *problems {
		tb.Errorf("%s fake: %s", fake, p)
	}
}
