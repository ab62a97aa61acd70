package push

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
)

const (
	testAlertText = "Something new"
	testKeyID     = "ABC123DEFG"
	testTeamID    = "DEF123GHIJ"
	testTopic     = "net.flame.app"
)

// apnsFake speaks APNs over TLS with HTTP/2. It checks each request as APNs
// would (provider token signature and claims, headers, path, body) and
// answers what answer says for the device token and the how-many-th
// request to it. A request that fails a check gets 403 and a problem note.
type apnsFake struct {
	srv    *httptest.Server
	pub    *ecdsa.PublicKey
	answer func(device string, n int) (status int, reason, retryAfter string)
	// tokens issued before this Unix time are answered ExpiredProviderToken.
	expiredBefore int64

	mu       sync.Mutex
	hits     map[string]int
	tokens   map[string]int
	iats     []int64
	kinds    []string // apns-push-type of each push that passed the body check
	problems []string
}

func newAPNsFake(tb testing.TB, pub *ecdsa.PublicKey, answer func(string, int) (int, string, string)) *apnsFake {
	tb.Helper()
	f := &apnsFake{pub: pub, answer: answer, hits: map[string]int{}, tokens: map[string]int{}}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.EnableHTTP2 = true
	f.srv.StartTLS()
	tb.Cleanup(f.srv.Close)
	return f
}

func (f *apnsFake) roots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(f.srv.Certificate())
	return p
}

func (f *apnsFake) problem(w http.ResponseWriter, format string, args ...any) {
	f.mu.Lock()
	f.problems = append(f.problems, fmt.Sprintf(format, args...))
	f.mu.Unlock()
	w.WriteHeader(http.StatusForbidden)
	fmt.Fprint(w, `{"reason":"InvalidProviderToken"}`)
}

