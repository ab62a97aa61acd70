package deploy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/internal/console"
	"github.com/flamenet/relay/internal/servicetest"
)

// The TLS reverse proxy samples, run by the real caddy and nginx in front
// of the real relay binary.

const (
	caddySample = "deploy/caddy/Caddyfile"
	nginxSample = "deploy/nginx/relay.conf"
)

// frontProxy is one proxy sample and how to run it in a test.
type frontProxy struct {
	name, binary string
	// start runs the proxy on listen with TLS from cert and key in front of
	// upstream, writing what it needs in dir, and returns the command.
	start func(t *testing.T, bin, dir, listen, upstream, cert, key string) *exec.Cmd
}

var frontProxies = []frontProxy{
	{"caddy", "caddy", startCaddy},
	{"nginx", "nginx", startNginx},
}

// TestProxiesInFront runs each sample in front of the relay and holds a
// 60 s poll through it (answered by the relay, not cut by the proxy), has a
// held poll woken at once by a send through it, sees connections to the
// relay reused, and finds the client's address, as the proxy reports it,
// in the relay's access log, whatever the client claims. Both proxies run
// at once, so the test takes one poll's wait.
func TestProxiesInFront(t *testing.T) {
	if testing.Short() {
		t.Skip("holds a 60 s poll")
	}
	eachProxy(t, testFrontProxy)
}

// eachProxy runs test against every installed proxy of frontProxies, all
// at once, with one relay binary.
func eachProxy(t *testing.T, test func(t *testing.T, p frontProxy, bin, relayBin string)) {
	bins := installedProxies(t)
	relayBin := servicetest.Relay(t)
	for _, p := range frontProxies {
		t.Run(p.name, func(t *testing.T) {
			if bins[p.name] == "" {
				t.Skipf("%s not installed (apt-get install %s)", p.binary, p.binary)
			}
			t.Parallel()
			test(t, p, bins[p.name], relayBin)
		})
	}
}

// installedProxies are the proxies' binaries by name; the test skips when
// none is installed.
func installedProxies(t *testing.T) map[string]string {
	bins := map[string]string{}
	for _, p := range frontProxies {
		path, err := exec.LookPath(p.binary)
		if err != nil {
			if servicetest.Required() {
				t.Fatalf("%s not installed and FN_TEST_REQUIRE_SERVICES=1 (apt-get install %s)", p.binary, p.binary)
			}
			continue
		}
		bins[p.name] = path
	}
	if len(bins) == 0 {
		t.Skip("neither caddy nor nginx is installed (apt-get install caddy nginx)")
	}
	return bins
}

