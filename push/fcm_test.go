package push

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
)

const (
	testProject = "flame-test"
	testEmail   = "relay@flame-test.iam.gserviceaccount.com"
	testKeyRef  = "key-1"
)

// fcmFake speaks Google's OAuth token endpoint (JWT bearer grant, RS256
// assertion verified with the service account's public key) and FCM HTTP
// v1's messages:send (bearer token, message shape). A request that fails
// a check gets 400 and a problem note.
type fcmFake struct {
	srv        *httptest.Server
	pub        *rsa.PublicKey
	expiresIn  int           // 0: the answer has no expires_in
	tokenDelay time.Duration // a real token endpoint is not instant
	// tokenStatus, when set, answers every valid token request with it
	// and a Retry-After of 7 seconds.
	tokenStatus int
	answer      func(regToken string, n int) (status int, body, retryAfter string)
	exchanges   atomic.Int64

	mu       sync.Mutex
	valid    map[string]bool
	hits     map[string]int
	problems []string
}

func newFCMFake(tb testing.TB, answer func(string, int) (int, string, string)) *fcmFake {
	tb.Helper()
	f := &fcmFake{pub: &rsaKey().PublicKey, expiresIn: 3600, answer: answer, valid: map[string]bool{}, hits: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /token", f.token)
	mux.HandleFunc("POST /v1/projects/{project}/messages:send", f.send)
	f.srv = httptest.NewServer(mux)
	tb.Cleanup(f.srv.Close)
	return f
}

func (f *fcmFake) tokenURL() string { return f.srv.URL + "/token" }

func (f *fcmFake) problem(w http.ResponseWriter, format string, args ...any) {
	f.mu.Lock()
	f.problems = append(f.problems, fmt.Sprintf(format, args...))
	f.mu.Unlock()
	w.WriteHeader(http.StatusBadRequest)
}

func (f *fcmFake) token(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.PostForm.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		f.problem(w, "token form %v (%v)", r.PostForm, err)
		return
	}
	header, claims, input, sig, err := jwtParts(r.PostForm.Get("assertion"))
	if err != nil {
		f.problem(w, "assertion: %v", err)
		return
	}
	if header["alg"] != "RS256" || header["typ"] != "JWT" || header["kid"] != testKeyRef {
		f.problem(w, "assertion header %v", header)
		return
	}
	iat, err1 := claims["iat"].(json.Number).Int64()
	exp, err2 := claims["exp"].(json.Number).Int64()
	if claims["iss"] != testEmail || claims["scope"] != "https://www.googleapis.com/auth/firebase.messaging" ||
		claims["aud"] != f.tokenURL() || err1 != nil || err2 != nil || exp <= iat || exp-iat > 3600 {
		f.problem(w, "assertion claims %v", claims)
		return
	}
	sum := sha256.Sum256([]byte(input))
	if err := rsa.VerifyPKCS1v15(f.pub, crypto.SHA256, sum[:], sig); err != nil {
		f.problem(w, "assertion signature: %v", err)
		return
	}
	if f.tokenDelay > 0 {
		select {
		case <-time.After(f.tokenDelay):
		case <-r.Context().Done():
			return
		}
	}
	n := f.exchanges.Add(1)
	w.Header().Set("Content-Type", "application/json")
	if f.tokenStatus != 0 {
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(f.tokenStatus)
		fmt.Fprint(w, `{"error":"SECRET-endpoint-text"}`)
		return
	}
	at := fmt.Sprintf("ya29.test-%d", n)
	f.mu.Lock()
	f.valid[at] = true
	f.mu.Unlock()
	if f.expiresIn == 0 {
		fmt.Fprintf(w, `{"access_token":%q,"token_type":"Bearer"}`, at)
		return
	}
	fmt.Fprintf(w, `{"access_token":%q,"expires_in":%d,"token_type":"Bearer"}`, at, f.expiresIn)
}