func (f *apnsFake) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.ProtoMajor != 2 || r.TLS == nil {
		f.problem(w, "not HTTP/2 over TLS: %s", r.Proto)
		return
	}
	device, ok := strings.CutPrefix(r.URL.Path, "/3/device/")
	if r.Method != http.MethodPost || !ok || device == "" {
		f.problem(w, "%s %s", r.Method, r.URL.Path)
		return
	}
	h := r.Header
	// A background push, or an alert push as PUSH.md gives it.
	wantBody, wantType, wantPriority := APNsBody, "background", "5"
	if h.Get("apns-push-type") == "alert" {
		wantBody, wantType, wantPriority = `{"aps":{"alert":{"body":"`+testAlertText+`"},"mutable-content":1}}`, "alert", "10"
	}
	if string(body) != wantBody || strings.Contains(string(body), marker) {
		f.problem(w, "body %q", body)
		return
	}
	f.mu.Lock()
	f.kinds = append(f.kinds, wantType)
	f.mu.Unlock()
	exp, err := strconv.ParseInt(h.Get("apns-expiration"), 10, 64)
	if h.Get("apns-push-type") != wantType || h.Get("apns-priority") != wantPriority ||
		h.Get("apns-topic") != testTopic || err != nil || exp <= 0 || h.Get("apns-collapse-id") == "" ||
		len(h.Get("apns-collapse-id")) > 64 {
		f.problem(w, "headers %v", h)
		return
	}
	tok, ok := strings.CutPrefix(h.Get("Authorization"), "bearer ")
	if !ok {
		f.problem(w, "authorization %q", h.Get("Authorization"))
		return
	}
	header, claims, input, sig, err := jwtParts(tok)
	if err != nil {
		f.problem(w, "provider token: %v", err)
		return
	}
	if header["alg"] != "ES256" || header["kid"] != testKeyID || claims["iss"] != testTeamID {
		f.problem(w, "provider token header %v claims %v", header, claims)
		return
	}
	iat, err := claims["iat"].(json.Number).Int64()
	if err != nil {
		f.problem(w, "iat %v", claims["iat"])
		return
	}
	// ES256 in JWS is the raw r||s, 32 bytes each.
	sum := sha256.Sum256([]byte(input))
	if len(sig) != 64 || !ecdsa.Verify(f.pub, sum[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
		f.problem(w, "provider token signature does not verify (%d bytes)", len(sig))
		return
	}

	f.mu.Lock()
	f.tokens[tok]++
	f.iats = append(f.iats, iat)
	f.hits[device]++
	n := f.hits[device]
	expired := iat < f.expiredBefore
	f.mu.Unlock()

	w.Header().Set("apns-id", "00000000-0000-0000-0000-000000000001")
	if expired {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"reason":"ExpiredProviderToken"}`)
		return
	}
	status, reason, after := http.StatusOK, "", ""
	if f.answer != nil {
		status, reason, after = f.answer(device, n)
	}
	if after != "" {
		w.Header().Set("Retry-After", after)
	}
	w.WriteHeader(status)
	if reason != "" {
		fmt.Fprintf(w, `{"reason":%q}`, reason)
	}
}

func (f *apnsFake) check(tb testing.TB) {
	tb.Helper()
	reportProblems(tb, &f.mu, "APNs", &f.problems)
}

func (f *apnsFake) hitsFor(device string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits[device]
}

// apnsOnClock returns an APNs provider talking to a fake of its own, on
// a clock the test moves by setting *clock; both end with the test.
func apnsOnClock(t *testing.T) (a *apns, fake *apnsFake, clock *time.Time) {
	key, keyFile := newP8(t)
	fake = newAPNsFake(t, &key.PublicKey, nil)
	a, err := newAPNs(apnsConfig(keyFile, fake), DefaultResponseHeaderTimeout, DefaultAttemptTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	now := time.Now()
	clock = &now
	a.now = func() time.Time { return *clock }
	return a, fake, clock
}

func apnsConfig(keyFile string, f *apnsFake) APNsConfig {
	return APNsConfig{KeyFile: keyFile, KeyID: testKeyID, TeamID: testTeamID, Topic: testTopic, URL: f.srv.URL, RootCAs: f.roots(),
		AlertText: testAlertText}
}

// TestAPNsAlert: a target that asked for alerts gets an alert push with
// exactly PUSH.md's headers (apns-push-type alert, priority 10, the same
// collapse id) and body (the operator's text, mutable-content 1); one
// that did not gets today's background push.
func TestAPNsAlert(t *testing.T) {
	key, keyFile := newP8(t)
	fake := newAPNsFake(t, &key.PublicKey, nil)
	q := newQueue(t, Config{APNs: apnsConfig(keyFile, fake)}, nil)
	alert, background := devToken("aa"), devToken("bb")
	for name, addr := range map[string]string{"alert": APNsAlertPrefix + alert, "background": background} {
		target := device.PushTarget{Kind: device.PushAPNs, Address: addr}
		if err := q.CheckTarget(context.Background(), target); err != nil {
			t.Fatalf("%s target: %v", name, err)
		}
		q.Enqueue(Job{Household: "home-" + name, Device: name, Target: target})
	}
	waitFor(t, "both pushes sent", func() bool { return q.Stats().Sent == 2 })
	fake.check(t)
	fake.mu.Lock()
	kinds := strings.Join(fake.kinds, ",")
	fake.mu.Unlock()
	if fake.hitsFor(alert) != 1 || fake.hitsFor(background) != 1 || (kinds != "alert,background" && kinds != "background,alert") {
		t.Errorf("pushes %q to %d/%d", kinds, fake.hitsFor(alert), fake.hitsFor(background))
	}
}

func devToken(prefix string) string {
	return prefix + strings.Repeat("0", 64-len(prefix))
}

// Disabling the provider-token cache (done once on purpose) turns this red
// with a token per request.
func TestAPNs(t *testing.T) {
	key, keyFile := newP8(t)
	ok, gone, bad, busy, down := devToken("a1"), devToken("b2"), devToken("c3"), devToken("d4"), devToken("e5")
	fake := newAPNsFake(t, &key.PublicKey, func(device string, n int) (int, string, string) {
		switch device {
		case gone:
			return http.StatusGone, "Unregistered", ""
		case bad:
			return http.StatusBadRequest, "BadDeviceToken", ""
		case busy:
			if n == 1 {
				return http.StatusTooManyRequests, "TooManyRequests", "1"
			}
		case down:
			return http.StatusInternalServerError, "InternalServerError", ""
		}
		return http.StatusOK, "", ""
	})
	var g goneRecorder
	q := newQueue(t, Config{MaxAttempts: 2, RetryBase: 10 * time.Millisecond, APNs: apnsConfig(keyFile, fake)}, g.onGone)
	devs := map[string]string{"ok": ok, "gone": gone, "bad": bad, "busy": busy, "down": down}
	for name, tok := range devs {
		if !q.Enqueue(Job{Household: "home", Device: name, Target: device.PushTarget{Kind: device.PushAPNs, Address: tok}}) {
			t.Fatalf("Enqueue %s refused", name)
		}
	}
	waitFor(t, "every push ended", func() bool { s := q.Stats(); return s.Sent+s.Failed == 5 })
	s := closeQueue(t, q)
	fake.check(t)

	if s.Sent != 2 || s.Gone != 2 || s.Failed != 3 || s.Retried != 2 {
		t.Errorf("stats %+v; want sent 2, gone 2, failed 3 (gone included), retried 2", s)
	}
	for tok, want := range map[string]int{ok: 1, gone: 1, bad: 1, busy: 2, down: 2} {
		if got := fake.hitsFor(tok); got != want {
			t.Errorf("device %s…: %d requests, want %d", tok[:4], got, want)
		}
	}
	goneDevs := map[string]int{}
	for _, j := range g.got() {
		goneDevs[j.Device]++
	}
	if len(g.got()) != 2 || goneDevs["gone"] != 1 || goneDevs["bad"] != 1 {
		t.Errorf("onGone for %v, want gone and bad once each", goneDevs)
	}
	// One provider token signed and reused for all seven requests.
	fake.mu.Lock()
	tokens := len(fake.tokens)
	fake.mu.Unlock()
	if tokens != 1 {
		t.Errorf("%d distinct provider tokens, want 1 (cached)", tokens)
	}
}

// The provider token is renewed after 50 minutes, not before, so it is
// never an hour old and never renewed so often that APNs complains.
func TestAPNsTokenRenewal(t *testing.T) {
	a, fake, clock := apnsOnClock(t)
	dev := devToken("ab")
	ctx := context.Background()

	for _, step := range []struct {
		advance time.Duration
		tokens  int // distinct tokens seen so far
	}{
		{0, 1},
		{49 * time.Minute, 1},
		{2 * time.Minute, 2}, // 51 minutes after the first
		{10 * time.Minute, 2},
	} {
		*clock = clock.Add(step.advance)
		if err := a.Push(ctx, dev); err != nil {
			t.Fatalf("Push: %v", err)
		}
		fake.mu.Lock()
		got := len(fake.tokens)
		fake.mu.Unlock()
		if got != step.tokens {
			t.Errorf("after %v more: %d tokens, want %d", step.advance, got, step.tokens)
		}
	}
	fake.check(t)
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if last := fake.iats[len(fake.iats)-1]; last != clock.Add(-10*time.Minute).Unix() {
		t.Errorf("renewed token iat %d, want the renewal time %d", last, clock.Add(-10*time.Minute).Unix())
	}
}

// ExpiredProviderToken makes one retry with a fresh token, but only when
// the token is old enough that APNs allows a new one.
func TestAPNsExpiredProviderToken(t *testing.T) {
	a, fake, clock := apnsOnClock(t)
	start := *clock
	ctx := context.Background()
	dev := devToken("ab")
	if err := a.Push(ctx, dev); err != nil {
		t.Fatal(err)
	}

	fake.mu.Lock()
	fake.expiredBefore = start.Unix() + 1 // APNs now refuses the first token
	fake.mu.Unlock()

	*clock = start.Add(10 * time.Minute) // too young to renew
	if err := a.Push(ctx, dev); err == nil || errors.Is(err, ErrGone) {
		t.Errorf("Push with an expired young token = %v, want a plain failure", err)
	}
	*clock = start.Add(30 * time.Minute)
	if err := a.Push(ctx, dev); err != nil {
		t.Errorf("Push after renewal = %v", err)
	}
	fake.check(t)
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.tokens) != 2 || fake.hits[dev] != 4 {
		t.Errorf("%d tokens, %d requests; want 2 tokens, 4 requests", len(fake.tokens), fake.hits[dev])
	}
}

func TestAPNsKeyMustBeP256(t *testing.T) {
	k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(k)
	p384 := writeFile(t, "p384.p8", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	rsaDER, _ := x509.MarshalPKCS8PrivateKey(rsaKey())
	rsaFile := writeFile(t, "rsa.p8", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: rsaDER}))
	junk := writeFile(t, "junk.p8", []byte("not a key"))
	for _, f := range []string{p384, rsaFile, junk} {
		if _, err := newAPNs(APNsConfig{KeyFile: f, KeyID: testKeyID, TeamID: testTeamID, Topic: testTopic}, DefaultResponseHeaderTimeout, DefaultAttemptTimeout); err == nil {
			t.Errorf("newAPNs accepted %s", f)
		}
	}
}