func testFrontProxy(t *testing.T, p frontProxy, bin, relayBin string) {
	rl, counter, client, base := startFront(t, p, bin, relayBin)

	phone, tablet, laptop := rl.token(t, "phone"), rl.token(t, "tablet"), rl.token(t, "laptop")
	before := counter.Accepted()
	for _, tok := range []string{phone, tablet, laptop} {
		if r := do(t, client, "POST", base+"/v1/register", tok, "", nil); r.status != http.StatusOK {
			t.Fatalf("register through %s: %d %s", p.name, r.status, r.body)
		}
	}
	for range 5 {
		if r := do(t, client, "GET", base+"/ready", "", "", nil); r.status != http.StatusOK {
			t.Fatalf("ready through %s: %d %s", p.name, r.status, r.body)
		}
	}
	if n := counter.Accepted() - before; n > 2 {
		t.Errorf("%s opened %d connections to the relay for 8 requests in a row: no keep-alive upstream", p.name, n)
	}

	checkConsole(t, p.name, client, base, rl.token(t, "admin", "-scope", "admin"))

	// The 60 s poll: held to its end and answered by the relay.
	long := make(chan reply, 1)
	go func() {
		start := time.Now()
		r := do(t, client, "GET", base+"/v1/poll?wait=60", phone, "", nil)
		r.took = time.Since(start)
		long <- r
	}()
	// A poll woken by a send; it claims another address, which the proxy
	// must not pass on as the client's.
	woken := make(chan reply, 1)
	go func() {
		r := do(t, client, "GET", base+"/v1/poll?wait=60", tablet, "", http.Header{"X-Forwarded-For": {"203.0.113.9"}})
		r.at = time.Now()
		woken <- r
	}()
	eventuallyWithin(t, 10*time.Second, "both polls held", func() bool { return rl.heldPolls(t) == 2 })
	sent := time.Now()
	if r := do(t, client, "POST", base+"/v1/send", laptop, `{"id":"m1","to":["tablet"],"payload":"aGVsbG8="}`, nil); r.status != http.StatusAccepted {
		t.Fatalf("send through %s: %d %s", p.name, r.status, r.body)
	}
	w := <-woken
	if w.status != http.StatusOK || !strings.Contains(string(w.body), `"payload":"aGVsbG8="`) {
		t.Fatalf("woken poll through %s: %d %s", p.name, w.status, w.body)
	}
	if d := w.at.Sub(sent); d > 3*time.Second {
		t.Errorf("the woken poll answered %v after the send, through %s", d, p.name)
	}

	l := <-long
	var body struct {
		Cursor    *int64            `json:"cursor"`
		Envelopes []json.RawMessage `json:"envelopes"`
	}
	if l.status != http.StatusOK || json.Unmarshal(l.body, &body) != nil || body.Cursor == nil {
		t.Fatalf("the 60 s poll through %s after %v: %d %s (want the relay's empty 200)", p.name, l.took, l.status, l.body)
	}
	// The relay answers a held poll up to 3 s before its wait runs out.
	if l.took < 55*time.Second {
		t.Errorf("the 60 s poll through %s answered after %v", p.name, l.took)
	}

	// The relay writes access lines in batches, up to 100 ms after the
	// answer: wait for the two polls' lines.
	lines := rl.accessLinesOf(t, "/v1/poll", "phone", "tablet")
	var sawLong, sawWoken bool
	for _, a := range lines {
		if a["route"] != "/v1/poll" {
			continue
		}
		switch a["device"] {
		case "phone":
			sawLong = true
			if a["client"] != "127.0.0.2" || a["outcome"] != "empty" || a["status"] != float64(200) {
				t.Errorf("the 60 s poll's access line through %s: %v", p.name, a)
			}
			if d, err := time.ParseDuration(fmt.Sprint(a["duration"])); err != nil || d < 55*time.Second {
				t.Errorf("the 60 s poll's duration %v through %s: %v", a["duration"], p.name, err)
			}
		case "tablet":
			sawWoken = true
			if a["client"] != "127.0.0.2" || a["outcome"] != "delivered" {
				t.Errorf("the woken poll's access line through %s (it claimed 203.0.113.9): %v", p.name, a)
			}
		}
	}
	if !sawLong || !sawWoken {
		t.Errorf("access lines through %s lack a poll: %v", p.name, lines)
	}
}

// startFront runs the relay and p in front of it, and returns the relay,
// the connection counter between the two, and a client of the proxy's
// base URL that trusts its certificate.
func startFront(t *testing.T, p frontProxy, bin, relayBin string) (*relayProc, *servicetest.Proxy, *http.Client, string) {
	dir := t.TempDir()
	rl := startRelay(t, relayBin, dir)
	// Between the proxy and the relay, to count the proxy's connections.
	counter := servicetest.NewProxy(t, rl.addr)
	certFile, keyFile, roots := selfSigned(t, dir)
	listen := freePort(t)
	cmd := p.start(t, bin, dir, listen, counter.Addr, certFile, keyFile)
	stopAtEnd(t, cmd, p.name)

	// The client comes from 127.0.0.2, so that its address differs from
	// the proxy's (127.0.0.1), which the relay trusts.
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext,
		ForceAttemptHTTP2: true,
	}}
	t.Cleanup(client.CloseIdleConnections)
	base := "https://" + listen
	eventuallyWithin(t, 20*time.Second, p.name+" serving TLS", func() bool {
		r, err := client.Get(base + "/live")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	})
	return rl, counter, client, base
}