func (f *fcmFake) send(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	if r.PathValue("project") != testProject {
		f.problem(w, "project %q", r.PathValue("project"))
		return
	}
	at, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	f.mu.Lock()
	valid := f.valid[at]
	f.mu.Unlock()
	if !valid {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":{"code":401,"status":"UNAUTHENTICATED"}}`)
		return
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		f.problem(w, "body %q: %v", raw, err)
		return
	}
	msg, _ := got["message"].(map[string]any)
	regToken, _ := msg["token"].(string)
	want := map[string]any{"message": map[string]any{
		"token":   regToken,
		"data":    map[string]any{"wake": "1"},
		"android": map[string]any{"priority": "high"},
	}}
	if regToken == "" || !reflect.DeepEqual(got, want) || strings.Contains(string(raw), marker) {
		f.problem(w, "message %s", raw)
		return
	}
	f.mu.Lock()
	f.hits[regToken]++
	n := f.hits[regToken]
	f.mu.Unlock()
	status, body, after := http.StatusOK, `{"name":"projects/flame-test/messages/1"}`, ""
	if f.answer != nil {
		status, body, after = f.answer(regToken, n)
	}
	if after != "" {
		w.Header().Set("Retry-After", after)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprint(w, body)
}

func (f *fcmFake) check(tb testing.TB) {
	tb.Helper()
	reportProblems(tb, &f.mu, "FCM", &f.problems)
}

func (f *fcmFake) hitsFor(tok string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits[tok]
}

// credentials writes a service-account file whose token_uri is tokenURI.
func credentials(tb testing.TB, tokenURI string) string {
	tb.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(rsaKey())
	if err != nil {
		tb.Fatal(err)
	}
	b, _ := json.Marshal(map[string]string{
		"type":           "service_account",
		"project_id":     testProject,
		"private_key_id": testKeyRef,
		"private_key":    string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email":   testEmail,
		"token_uri":      tokenURI,
	})
	return writeFile(tb, "service-account.json", b)
}

func fcmError(code int, status, fcmCode string) string {
	return fmt.Sprintf(`{"error":{"code":%d,"message":"test","status":%q,"details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":%q}]}}`,
		code, status, fcmCode)
}

// The access token is fetched once and reused by every worker. Making a
// new token source for every push in accessToken (done once on purpose)
// turns this red with one exchange per push.
func TestFCM(t *testing.T) {
	fake := newFCMFake(t, func(tok string, n int) (int, string, string) {
		switch tok {
		case "gone":
			return 404, fcmError(404, "NOT_FOUND", "UNREGISTERED"), ""
		case "busy":
			if n == 1 {
				return 429, fcmError(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"), "1"
			}
		case "down":
			return 503, fcmError(503, "UNAVAILABLE", "UNAVAILABLE"), ""
		case "invalid":
			return 400, fcmError(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT"), ""
		case "bare404": // not FCM's answer (a wrong URL): no clearing
			return 404, "", ""
		}
		return 200, `{"name":"projects/flame-test/messages/1"}`, ""
	})
	// Slow enough that the workers' first pushes all wait on one
	// exchange; without the cache each would make its own.
	fake.tokenDelay = 100 * time.Millisecond
	var g goneRecorder
	q := newQueue(t, Config{MaxAttempts: 2, RetryBase: 10 * time.Millisecond,
		FCM: FCMConfig{CredentialsFile: credentials(t, fake.tokenURL()), URL: fake.srv.URL}}, g.onGone)

	tokens := []string{"gone", "busy", "down", "invalid", "bare404"}
	for i := range 20 {
		tokens = append(tokens, fmt.Sprint("ok-", i))
	}
	for i, tok := range tokens {
		if !q.Enqueue(Job{Household: "home", Device: fmt.Sprint("d", i), Target: device.PushTarget{Kind: device.PushFCM, Address: tok}}) {
			t.Fatalf("Enqueue %s refused", tok)
		}
	}
	waitFor(t, "every push ended", func() bool { s := q.Stats(); return s.Sent+s.Failed == uint64(len(tokens)) })
	s := closeQueue(t, q)
	fake.check(t)

	if s.Sent != 21 || s.Gone != 1 || s.Failed != 4 || s.Retried != 2 {
		t.Errorf("stats %+v; want sent 21, gone 1, failed 4 (gone included), retried 2", s)
	}
	for tok, want := range map[string]int{"gone": 1, "busy": 2, "down": 2, "invalid": 1, "bare404": 1, "ok-0": 1, "ok-19": 1} {
		if got := fake.hitsFor(tok); got != want {
			t.Errorf("%s: %d requests, want %d", tok, got, want)
		}
	}
	if got := g.got(); len(got) != 1 || got[0].Target.Address != "gone" {
		t.Errorf("onGone calls %+v, want the gone token's job once", got)
	}
	if n := fake.exchanges.Load(); n != 1 {
		t.Errorf("%d token exchanges, want 1 (fetched once, then reused)", n)
	}
}

// FN_FCM_TOKEN_URL wins over the file's token_uri.
func TestFCMTokenURLOverride(t *testing.T) {
	fake := newFCMFake(t, nil)
	f, err := newFCM(FCMConfig{
		CredentialsFile: credentials(t, "https://oauth2.invalid/token"),
		URL:             fake.srv.URL,
		TokenURL:        fake.tokenURL(),
	}, DefaultResponseHeaderTimeout, DefaultAttemptTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Push(context.Background(), "ok"); err != nil {
		t.Fatalf("Push: %v", err)
	}
	fake.check(t)
	if fake.exchanges.Load() != 1 {
		t.Errorf("%d exchanges, want 1", fake.exchanges.Load())
	}
}

// The access token is kept until five minutes before it expires: one
// that lives 310 s is reused, one that lives 299 s is renewed at once.
// oauth2's clock cannot be set, so lifetimes near the margin stand in for
// the passing of time.
func TestFCMTokenRenewal(t *testing.T) {
	for _, tc := range []struct {
		expiresIn int
		exchanges int64
	}{
		{3600, 1},
		{310, 1},
		{299, 3},
	} {
		t.Run(fmt.Sprint(tc.expiresIn), func(t *testing.T) {
			fake := newFCMFake(t, nil)
			fake.expiresIn = tc.expiresIn
			f, err := newFCM(FCMConfig{CredentialsFile: credentials(t, fake.tokenURL()), URL: fake.srv.URL}, DefaultResponseHeaderTimeout, DefaultAttemptTimeout)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for range 3 {
				if err := f.Push(context.Background(), "ok"); err != nil {
					t.Fatalf("Push: %v", err)
				}
			}
			if got := fake.exchanges.Load(); got != tc.exchanges {
				t.Errorf("%d exchanges for 3 pushes, want %d", got, tc.exchanges)
			}
			fake.check(t)
		})
	}
}

// A token endpoint's refusal is the push's failure, retried when the
// status says so, and never quotes the endpoint's answer. An answer
// without expires_in is refused rather than cached for ever.
func TestFCMTokenFailures(t *testing.T) {
	for _, tc := range []struct {
		name      string
		status    int // 0: a 200 without expires_in
		retryable bool
	}{
		{"503", http.StatusServiceUnavailable, true},
		{"429", http.StatusTooManyRequests, true},
		{"400", http.StatusBadRequest, false},
		{"no expiry", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFCMFake(t, nil)
			fake.tokenStatus = tc.status
			if tc.status == 0 {
				fake.expiresIn = 0
			}
			f, err := newFCM(FCMConfig{CredentialsFile: credentials(t, fake.tokenURL()), URL: fake.srv.URL}, DefaultResponseHeaderTimeout, DefaultAttemptTimeout)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for range 2 {
				err := f.Push(context.Background(), "ok")
				if err == nil {
					t.Fatal("Push succeeded")
				}
				if strings.Contains(err.Error(), "SECRET") {
					t.Errorf("error %q quotes the endpoint's answer", err)
				}
				var re *RetryableError
				if got := errors.As(err, &re); got != tc.retryable {
					t.Errorf("error %q retryable: %v, want %v", err, got, tc.retryable)
				} else if got && re.After != 7*time.Second {
					t.Errorf("retry after %v, want the endpoint's 7s", re.After)
				}
				var se *statusError
				if tc.status != 0 && (!errors.As(err, &se) || se.status != tc.status) {
					t.Errorf("error %q lacks status %d", err, tc.status)
				}
			}
			if got := fake.exchanges.Load(); got != 2 {
				t.Errorf("%d exchanges for 2 pushes, want 2 (nothing cached)", got)
			}
			if got := fake.total(); got != 0 {
				t.Errorf("%d messages sent without a token", got)
			}
			fake.check(t)
		})
	}
}

// A push whose deadline passes while the exchange runs returns then, and
// the exchange goes on: the next push finds its token cached. Calling the
// token source in the push's own goroutine (done once on purpose) turns
// this red: the push waits the whole exchange.
func TestFCMTokenWaitEndsWithPush(t *testing.T) {
	fake := newFCMFake(t, nil)
	fake.tokenDelay = 2 * time.Second
	f, err := newFCM(FCMConfig{CredentialsFile: credentials(t, fake.tokenURL()), URL: fake.srv.URL}, DefaultResponseHeaderTimeout, DefaultAttemptTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = f.Push(ctx, "ok")
	if took := time.Since(start); took > time.Second {
		t.Errorf("Push returned after %v, past its 200ms deadline", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Push = %v, want the deadline", err)
	}
	if err := f.Push(context.Background(), "ok"); err != nil {
		t.Fatalf("second Push: %v", err)
	}
	if got := fake.exchanges.Load(); got != 1 {
		t.Errorf("%d exchanges, want 1 (the first push's, finished and cached)", got)
	}
	fake.check(t)
}

// An access token the API refuses (401) is dropped and the push tried once
// more with a new one.
func TestFCMRevokedToken(t *testing.T) {
	fake := newFCMFake(t, nil)
	f, err := newFCM(FCMConfig{CredentialsFile: credentials(t, fake.tokenURL()), URL: fake.srv.URL}, DefaultResponseHeaderTimeout, DefaultAttemptTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx := context.Background()
	if err := f.Push(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	fake.mu.Lock()
	clear(fake.valid)
	fake.mu.Unlock()
	if err := f.Push(ctx, "ok"); err != nil {
		t.Fatalf("Push after revocation: %v", err)
	}
	if got := fake.exchanges.Load(); got != 2 {
		t.Errorf("%d exchanges, want 2", got)
	}
	fake.check(t)
}

func TestFCMBadCredentials(t *testing.T) {
	for _, tc := range []struct{ name, json string }{
		{"not json", "{"},
		{"no project", `{"client_email":"a@b","private_key":"x","token_uri":"http://127.0.0.1:1"}`},
		{"bad key", `{"project_id":"p","client_email":"a@b","private_key":"not pem","token_uri":"http://127.0.0.1:1"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := newFCM(FCMConfig{CredentialsFile: writeFile(t, "sa.json", []byte(tc.json))}, DefaultResponseHeaderTimeout, DefaultAttemptTimeout); err == nil {
				t.Error("newFCM accepted it")
			}
		})
	}
}
