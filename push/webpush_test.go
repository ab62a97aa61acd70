package push

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/internal/webpush"
)

// pushService is a Web Push service of the test's own (RFC 8030 over real
// HTTP): it checks each push's VAPID header as RFC 8292 says a push
// service does, keeps the body, and answers as answer says for the path
// and the how-many-th request to it.
type pushService struct {
	srv    *httptest.Server
	answer func(path string, n int) (status int, retryAfter string)

	mu     sync.Mutex
	hits   map[string]int
	pushes []received
}

type received struct {
	path   string
	at     time.Time
	header http.Header
	body   []byte
	vapid  error // the VAPID check's verdict
}

func newPushService(tb testing.TB, answer func(path string, n int) (int, string)) *pushService {
	tb.Helper()
	s := &pushService{answer: answer, hits: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	tb.Cleanup(s.srv.Close)
	return s
}

func (s *pushService) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	verdict := checkVAPID(r.Header.Get("Authorization"), s.srv.URL, time.Now())
	s.mu.Lock()
	s.hits[r.URL.Path]++
	n := s.hits[r.URL.Path]
	s.pushes = append(s.pushes, received{path: r.URL.Path, at: time.Now(), header: r.Header.Clone(), body: body, vapid: verdict})
	s.mu.Unlock()
	status, after := http.StatusCreated, ""
	if s.answer != nil {
		status, after = s.answer(r.URL.Path, n)
	}
	if verdict != nil {
		status = http.StatusUnauthorized // as a push service that requires VAPID
	}
	if after != "" {
		w.Header().Set("Retry-After", after)
	}
	w.WriteHeader(status)
}

func (s *pushService) received() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.pushes...)
}

// checkVAPID is a push service's check of an Authorization header (RFC
// 8292 section 3): "vapid t=JWT, k=KEY", the JWT ES256 under KEY, its aud
// the push service's origin, its exp in the future and at most 24 hours
// ahead, and a sub.
func checkVAPID(h, origin string, now time.Time) error {
	rest, ok := strings.CutPrefix(h, "vapid ")
	if !ok {
		return fmt.Errorf("not the vapid scheme: %q", h)
	}
	params := map[string]string{}
	for _, p := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		params[k] = v
	}
	tok, k := params["t"], params["k"]
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || k == "" {
		return errors.New("no t or k")
	}
	dec := base64.RawURLEncoding
	pubBytes, err := dec.DecodeString(k)
	if err != nil {
		return err
	}
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), pubBytes)
	if err != nil {
		return err
	}
	var header struct{ Alg, Typ string }
	var claims struct {
		Aud string
		Exp int64
		Sub string
	}
	hb, _ := dec.DecodeString(parts[0])
	cb, _ := dec.DecodeString(parts[1])
	if json.Unmarshal(hb, &header) != nil || json.Unmarshal(cb, &claims) != nil || header.Alg != "ES256" {
		return fmt.Errorf("header %s, claims %s", hb, cb)
	}
	sig, err := dec.DecodeString(parts[2])
	if err != nil || len(sig) != 64 {
		return errors.New("the signature is not 64 bytes of base64url")
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if !ecdsa.Verify(pub, digest[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
		return errors.New("the signature does not verify")
	}
	exp := time.Unix(claims.Exp, 0)
	switch {
	case claims.Aud != origin:
		return fmt.Errorf("aud %q, want %q", claims.Aud, origin)
	case !exp.After(now):
		return fmt.Errorf("expired at %v", exp)
	case exp.After(now.Add(24 * time.Hour)):
		return fmt.Errorf("exp %v more than 24 h ahead", exp)
	case webpush.CheckSubject(claims.Sub) != nil:
		return fmt.Errorf("sub %q", claims.Sub)
	}
	return nil
}

// subscriber is a browser's side of a subscription: its key pair and
// auth secret.
type subscriber struct {
	key  *ecdh.PrivateKey
	auth []byte
}

func newSubscriber(tb testing.TB) subscriber {
	k, err := ecdh.P256().GenerateKey(nil)
	if err != nil {
		tb.Fatal(err)
	}
	return subscriber{key: k, auth: bytes.Repeat([]byte{0x5a}, 16)}
}

func (s subscriber) address(endpoint string) string {
	return WebPushAddress(endpoint, s.key.PublicKey().Bytes(), s.auth)
}

var eceOnce sync.Once

// eceDecrypt opens body with http_ece under Node, as the subscription's
// browser would (push/testdata/ece).
func eceDecrypt(tb testing.TB, s subscriber, body []byte) ([]byte, error) {
	tb.Helper()
	for _, p := range []string{"node", "npm"} {
		if _, err := exec.LookPath(p); err != nil {
			servicetest.Unavailable(tb, p, err)
		}
	}
	dir := filepath.Join("testdata", "ece")
	eceOnce.Do(func() {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "http_ece")); err == nil {
			return
		}
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	})
	enc := base64.RawURLEncoding
	in, _ := json.Marshal(map[string]string{"body": enc.EncodeToString(body), "private": enc.EncodeToString(s.key.Bytes()), "auth": enc.EncodeToString(s.auth)})
	cmd := exec.Command("node", "decrypt.js")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, stderr.String())
	}
	return out, nil
}