// checkConsole: the household console (FN_CONSOLE) works through the
// proxy: its page and modules, and the pairing page an app device's link
// opens, arrive with their security headers, and the pairing link of an
// invitation made through it, and its QR code, name the proxy's https
// origin (X-Forwarded-Proto from a trusted proxy).
func checkConsole(t *testing.T, name string, client *http.Client, base, admin string) {
	t.Helper()
	for path, ct := range map[string]string{"/console/": "text/html", "/console/console.js": "text/javascript", "/console/client/credentials.js": "text/javascript",
		"/pair/": "text/html", "/pair/pair.js": "text/javascript"} {
		r := do(t, client, "GET", base+path, "", "", nil)
		if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), ct) ||
			r.header.Get("Content-Security-Policy") != console.Policy || r.header.Get("X-Frame-Options") != "DENY" ||
			r.header.Get("Referrer-Policy") != "no-referrer" {
			t.Errorf("GET %s through %s: %d %v", path, name, r.status, r.header)
		}
	}
	r := do(t, client, "POST", base+"/v1/invitations", admin, `{"device":"watch"}`, nil)
	var inv struct{ Code, URL string }
	if r.status != http.StatusCreated || json.Unmarshal(r.body, &inv) != nil || inv.URL != base+"/pair/#code="+inv.Code+"&household=home" {
		t.Fatalf("an invitation through %s: %d %s (want its link on %s)", name, r.status, r.body, base)
	}
	r = do(t, client, "POST", base+"/console/qr", admin, `{"code":"`+inv.Code+`"}`, nil)
	want, err := console.QR(inv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusOK || !bytes.Equal(r.body, want) {
		t.Errorf("the QR code through %s: %d %.200s", name, r.status, r.body)
	}
}

// TestProxiesStream holds a stream (GET /v1/stream, Server-Sent Events)
// through each sample in front of the relay: its head and ready event
// come at once, an envelope sent through the proxy comes as an event
// within 3 s, a keep-alive comes while it is idle, it ends with the
// relay's end event (expired) when its token expires, and the next
// stream, from the cursor the first reached, carries what was sent in
// between. A proxy that buffers answers turns it red (nginx with
// proxy_buffering on and proxy_ignore_headers X-Accel-Buffering holds
// even the head: the client gives up after 10 s), as does one that holds
// an event back 3 s or cuts an idle stream before its end.
func TestProxiesStream(t *testing.T) {
	if testing.Short() {
		t.Skip("holds a stream for 30 s")
	}
	eachProxy(t, testProxyStream)
}

const (
	// streamTokenTTL is the life of the first stream's token, and so of
	// the stream: a stream ends when its token expires, as it does at
	// FN_STREAM_LIFE, which takes no less than a minute. It is above the
	// relay's longest wait for a ping (25 s), so one comes.
	streamTokenTTL = 30 * time.Second
	// streamPingEvery is that longest wait.
	streamPingEvery = 25 * time.Second
	// prompt is how soon an event comes through a proxy that passes it on
	// as the relay writes it.
	prompt = 3 * time.Second
)

