//go:build linux

package clients

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/pairtest"
	"github.com/flamenet/relay/internal/procstat"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/relay"
	"github.com/flamenet/relay/token"
)

// pageResult is what testdata/browser/page.js reports.
type pageResult struct {
	OK         bool   `json:"ok"`
	Error      string `json:"error"`
	Registered struct {
		Device string `json:"device"`
	} `json:"registered"`
	Sent struct {
		ID         string `json:"id"`
		Deliveries []struct {
			Device string `json:"device"`
			Seq    int64  `json:"seq"`
		} `json:"deliveries"`
	} `json:"sent"`
	Got []struct {
		Seq     int64  `json:"seq"`
		ID      string `json:"id"`
		From    string `json:"from"`
		Payload string `json:"payload"`
	} `json:"got"`
	Cursor       int64   `json:"cursor"`
	Unknown      refusal `json:"unknown"`
	Limited      refusal `json:"limited"`
	Unauthorized refusal `json:"unauthorized"`
}

type refusal struct {
	Name       string `json:"name"`
	Status     int    `json:"status"`
	Code       string `json:"code"`
	Limit      string `json:"limit"`
	RetryAfter int    `json:"retryAfter"`
}

// TestBrowserCORS loads a page into headless Chromium from one origin (a
// server of this test) that imports the compiled TypeScript client and
// talks to a relay on another origin (another port): with the page's
// origin in FN_CORS_ORIGINS it registers, sends, listens and reads the
// relay's refusals with their Retry-After; with FN_CORS_ORIGINS empty the
// browser withholds every answer and the page reports the failure.
func TestBrowserCORS(t *testing.T) {
	chromium := need(t, "chromium", "/usr/bin/chromium", "chromium-browser")
	buildTypeScript(t)

	t.Run("allowed", func(t *testing.T) {
		res := runPage(t, chromium, true)
		if !res.OK {
			t.Fatalf("the page failed: %+v", res)
		}
		if len(res.Got) != 1 || res.Got[0].Payload != "hello from the browser" || res.Got[0].From != "laptop" ||
			res.Got[0].ID != res.Sent.ID || res.Got[0].Seq != 1 || res.Cursor != 1 {
			t.Errorf("the page listened to %+v (cursor %d), sent %+v", res.Got, res.Cursor, res.Sent)
		}
		if res.Registered.Device != "phone" {
			t.Errorf("registered %+v", res.Registered)
		}
		if res.Unknown != (refusal{Name: "RelayError", Status: 404, Code: "unknown_device"}) {
			t.Errorf("a send to an unknown device: %+v", res.Unknown)
		}
		if l := res.Limited; l.Status != 429 || l.Code != "rate_limited" || l.Limit != "household_send_rate" || l.RetryAfter < 1 {
			t.Errorf("a refused send (Retry-After must be readable): %+v", l)
		}
		if res.Unauthorized != (refusal{Name: "RelayError", Status: 401, Code: "unauthorized"}) {
			t.Errorf("a bad token: %+v", res.Unauthorized)
		}
	})

	t.Run("not allowed", func(t *testing.T) {
		res := runPage(t, chromium, false)
		if res.OK || !strings.HasPrefix(res.Error, "NoAnswerError:") {
			t.Fatalf("without CORS the page reported %+v, want a NoAnswerError", res)
		}
	})
}

// runPage serves the page, starts a relay (allowing the page's origin or
// not), opens the page in Chromium and returns what it reported.
func runPage(t *testing.T, chromium string, allow bool) pageResult {
	results, cfg, page := servePage(t)

	env := []string{"FN_HOUSEHOLD_SEND_BURST=2", "FN_HOUSEHOLD_SEND_RATE=0.001"} // the page's third send is a 429
	if allow {
		env = append(env, "FN_CORS_ORIGINS="+page.URL)
	}
	relay := startRelay(t, env...)
	if !strings.HasPrefix(relay.URL, "http://127.0.0.1:") || relay.URL == page.URL {
		t.Fatalf("relay %s and page %s must be two origins on loopback", relay.URL, page.URL)
	}
	conf, err := json.Marshal(map[string]any{
		"relay": relay.URL, "timeoutMs": 20000,
		"phone": relay.token(t, "home", "phone"), "laptop": relay.token(t, "home", "laptop"),
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store(&conf)

	var res pageResult
	b := openPage(t, chromium, page.URL+"/", results)
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("the page reported %q: %v", b, err)
	}
	t.Logf("the page reported %s", b)
	return res
}

// servePage serves the browser pages (pageMux) and their config
// (serveConfig) until the test ends; results gets what a page reports.
func servePage(t *testing.T) (results chan []byte, cfg *atomic.Pointer[[]byte], page *httptest.Server) {
	results = make(chan []byte, 1)
	mux := pageMux(results)
	cfg = serveConfig(mux)
	page = httptest.NewServer(mux)
	t.Cleanup(page.Close)
	return results, cfg, page
}

// serveConfig answers GET /config.json on mux with what the returned
// pointer holds, stored once the test knows it (the relay runs after the
// page's server started; the page reads it through Chromium, which the
// race detector cannot see).
func serveConfig(mux *http.ServeMux) *atomic.Pointer[[]byte] {
	var cfg atomic.Pointer[[]byte]
	mux.HandleFunc("GET /config.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(*cfg.Load())
	})
	return &cfg
}