func testVAPID(tb testing.TB) *webpush.VAPID {
	tb.Helper()
	key, err := webpush.GenerateVAPIDKey()
	if err != nil {
		tb.Fatal(err)
	}
	v, err := webpush.NewVAPID(key, "mailto:ops@relay.example")
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// TestWebPushReceived: a webpush wake and a UnifiedPush wake with keys
// reach the push service signed with a VAPID token it accepts, with RFC
// 8030's headers, and their bodies open with http_ece under the
// subscription's key to exactly the content-free wake. The checks can
// fail: another subscription's key, a changed byte and an expired token
// are each refused.
func TestWebPushReceived(t *testing.T) {
	svc := newPushService(t, nil)
	vapid := testVAPID(t)
	q := newQueue(t, Config{AllowPrivate: true, WebPush: WebPushConfig{VAPID: vapid}}, nil)
	if !q.Enabled(device.PushWebPush) {
		t.Fatal("webpush is not enabled with a VAPID key")
	}
	sub := newSubscriber(t)
	for _, kind := range []string{device.PushWebPush, device.PushUnifiedPush} {
		j := Job{Household: "hh-" + kind, Device: "phone", Target: device.PushTarget{Kind: kind, Address: sub.address(svc.srv.URL + "/" + kind)}}
		if err := q.CheckTarget(context.Background(), j.Target); err != nil {
			t.Fatalf("%s target: %v", kind, err)
		}
		q.Enqueue(j)
	}
	waitFor(t, "both pushes sent", func() bool { return q.Stats().Sent == 2 })
	got := svc.received()
	if len(got) != 2 {
		t.Fatalf("the push service got %d pushes, want 2", len(got))
	}
	for _, r := range got {
		if r.vapid != nil {
			t.Errorf("%s: VAPID refused: %v", r.path, r.vapid)
		}
		h := r.header
		if h.Get("Content-Encoding") != "aes128gcm" || h.Get("TTL") != "86400" || h.Get("Urgency") != "high" || h.Get("Topic") != "wake" ||
			h.Get("Content-Type") != "application/octet-stream" {
			t.Errorf("%s: headers %v", r.path, h)
		}
		plain, err := eceDecrypt(t, sub, r.body)
		if err != nil || string(plain) != WakeBody {
			t.Errorf("%s: http_ece opened %q, %v; want %q", r.path, plain, err, WakeBody)
		}
	}

	// The checks fail where they must.
	body := got[0].body
	if _, err := eceDecrypt(t, newSubscriber(t), body); err == nil {
		t.Error("another subscription's key opened the body")
	}
	tampered := bytes.Clone(body)
	tampered[len(tampered)-1] ^= 1
	if _, err := eceDecrypt(t, sub, tampered); err == nil {
		t.Error("a changed body opened")
	}
	old, _ := vapid.Authorization("http://elsewhere.invalid/x", time.Now().Add(-25*time.Hour))
	if err := checkVAPID(old, "http://elsewhere.invalid", time.Now()); err == nil {
		t.Error("an expired VAPID token passed the check")
	}
	if err := checkVAPID(got[0].header.Get("Authorization"), "https://another.example", time.Now()); err == nil {
		t.Error("a token for another push service passed the check")
	}
}

// TestWebPushAnswers: 404 and 410 clear the target, 429 with Retry-After
// is retried after it, as for every provider.
func TestWebPushAnswers(t *testing.T) {
	svc := newPushService(t, func(path string, n int) (int, string) {
		switch path {
		case "/gone404":
			return 404, ""
		case "/gone410":
			return 410, ""
		case "/busy":
			if n == 1 {
				return 429, "1"
			}
		}
		return 201, ""
	})
	var gone goneRecorder
	q := newQueue(t, Config{AllowPrivate: true, MaxAttempts: 3, RetryBase: 10 * time.Millisecond, Timeout: 10 * time.Second,
		WebPush: WebPushConfig{VAPID: testVAPID(t)}}, gone.onGone)
	sub := newSubscriber(t)
	for _, p := range []string{"/gone404", "/gone410", "/busy"} {
		q.Enqueue(Job{Household: "hh" + p, Device: "d", Target: device.PushTarget{Kind: device.PushWebPush, Address: sub.address(svc.srv.URL + p)}})
	}
	waitFor(t, "every push ended", func() bool { s := q.Stats(); return s.Sent+s.Failed == 3 })
	if g := gone.got(); len(g) != 2 {
		t.Errorf("%d targets cleared, want the 404's and the 410's", len(g))
	}
	var busy []time.Time
	for _, r := range svc.received() {
		if r.path == "/busy" {
			busy = append(busy, r.at)
		}
	}
	if len(busy) != 2 || busy[1].Sub(busy[0]) < time.Second || q.Stats().Sent != 1 {
		t.Errorf("/busy was tried at %v and %d sent; want 2 tries, the second a Retry-After (1 s) later", busy, q.Stats().Sent)
	}
}

// TestWebPushTargets: a webpush target needs an endpoint with good keys;
// the endpoint's address rules are UnifiedPush's.
func TestWebPushTargets(t *testing.T) {
	sub := newSubscriber(t)
	r := fakeResolver{"push.example": {"93.184.216.34"}, "internal.example": {"10.0.0.1"}}
	good := sub.address("https://push.example/p")
	short := WebPushAddress("https://push.example/p", sub.key.PublicKey().Bytes(), sub.auth[:15])
	offCurve := bytes.Clone(sub.key.PublicKey().Bytes())
	offCurve[64] ^= 1
	for _, tc := range []struct {
		addr string
		want error
	}{
		{good, nil},
		{"https://push.example/p", ErrInvalidTarget},
		{short, ErrInvalidTarget},
		{WebPushAddress("https://push.example/p", offCurve, sub.auth), ErrInvalidTarget},
		{sub.address("https://internal.example/p"), ErrForbiddenAddress},
		{sub.address("ftp://push.example/p"), ErrInvalidEndpoint},
	} {
		err := checkTarget(context.Background(), device.PushTarget{Kind: device.PushWebPush, Address: tc.addr}, false, r)
		if !errors.Is(err, tc.want) && (tc.want != nil || err != nil) {
			t.Errorf("%q: %v, want %v", strings.ReplaceAll(tc.addr, "\n", " "), err, tc.want)
		}
	}
}

// TestWebPushSendRefusesPrivate: a Web Push target (webpush, and
// unifiedpush with keys) goes through UnifiedPush's guarded dialer: names
// that resolve inside, and internal addresses, are refused at send time,
// and nothing reaches the loopback service behind them.
func TestWebPushSendRefusesPrivate(t *testing.T) {
	svc := newPushService(t, nil)
	port := svc.srv.Listener.Addr().(*net.TCPAddr).Port
	resolver := fakeResolver{"rebind.example": {"127.0.0.1"}, "lan.example": {"10.0.0.1"}}
	sub := newSubscriber(t)
	q := newQueue(t, Config{UnifiedPush: UnifiedPushConfig{Resolver: resolver}, WebPush: WebPushConfig{VAPID: testVAPID(t)}}, nil)
	q.providers[device.PushUnifiedPush].(*unifiedPush).dialer.afterCheck = loopbackOnly
	targets := []string{
		svc.srv.URL + "/direct",
		fmt.Sprintf("http://rebind.example:%d/rebind", port),
		fmt.Sprintf("http://[::1]:%d/v6", port),
		fmt.Sprintf("http://lan.example:%d/lan", port),
		"http://169.254.169.254/latest/meta-data",
	}
	n := 0
	for _, kind := range []string{device.PushWebPush, device.PushUnifiedPush} {
		for _, u := range targets {
			q.Enqueue(Job{Household: fmt.Sprint("hh", n), Device: "d", Target: device.PushTarget{Kind: kind, Address: sub.address(u)}})
			n++
		}
	}
	waitFor(t, "pushes refused", func() bool { return q.Stats().Failed == uint64(n) })
	if s := closeQueue(t, q); s.Sent != 0 || s.Gone != 0 || s.Retried != 0 {
		t.Errorf("stats %+v; want every push failed, none gone or retried", s)
	}
	if got := svc.received(); len(got) != 0 {
		t.Errorf("the loopback push service received %d pushes", len(got))
	}
}

// TestWebPushHangingEndpoint: a Web Push endpoint that never answers
// costs its own household, within the attempt bound, not the others.
func TestWebPushHangingEndpoint(t *testing.T) {
	gate := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-gate:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(gate); hang.Close() })
	healthy := newPushService(t, nil)
	sub := newSubscriber(t)
	q := newQueue(t, Config{Workers: 4, HouseholdInFlight: 2, AllowPrivate: true, ResponseHeaderTimeout: 300 * time.Millisecond,
		AttemptTimeout: time.Second, WebPush: WebPushConfig{VAPID: testVAPID(t)}}, nil)
	for i := range 6 {
		q.Enqueue(Job{Household: "A", Device: fmt.Sprint("a", i), Target: device.PushTarget{Kind: device.PushWebPush, Address: sub.address(hang.URL + fmt.Sprint("/a", i))}})
	}
	start := time.Now()
	q.Enqueue(Job{Household: "B", Device: "b", Target: device.PushTarget{Kind: device.PushWebPush, Address: sub.address(healthy.srv.URL + "/b")}})
	waitFor(t, "B's push sent", func() bool { return q.Stats().Sent == 1 })
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("B's push took %v behind A's hanging endpoints", took)
	}
	waitFor(t, "A's pushes given up", func() bool { return q.Stats().Failed == 6 })
}