func testProxyStream(t *testing.T, p frontProxy, bin, relayBin string) {
	rl, _, hc, base := startFront(t, p, bin, relayBin)
	minted := time.Now()
	phone, laptop := rl.token(t, "phone", "-ttl", streamTokenTTL.String()), rl.token(t, "laptop")
	for _, tok := range []string{phone, laptop} {
		if r := do(t, hc, "POST", base+"/v1/register", tok, "", nil); r.status != http.StatusOK {
			t.Fatalf("register through %s: %d %s", p.name, r.status, r.body)
		}
	}
	head := &streamHead{RoundTripper: hc.Transport}
	streams := &http.Client{Transport: head}
	c, err := client.New(base, phone, client.WithHTTPClient(streams))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), streamTokenTTL+time.Minute)
	defer cancel()

	opened := time.Now()
	s, err := c.Stream(ctx, client.StreamQuery{})
	if err != nil {
		t.Fatalf("opening a stream through %s: %v", p.name, err)
	}
	defer s.Close()
	if head.status != http.StatusOK || !strings.HasPrefix(head.header.Get("Content-Type"), "text/event-stream") ||
		head.header.Get("Cache-Control") != "no-store" {
		t.Errorf("the stream's head through %s: %d %v", p.name, head.status, head.header)
	}
	ready, tookReady := nextEvent(t, p.name, s, "ready", opened)
	if ready.Result.Cursor != 0 || ready.Result.Epoch == "" || len(ready.Result.Envelopes) != 0 {
		t.Fatalf("the ready event through %s: %+v", p.name, ready.Result)
	}

	sent := time.Now()
	seq := sendTo(t, p.name, hc, base, laptop, "s1", "phone")
	ev, tookSent := nextEvent(t, p.name, s, "envelopes", sent)
	if e := ev.Result.Envelopes; len(e) != 1 || e[0].Seq != seq || e[0].ID != "s1" || string(e[0].Payload) != "hello" || ev.Result.Cursor != seq {
		t.Fatalf("the envelopes event through %s: %+v (want s1 at seq %d)", p.name, ev.Result, seq)
	}

	// Idle to its end: a ping at least every 25 s, each passed on as it
	// comes, then the relay's end.
	pings, last := 0, time.Now()
	for {
		ev, err = s.Next()
		if err != nil {
			t.Fatalf("the idle stream through %s after %v, %d pings: %v (want its end when its token expires)", p.name, time.Since(opened), pings, err)
		}
		if gap := time.Since(last); gap > streamPingEvery+prompt {
			t.Errorf("the idle stream through %s carried nothing for %v", p.name, gap)
		}
		last = time.Now()
		if ev.Kind != "ping" {
			break
		}
		pings++
	}
	// The token's expiry is in whole seconds.
	life := time.Since(minted)
	if ev.Kind != "end" || ev.End == nil || ev.End.Reason != "expired" || life < streamTokenTTL-time.Second || life > streamTokenTTL+prompt {
		t.Fatalf("through %s %v after the token's minting: %s %+v (want the end, expired, after %v)", p.name, life, ev.Kind, ev.End, streamTokenTTL)
	}
	if pings == 0 {
		t.Errorf("the idle stream through %s carried no ping in %v", p.name, life)
	}

	// Sent with no stream open: the next stream, with a fresh token, from
	// the cursor the first reached, carries it.
	seq2 := sendTo(t, p.name, hc, base, laptop, "s2", "phone")
	c, err = client.New(base, rl.token(t, "phone"), client.WithHTTPClient(streams))
	if err != nil {
		t.Fatal(err)
	}
	reopened := time.Now()
	s2, err := c.Stream(ctx, client.StreamQuery{Cursor: seq, Epoch: ready.Result.Epoch})
	if err != nil {
		t.Fatalf("the next stream through %s: %v", p.name, err)
	}
	defer s2.Close()
	if r, _ := nextEvent(t, p.name, s2, "ready", reopened); r.Result.Cursor != seq {
		t.Errorf("the next stream's ready event through %s: %+v (want cursor %d)", p.name, r.Result, seq)
	}
	ev, tookNext := nextEvent(t, p.name, s2, "envelopes", reopened)
	if e := ev.Result.Envelopes; len(e) != 1 || e[0].Seq != seq2 || e[0].ID != "s2" {
		t.Errorf("the next stream's envelopes through %s: %+v (want s2 at seq %d)", p.name, ev.Result, seq2)
	}
	t.Logf("through %s over %s: ready after %v, the envelope %v after its send, %d pings, end %v after the token's minting, the next stream's envelope after %v",
		p.name, head.proto, tookReady, tookSent, pings, life.Round(time.Millisecond), tookNext)
}