// pageMux serves testdata/browser at /, the compiled client at /client/
// and its dependencies at /node_modules/ (the pages map them with an
// import map), and sends what a page POSTs to /result to results.
func pageMux(results chan<- []byte) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /", http.FileServer(http.Dir(filepath.Join("testdata", "browser"))))
	mux.Handle("GET /client/", http.StripPrefix("/client/", http.FileServer(http.Dir(filepath.Join(tsDir, "dist")))))
	mux.Handle("GET /node_modules/", http.StripPrefix("/node_modules/", http.FileServer(http.Dir(filepath.Join(tsDir, "node_modules")))))
	mux.HandleFunc("POST /result", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		select {
		case results <- b:
		default:
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// openPage opens url in headless Chromium and returns what the page
// POSTed to /result (received on results); Chromium and all its helpers
// are ended before it returns.
func openPage(t *testing.T, chromium, url string, results <-chan []byte) []byte {
	t.Helper()
	profile := t.TempDir()
	var out bytes.Buffer
	cmd := exec.Command(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir="+profile, url)
	cmd.Stdout, cmd.Stderr = &out, &out
	// Its own process group: Chromium's helpers are ended with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	dieWithTest(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		noneLeft(t, profile)
	}
	t.Cleanup(stop)

	var b []byte
	select {
	case b = <-results:
	case err := <-exited:
		exited <- err
		t.Fatalf("chromium exited (%v) before the page reported:\n%s", err, out.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("no report from the page within 60 s; chromium said:\n%s", out.String())
	}
	stop()
	return b
}

// noneLeft fails the test if a process of the Chromium profile still runs.
func noneLeft(t *testing.T, profile string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := procstat.WithArg("--user-data-dir=" + profile)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("chromium processes left running: %v", left)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBrowserTabsRenew: two frames of one origin in headless Chromium (to
// localStorage and Web Locks, two tabs) hold one stored set of
// credentials and renew it at the same instants, round after round,
// against a relay that pairs. Under the store's Web Lock each round makes
// one renewal and the other frame takes up the set it saved: both frames
// end on the same live set, which the relay still renews. Without the
// lock both present the same secret, the second use revokes the first's
// new secret, and the next round presents a revoked one, which revokes
// the family: a frame reports unauthorized.
func TestBrowserTabsRenew(t *testing.T) {
	chromium := need(t, "chromium", "/usr/bin/chromium", "chromium-browser")
	buildTypeScript(t)

	results, cfg, page := servePage(t)
	relayURL, key := pairtest.StartRelay(t, pairtest.NewClock(), func(c *relay.Config, key ed25519.PrivateKey) {
		c.IssuerKey = key
		c.CORSOrigins = []string{page.URL}
	})
	now := time.Now()
	admin, err := token.Mint(key, token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: now, Expires: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	var inv struct{ Code string }
	postJSON(t, relayURL+"/v1/invitations", admin, `{"device":"browser"}`, http.StatusCreated, &inv)
	const rounds = 6
	conf, _ := json.Marshal(map[string]any{"relay": relayURL, "code": inv.Code, "rounds": rounds})
	cfg.Store(&conf)

	b := openPage(t, chromium, page.URL+"/index.html?run=/tabs.js", results)
	var res struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
		Locks bool   `json:"locks"`
		Saved string `json:"saved"`
		Tabs  []struct {
			Tab    int    `json:"tab"`
			OK     bool   `json:"ok"`
			Error  string `json:"error"`
			Secret string `json:"secret"`
		} `json:"tabs"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("the page reported %q: %v", b, err)
	}
	t.Logf("the page reported %s", b)
	if !res.OK || !res.Locks || len(res.Tabs) != 2 {
		t.Fatalf("two tabs renewing one store: %s", b)
	}
	for _, tab := range res.Tabs {
		if tab.Secret != res.Saved {
			t.Errorf("tab %d ended on another set than the store holds", tab.Tab)
		}
	}
	var next struct {
		RenewalSecret string `json:"renewal_secret"`
	}
	postJSON(t, relayURL+"/v1/renew", "", `{"renewal_secret":"`+res.Saved+`"}`, http.StatusOK, &next)
}

// postJSON posts body and decodes the answer, which must have status want.
func postJSON(t *testing.T, url, tok, body string, want int, out any) {
	t.Helper()
	callJSON(t, http.MethodPost, url, tok, strings.NewReader(body), want, out)
}

// callJSON makes one request with tok (if any) and decodes the answer,
// which must have status want, into out.
func callJSON(t *testing.T, method, url, tok string, body io.Reader, want int, out any) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d %s, want %d", method, url, resp.StatusCode, b, want)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s %s: %s: %v", method, url, b, err)
	}
}

// bareImport is an import of one of the client's packages by name, which a
// module service worker (no import map reaches it) cannot resolve.
var bareImport = regexp.MustCompile(`((?:from|import)\s*\(?\s*)(["'])(@hpke/core|@hpke/common|@noble/curves/|@noble/hashes/|@flamenet/relay-client)`)

// bundled serves dir's files with the client's package imports made
// paths, as an app's bundler would for its service worker.
func bundled(dir string) http.Handler {
	paths := map[string]string{
		"@hpke/core": "/node_modules/@hpke/core/esm/mod.js", "@hpke/common": "/node_modules/@hpke/common/esm/mod.js",
		"@noble/curves/": "/node_modules/@noble/curves/", "@noble/hashes/": "/node_modules/@noble/hashes/",
		"@flamenet/relay-client": "/client/index.js",
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := filepath.Join(dir, filepath.FromSlash(path.Clean("/"+r.URL.Path)))
		b, err := os.ReadFile(name)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		if strings.HasSuffix(name, ".js") {
			b = bareImport.ReplaceAllFunc(b, func(m []byte) []byte {
				sub := bareImport.FindSubmatch(m)
				return []byte(string(sub[1]) + string(sub[2]) + paths[string(sub[3])])
			})
			w.Header().Set("Content-Type", "text/javascript")
		}
		_, _ = w.Write(b)
	})
}

// TestBrowserPushWorker: the TypeScript docs' push worker
// (typescript/examples/push-worker.js), registered by a page in headless
// Chromium, is handed a push through the DevTools protocol
// (ServiceWorker.deliverPushMessage), as the browser does once it has
// decrypted one from its push service. The worker polls the relay once,
// opens the sealed envelope a laptop sent with the device's identity,
// shows it as a notification (read back through getNotifications()) and
// acknowledges it. What headless Chromium here cannot do is subscribe at
// a vendor's push service (pushManager.subscribe): this machine reaches
// none, so the relay's own Web Push is tested against a push service of
// the tests' own (package push) and this test starts at the browser's
// side of the push.
func TestBrowserPushWorker(t *testing.T) {
	buildTypeScript(t)
	b := servicetest.Chromium(t, 800, 600)
	mux := http.NewServeMux()
	cfg := serveConfig(mux)
	mux.Handle("GET /", http.FileServer(http.Dir(filepath.Join("testdata", "browser"))))
	mux.Handle("GET /client/", http.StripPrefix("/client/", bundled(filepath.Join(tsDir, "dist"))))
	mux.Handle("GET /node_modules/", http.StripPrefix("/node_modules/", bundled(filepath.Join(tsDir, "node_modules"))))
	mux.Handle("GET /push-worker.js", http.StripPrefix("/", bundled(filepath.Join(tsDir, "examples"))))
	page := httptest.NewServer(mux)
	t.Cleanup(page.Close)
	relay := startRelay(t, "FN_CORS_ORIGINS="+page.URL)
	const plaintext = "hello from the laptop, while the tab was closed"
	phone := relay.token(t, "home", "phone")
	conf, _ := json.Marshal(map[string]any{"relay": relay.URL, "phone": phone, "laptop": relay.token(t, "home", "laptop"), "plaintext": plaintext})
	cfg.Store(&conf)

	b.Navigate(page.URL + "/index.html?run=/push-page.js")
	b.WaitFor("the worker registered and told the device", `window.pushReady === true || window.pushError`)
	var failed string
	b.Eval(`window.pushError || ""`, &failed)
	if failed != "" {
		t.Fatalf("the page: %s", failed)
	}
	b.Call("ServiceWorker.enable", nil, nil)
	var registration string
	deadline := time.Now().Add(10 * time.Second)
	for registration == "" && time.Now().Before(deadline) {
		for _, ev := range b.Events("ServiceWorker.workerRegistrationUpdated") {
			var p struct {
				Registrations []struct {
					RegistrationID string `json:"registrationId"`
					ScopeURL       string `json:"scopeURL"`
				} `json:"registrations"`
			}
			_ = json.Unmarshal(ev, &p)
			for _, r := range p.Registrations {
				if r.ScopeURL == page.URL+"/" {
					registration = r.RegistrationID
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if registration == "" {
		t.Fatal("DevTools named no registration of the worker")
	}
	b.CallBrowser("Browser.grantPermissions", map[string]any{"origin": page.URL, "permissions": []string{"notifications"}}, nil)
	// Chromium, loaded, has been seen to drop a push delivered through
	// DevTools (no push event, no notification), three times running
	// under a full race-detector run: the push is delivered again after
	// 10 s without one, as a push service retries. A second
	// push finds the envelope still there, unacknowledged until shown.
	for attempt := 1; ; attempt++ {
		b.Call("ServiceWorker.deliverPushMessage", map[string]any{"origin": page.URL, "registrationId": registration, "data": ""}, nil)
		var seen bool
		for deadline := time.Now().Add(10 * time.Second); !seen && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			b.Eval(`!!(window.shown || window.pushError)`, &seen)
		}
		if seen {
			break
		}
		if attempt == 5 {
			t.Fatal("no notification after five pushes, 10 s apart")
		}
		t.Logf("no notification 10 s after push %d: delivering it again", attempt)
	}
	var shown []struct{ Title, Body string }
	b.Eval(`window.shown || []`, &shown)
	if len(shown) != 1 || shown[0].Body != plaintext || shown[0].Title != "From laptop" {
		b.Eval(`window.pushError || ""`, &failed)
		t.Fatalf("notifications %+v (%s), want one from laptop with the sealed plaintext", shown, failed)
	}
	// Acknowledged once shown: the relay holds nothing more for phone.
	var poll struct {
		Cursor    int64             `json:"cursor"`
		Envelopes []json.RawMessage `json:"envelopes"`
	}
	callJSON(t, http.MethodGet, relay.URL+"/v1/poll?wait=0", phone, nil, http.StatusOK, &poll)
	if poll.Cursor != 1 || len(poll.Envelopes) != 0 {
		t.Errorf("after the worker: cursor %d, %d envelopes waiting; want the envelope acknowledged", poll.Cursor, len(poll.Envelopes))
	}
}

// TestBrowserStream: a page in headless Chromium on one origin listens
// with the TypeScript client to a relay on another (through a proxy of
// this test that counts requests) while the page's other device sends:
// every envelope arrives once and in order over one stream, opened with
// one preflight. Polling, each poll's new cursor in its URL would be a
// preflight of its own.
func TestBrowserStream(t *testing.T) {
	chromium := need(t, "chromium", "/usr/bin/chromium", "chromium-browser")
	buildTypeScript(t)

	results, cfg, page := servePage(t)
	relay := startRelay(t, "FN_CORS_ORIGINS="+page.URL)

	var mu sync.Mutex
	counts := map[string]int{}
	target, err := url.Parse(relay.URL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		counts[r.Method+" "+r.URL.Path]++
		mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)

	const count = 5
	conf, err := json.Marshal(map[string]any{
		"relay": front.URL, "timeoutMs": 30000, "count": count,
		"phone": relay.token(t, "home", "phone"), "laptop": relay.token(t, "home", "laptop"),
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store(&conf)

	b := openPage(t, chromium, page.URL+"/?run=/stream-page.js", results)
	t.Logf("the page reported %s", b)
	var res struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
		Got   []struct {
			Seq     int64  `json:"seq"`
			Payload string `json:"payload"`
		} `json:"got"`
		States []string `json:"states"`
		Cursor int64    `json:"cursor"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("the page reported %q: %v", b, err)
	}
	if !res.OK {
		t.Fatalf("the page failed: %+v", res)
	}
	for i, e := range res.Got {
		if e.Seq != int64(i+1) || e.Payload != fmt.Sprintf("m%d", i+1) {
			t.Errorf("envelope %d: %+v", i, e)
		}
	}
	if res.Cursor != count {
		t.Errorf("cursor %d, want %d", res.Cursor, count)
	}
	if len(res.States) < 2 || res.States[0] != "connecting/stream" || res.States[1] != "connected/stream" {
		t.Errorf("states %v, want connecting/stream then connected/stream", res.States)
	}
	mu.Lock()
	defer mu.Unlock()
	if counts["OPTIONS /v1/stream"] != 1 || counts["GET /v1/stream"] != 1 {
		t.Errorf("requests %v: want one stream, opened with one preflight", counts)
	}
	if n := counts["GET /v1/poll"] + counts["OPTIONS /v1/poll"]; n != 0 {
		t.Errorf("requests %v: the page polled", counts)
	}
}