// streamHead records the head of the last answer to GET /v1/stream that
// came through it, which a client.Stream does not show.
type streamHead struct {
	http.RoundTripper
	status int
	proto  string
	header http.Header
}

func (h *streamHead) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := h.RoundTripper.RoundTrip(r)
	if err == nil && r.URL.Path == "/v1/stream" {
		h.status, h.proto, h.header = resp.StatusCode, resp.Proto, resp.Header.Clone()
	}
	return resp, err
}

// nextEvent reads the stream's next event other than a ping, which must
// be kind and come within prompt of since (later: held in a buffer), and
// returns it and how long it took.
func nextEvent(t *testing.T, name string, s *client.Stream, kind string, since time.Time) (client.StreamEvent, time.Duration) {
	t.Helper()
	for {
		ev, err := s.Next()
		took := time.Since(since)
		if err != nil {
			t.Fatalf("the %s event through %s, after %v: %v", kind, name, took, err)
		}
		if ev.Kind == "ping" {
			continue
		}
		if ev.Kind != kind {
			t.Fatalf("through %s after %v: a %s event %+v, want %s", name, took, ev.Kind, ev, kind)
		}
		if took > prompt {
			t.Errorf("the %s event came through %s after %v, want within %v: held in a buffer", kind, name, took, prompt)
		}
		return ev, took
	}
}

// sendTo sends "hello" as id from tok's device to device through the
// proxy and returns the envelope's seq for device.
func sendTo(t *testing.T, name string, hc *http.Client, base, tok, id, device string) int64 {
	t.Helper()
	r := do(t, hc, "POST", base+"/v1/send", tok, `{"id":"`+id+`","to":["`+device+`"],"payload":"aGVsbG8="}`, nil)
	var res client.SendResult
	if r.status != http.StatusAccepted || json.Unmarshal(r.body, &res) != nil || len(res.Deliveries) != 1 || res.Deliveries[0].Device != device {
		t.Fatalf("send through %s: %d %s", name, r.status, r.body)
	}
	return res.Deliveries[0].Seq
}

// startCaddy runs the Caddyfile as it is, its values given through the
// environment variables it reads, imported by a test-only file with the
// global options that keep Caddy's state in dir and off the admin port.
func startCaddy(t *testing.T, bin, dir, listen, upstream, cert, key string) *exec.Cmd {
	sample, err := filepath.Abs(filepath.Join("..", caddySample))
	if err != nil {
		t.Fatal(err)
	}
	wrapper := fmt.Sprintf(`{
	admin off
	auto_https disable_redirects
	storage file_system %s
}
import %s
`, filepath.Join(dir, "caddy-data"), sample)
	conf := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(conf, []byte(wrapper), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--adapter", "caddyfile", "--config", conf)
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir,
		"RELAY_DOMAIN=https://" + listen,
		"RELAY_UPSTREAM=" + upstream,
		"RELAY_TLS=tls " + cert + " " + key,
	}
	return startLogged(t, cmd, filepath.Join(dir, "caddy.log"))
}

// nginxValues are the sample's "set:" values, each replaced by the test's.
var nginxValues = []string{
	"server 127.0.0.1:8080;",
	"listen 443 ssl http2;",
	"listen [::]:443 ssl http2;",
	"/etc/letsencrypt/live/relay.example.com/fullchain.pem",
	"/etc/letsencrypt/live/relay.example.com/privkey.pem",
}

// startNginx renders the sample with the test's address, upstream and
// certificate, and runs it inside a test-only nginx.conf that keeps the
// pid file, temporary files and logs in dir.
func startNginx(t *testing.T, bin, dir, listen, upstream, cert, key string) *exec.Cmd {
	b, err := os.ReadFile(filepath.Join("..", nginxSample))
	if err != nil {
		t.Fatal(err)
	}
	conf := string(b)
	with := []string{"server " + upstream + ";", "listen " + listen + " ssl http2;", "", cert, key}
	for i, old := range nginxValues {
		if strings.Count(conf, old) != 1 {
			t.Fatalf("%s: %q is not there once; the test replaces it", nginxSample, old)
		}
		conf = strings.Replace(conf, old, with[i], 1)
	}
	site := filepath.Join(dir, "relay.conf")
	if err := os.WriteFile(site, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	// As root, nginx's workers would switch to nobody, who cannot read dir.
	var userLine string
	if os.Geteuid() == 0 {
		u, err := user.Current()
		if err != nil {
			t.Fatal(err)
		}
		userLine = "user " + u.Username + ";"
	}
	var temps strings.Builder
	for _, kind := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		fmt.Fprintf(&temps, "    %s_temp_path %s;\n", kind, filepath.Join(dir, kind))
	}
	mainConf := fmt.Sprintf(`%s
daemon off;
master_process on;
worker_processes 1;
pid %s;
error_log %s info;
events { worker_connections 1024; }
http {
    access_log %s;
%s    include %s;
}
`, userLine, filepath.Join(dir, "nginx.pid"), filepath.Join(dir, "nginx-error.log"), filepath.Join(dir, "nginx-access.log"), temps.String(), site)
	mainFile := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(mainFile, []byte(mainConf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", mainFile, "-e", filepath.Join(dir, "nginx-error.log"))
	cmd.Dir = dir
	return startLogged(t, cmd, filepath.Join(dir, "nginx.out"))
}

// startLogged starts cmd with its output in logFile, which the test's log
// shows when it fails.
func startLogged(t *testing.T, cmd *exec.Cmd, logFile string) *exec.Cmd {
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", cmd.Path, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := os.ReadFile(logFile)
			t.Logf("%s output:\n%s", filepath.Base(cmd.Path), out)
		}
	})
	return cmd
}

// stopAtEnd stops cmd when the test ends: SIGTERM, then SIGKILL after 10 s.
func stopAtEnd(t *testing.T, cmd *exec.Cmd, name string) {
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%s did not stop within 10 s of SIGTERM", name)
			_ = cmd.Process.Kill()
			<-exited
		}
	})
}

// relayProc is the relay binary serving on a loopback port.
type relayProc struct {
	bin, dir, addr, metrics string
	log                     *servicetest.Buffer
}

func startRelay(t *testing.T, bin, dir string) *relayProc {
	r := &relayProc{bin: bin, dir: dir, log: &servicetest.Buffer{}}
	cmd := exec.Command(bin, "serve")
	cmd.Env = []string{
		"FN_LISTEN=127.0.0.1:0",
		"FN_METRICS_ADDR=127.0.0.1:0",
		"FN_DATABASE_URL=sqlite:" + filepath.Join(dir, "relay.db"),
		"FN_ISSUER_KEY_FILE=" + filepath.Join(dir, "issuer.key"),
		"FN_LOG_FORMAT=json",
		"FN_SHUTDOWN_GRACE=2s",
		"FN_TRUSTED_PROXIES=127.0.0.1/32",
		"FN_CONSOLE=true",
	}
	cmd.Stdout, cmd.Stderr = io.Discard, r.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, cmd, "the relay")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", r.log.String())
		}
	})
	serving := regexp.MustCompile(`"msg":"serving","addr":"http://([^"]+)"`)
	metrics := regexp.MustCompile(`"msg":"metrics","addr":"(http://[^"]+)"`)
	eventuallyWithin(t, 20*time.Second, "the relay serving", func() bool {
		s, m := serving.FindStringSubmatch(r.log.String()), metrics.FindStringSubmatch(r.log.String())
		if s == nil || m == nil {
			return false
		}
		r.addr, r.metrics = s[1], m[1]
		return true
	})
	return r
}

// token mints a device token of household "home" with the relay's key,
// with relay token's further flags.
func (r *relayProc) token(t *testing.T, device string, flags ...string) string {
	args := append([]string{"token", "-issuer-key-file", filepath.Join(r.dir, "issuer.key"), "-household", "home", "-device", device}, flags...)
	out, err := exec.Command(r.bin, args...).Output()
	if err != nil {
		t.Fatalf("relay token: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// heldPolls is the relay's fn_held_polls.
func (r *relayProc) heldPolls(t *testing.T) int {
	resp, err := http.Get(r.metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var n int
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "fn_held_polls "); ok {
			fmt.Sscan(v, &n)
		}
	}
	return n
}

// accessLinesOf waits, for up to 5 s, until the relay's access log has a
// line of route for each of devices, and returns its access lines.
func (r *relayProc) accessLinesOf(t *testing.T, route string, devices ...string) []map[string]any {
	deadline := time.Now().Add(5 * time.Second)
	for {
		lines := r.accessLines(t)
		seen := map[any]bool{}
		for _, a := range lines {
			if a["route"] == route {
				seen[a["device"]] = true
			}
		}
		missing := slices.ContainsFunc(devices, func(d string) bool { return !seen[d] })
		if !missing || time.Now().After(deadline) {
			return lines
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// accessLines are the relay's access log lines.
func (r *relayProc) accessLines(t *testing.T) []map[string]any {
	var out []map[string]any
	for line := range strings.Lines(r.log.String()) {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

type reply struct {
	status int
	header http.Header
	body   []byte
	took   time.Duration
	at     time.Time
}

// do sends a request; a transport error is status 0 with the error as
// body, so that goroutines can report it.
func do(t *testing.T, c *http.Client, method, url, tok, body string, h http.Header) reply {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return reply{body: []byte(err.Error())}
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{body: []byte(err.Error())}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{body: []byte(err.Error())}
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// selfSigned writes a certificate for 127.0.0.1 and its key to dir and
// returns their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "relay test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AddCert(cert)
	return certFile, keyFile, roots
}

// freePort is a loopback address with a port nothing listens on now.
func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func eventuallyWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The samples as parsed files, checked with the others (TestDeployFiles):
// a held poll is silent for up to FN_MAX_WAIT_SECS, so the proxies in front
// wait longer, buffer nothing and reuse their connections.
func init() { checks = append(checks, checkProxySamples) }

func loadProxySamples(t tree, read func(string) string) {
	t[nginxSample] = directives(read(nginxSample))
	// Caddy's {$NAME:default} is read as its default, {$NAME} as empty.
	t[caddySample] = directives(regexp.MustCompile(`\{\$\w+(?::([^}]*))?\}`).ReplaceAllString(read(caddySample), "$1"))
}

// directives reads a block configuration (nginx, Caddy): each directive's
// arguments, a list per name in file order, blocks flattened.
func directives(text string) map[string]any {
	out := map[string]any{}
	for l := range strings.Lines(text) {
		l, _, _ = strings.Cut(l, "#")
		for stmt := range strings.FieldsFuncSeq(l, func(r rune) bool { return r == ';' || r == '{' || r == '}' }) {
			if f := strings.Fields(stmt); len(f) > 0 {
				out[f[0]] = append(orList(out[f[0]]), strings.Join(f[1:], " "))
			}
		}
	}
	return out
}

func checkProxySamples(t tree, _ map[string]config.Config, p *problems) {
	def := config.Default()
	least, port := def.MaxWait+waitMargin, port(def)
	has := func(file, name, args string) bool { return slices.Contains(strs(t.get(file, name)), args) }
	for _, file := range []string{nginxSample, caddySample} {
		for _, name := range []string{"proxy_read_timeout", "response_header_timeout"} {
			for _, v := range strs(t.get(file, name)) {
				p.when(duration(v, 1e9) < least, "%s: %s %s, want at least %v: a held poll is silent for up to FN_MAX_WAIT_SECS (%v)", file, name, v, least, def.MaxWait)
			}
		}
		for _, up := range append(strs(t.get(file, "server")), strs(t.get(file, "reverse_proxy"))...) {
			_, pt, err := net.SplitHostPort(up)
			p.when(err == nil && pt != port, "%s: upstream %s, want the relay's FN_LISTEN port %s", file, up, port)
		}
	}
	p.when(len(strs(t.get(nginxSample, "proxy_read_timeout"))) == 0, "%s: no proxy_read_timeout; nginx's default (60s) is not above FN_MAX_WAIT_SECS with margin", nginxSample)
	p.when(!has(nginxSample, "proxy_buffering", "off"), "%s: no proxy_buffering off; a held poll's answer must not wait in a buffer", nginxSample)
	p.when(!has(nginxSample, "proxy_http_version", "1.1"), "%s: no proxy_http_version 1.1; nginx speaks HTTP/1.0 upstream by default", nginxSample)
	p.when(!has(nginxSample, "proxy_set_header", `Connection ""`), `%s: no proxy_set_header Connection ""; nginx sends "Connection: close" upstream by default`, nginxSample)
	p.when(t.get(nginxSample, "keepalive") == nil, "%s: the upstream block has no keepalive; connections to the relay are not reused", nginxSample)
	p.when(!has(nginxSample, "proxy_set_header", "X-Forwarded-For $remote_addr"), "%s: no proxy_set_header X-Forwarded-For $remote_addr; the access log would name nginx, not the client", nginxSample)
	p.when(t.get(nginxSample, "ssl_certificate") == nil || slices.ContainsFunc(strs(t.get(nginxSample, "listen")), func(l string) bool { return !strings.Contains(l, "ssl") }),
		"%s: a listen without ssl, or no ssl_certificate: clients reach the relay through TLS only", nginxSample)
	p.when(!has(caddySample, "flush_interval", "-1"), "%s: no flush_interval -1; a held poll's answer must not wait in a buffer", caddySample)
	p.when(len(strs(t.get(caddySample, "response_header_timeout"))) == 0, "%s: no response_header_timeout above FN_MAX_WAIT_SECS", caddySample)
	p.when(has(caddySample, "keepalive", "off"), "%s: keepalive off; connections to the relay are not reused", caddySample)
	for name := range orMap(t[caddySample]) {
		p.when(strings.HasPrefix(name, "buffer_") || name == "response_buffers", "%s: %s; a held poll's answer must not wait in a buffer", caddySample, name)
	}
}

// proxyBreakage are TestChecksCatchBreakage's rows for the samples.
var proxyBreakage = []breakage{
	{nginxSample, "proxy_read_timeout", []any{"60s"}, "proxy_read_timeout"},
	{nginxSample, "proxy_read_timeout", []any{"1m"}, "proxy_read_timeout"},
	{nginxSample, "proxy_read_timeout", nil, "proxy_read_timeout"},
	{nginxSample, "proxy_buffering", nil, "proxy_buffering"},
	{nginxSample, "proxy_http_version", nil, "proxy_http_version"},
	{nginxSample, "proxy_set_header", []any{"Host $http_host", "X-Forwarded-For $remote_addr"}, "Connection"},
	{nginxSample, "proxy_set_header", []any{`Connection ""`}, "X-Forwarded-For"},
	{nginxSample, "keepalive", nil, "keepalive"},
	{nginxSample, "server", []any{"127.0.0.1:9090"}, "FN_LISTEN"},
	{nginxSample, "listen", []any{"443"}, "ssl"},
	{caddySample, "flush_interval", nil, "flush_interval"},
	{caddySample, "response_header_timeout", []any{"30s"}, "response_header_timeout"},
	{caddySample, "buffer_responses", []any{""}, "buffer"},
	{caddySample, "reverse_proxy", []any{"127.0.0.1:9090"}, "FN_LISTEN"},
}
