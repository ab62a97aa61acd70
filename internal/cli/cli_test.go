package cli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/token"
)

var relayBin string

// The tests run from the repository's root: they hold its files (README.md,
// docs/) to the commands.
func TestMain(m *testing.M) {
	if err := os.Chdir("../.."); err != nil {
		panic(err)
	}
	os.Exit(servicetest.RunWithRelay(m, &relayBin))
}

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// TestBadSettingStopsStart: a bad setting stops the relay at start with one
// line that names it.
func TestBadSettingStopsStart(t *testing.T) {
	dir := t.TempDir()
	smallOrder := base64.StdEncoding.EncodeToString(make([]byte, 32))
	nonCanonical := base64.StdEncoding.EncodeToString(append([]byte{0xed}, append(bytes.Repeat([]byte{0xff}, 30), 0x7f)...))
	tests := []struct {
		name, env, value string
	}{
		{"wait not a number", "FN_MAX_WAIT_SECS", "soon"},
		{"budget zero", "FN_POLL_BUDGET_BYTES", "0"},
		{"small-order issuer key", "FN_ISSUER_KEYS", smallOrder},
		{"non-canonical issuer key", "FN_ISSUER_KEYS", nonCanonical},
		{"issuer key not base64", "FN_ISSUER_KEYS", "!!"},
		{"database url", "FN_DATABASE_URL", "mysql://x"},
		{"listen", "FN_LISTEN", "nowhere"},
		{"grace", "FN_SHUTDOWN_GRACE", "forever"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vars := map[string]string{"FN_DATABASE_URL": "sqlite:" + filepath.Join(dir, "r.db"), "FN_LISTEN": "127.0.0.1:0", tt.env: tt.value}
			var stderr bytes.Buffer
			err := run(context.Background(), nil, env(vars), io.Discard, &stderr)
			if err == nil {
				t.Fatal("the relay started with a bad setting")
			}
			if msg := err.Error(); !strings.Contains(msg, tt.env) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q does not name %s on one line", msg, tt.env)
			}
		})
	}
	// Flags win over the environment, and a bad one is named as the flag.
	err := run(context.Background(), []string{"serve", "-max-wait-secs", "x"}, env(map[string]string{"FN_MAX_WAIT_SECS": "10"}), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `-max-wait-secs`) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("flag did not override env, or its error does not name it: %v", err)
	}
}

// TestHelp: the program's and every subcommand's help goes to stdout and
// is no error (exit 0).
func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{"-h"}, {"--help"}, {"help"}, {"help", "serve"}, {"help", "token"},
		{"serve", "-h"}, {"keygen", "-h"}, {"token", "-h"}, {"migrate", "-h"}, {"probe", "-h"}, {"version", "-h"}, {"send", "-h"}, {"listen", "-h"}, {"help", "listen"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), args, env(nil), &stdout, &stderr)
		if err != nil || !strings.HasPrefix(stdout.String(), "usage: relay") || stderr.Len() > 0 {
			t.Errorf("%q: err %v, stdout %q, stderr %q", args, err, stdout.String(), stderr.String())
		}
	}
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"serve", "-h"}, env(nil), &stdout, io.Discard); err != nil || !strings.Contains(stdout.String(), "-max-wait-secs") || !strings.Contains(stdout.String(), "FN_MAX_WAIT_SECS") {
		t.Errorf("serve -h does not list the settings: %v\n%s", err, stdout.String())
	}
	// The binary's exit status.
	for _, args := range [][]string{{"-h"}, {"help"}, {"serve", "-h"}, {"token", "-h"}, {"send", "-h"}, {"listen", "-h"}} {
		out, err := exec.Command(relayBin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("relay %q: %v\n%s", args, err, out)
		}
	}
}

// TestBadFlagNamesIt: every subcommand's bad flag is an error that names
// the flag, on one line, and the binary exits 2 with it: a usage mistake.
func TestBadFlagNamesIt(t *testing.T) {
	dir := t.TempDir()
	vars := env(map[string]string{"FN_DATABASE_URL": "sqlite:" + filepath.Join(dir, "r.db"), "FN_LISTEN": "127.0.0.1:0"})
	for _, tt := range []struct {
		args []string
		flag string
	}{
		{[]string{"serve", "-max-wait-secs", "soon"}, "-max-wait-secs"},
		{[]string{"-listen", "nowhere"}, "-listen"},
		{[]string{"serve", "-no-such"}, "-no-such"},
		{[]string{"migrate", "-database-url", "mysql://x"}, "-database-url"},
		{[]string{"keygen", "-bogus"}, "-bogus"},
		{[]string{"token", "-ttl", "soon"}, "-ttl"},
		{[]string{"probe", "-x"}, "-x"},
		{[]string{"version", "-x"}, "-x"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tt.args, vars, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tt.flag) || strings.Contains(err.Error(), "\n") || stdout.Len()+stderr.Len() > 0 {
			t.Errorf("%q: err %v, output %q %q; want one line naming %s", tt.args, err, stdout.String(), stderr.String(), tt.flag)
		}
	}
	cmd := exec.Command(relayBin, "serve", "-max-wait-secs", "soon")
	cmd.Env = []string{"FN_LISTEN=127.0.0.1:0", "FN_DATABASE_URL=sqlite:" + filepath.Join(dir, "r.db")}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || strings.Count(string(out), "\n") != 1 || !strings.Contains(string(out), "-max-wait-secs") {
		t.Errorf("relay serve -max-wait-secs soon: %v, %q", err, out)
	}
}

// TestJSONLogsOnly: with FN_LOG_FORMAT=json every line the relay writes,
// on stdout and stderr, is a JSON object, from the first start (which
// creates a key and tells how to mint a token) to the shutdown, and so is
// the line of an error it stops with. Durations read as Go durations.
func TestJSONLogsOnly(t *testing.T) {
	dir := t.TempDir()
	p := start(t, map[string]string{
		"FN_LISTEN":          "127.0.0.1:0",
		"FN_DATABASE_URL":    "sqlite:" + filepath.Join(dir, "relay.db"),
		"FN_ISSUER_KEY_FILE": filepath.Join(dir, "issuer.key"),
		"FN_LOG_FORMAT":      "json",
		"FN_SHUTDOWN_GRACE":  "1500ms",
	})
	// The access log's lines are written in batches; the stop that follows
	// at once must still log them before its own lines.
	resp, err := http.Get("http://" + p.addr + "/live")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	if p.out.Len() > 0 {
		t.Errorf("stdout is not empty with JSON logs: %q", p.out)
	}
	msgs := map[string]map[string]any{}
	var order []string
	for _, line := range strings.Split(strings.TrimSpace(p.logs()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		msgs[fmt.Sprint(m["msg"])] = m
		order = append(order, fmt.Sprint(m["msg"], " ", m["route"]))
	}
	if i, j := slices.Index(order, "request /live"), slices.Index(order, "shutting down <nil>"); i < 0 || j < 0 || i > j {
		t.Errorf("the access line of /live at %d, shutting down at %d: %q", i, j, order)
	}
	if g := msgs["shutting down"]["grace"]; g != "1.5s" {
		t.Errorf("grace logged as %v (%T), want \"1.5s\"", g, g)
	}
	if !slices.ContainsFunc(slices.Collect(maps.Keys(msgs)), func(m string) bool { return strings.Contains(m, "relay token") }) {
		t.Errorf("no log line tells how to mint a token: %v", slices.Collect(maps.Keys(msgs)))
	}

	cmd := exec.Command(relayBin)
	cmd.Env = []string{"FN_LOG_FORMAT=json", "FN_MAX_WAIT_SECS=soon"}
	out, err := cmd.CombinedOutput()
	var m map[string]any
	if err == nil || json.Unmarshal(out, &m) != nil || !strings.Contains(fmt.Sprint(m["err"]), "FN_MAX_WAIT_SECS") {
		t.Errorf("a bad setting with JSON logs: %v, %q", err, out)
	}
}

// process is the relay binary running as a child.
type process struct {
	cmd     *exec.Cmd
	addr    string
	metrics string // the metrics listener's address, when FN_METRICS_ADDR is set
	pprof   string // the profiles listener's address, when FN_PPROF_ADDR is set
	out     *bytes.Buffer
	done    chan error

	mu     sync.Mutex
	stderr strings.Builder
}

func (p *process) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

var (
	servingLine = regexp.MustCompile(`msg=serving addr=http://(\S+)|"msg":"serving","addr":"http://([^"]+)"`)
	metricsLine = regexp.MustCompile(`msg=metrics addr=http://(\S+)/metrics`)
	pprofLine   = regexp.MustCompile(`msg=pprof addr=http://(\S+)/debug/pprof/`)
)

func start(t *testing.T, vars map[string]string) *process {
	t.Helper()
	return startCmd(t, exec.Command(relayBin), vars)
}

// startPairing starts a relay that pairs devices: on SQLite in a fresh
// directory, with its own issuer key (made at start in keyFile), and
// extra's settings besides. base is its URL.
func startPairing(t *testing.T, extra map[string]string) (p *process, base, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	keyFile = filepath.Join(dir, "issuer.key")
	vars := map[string]string{
		"FN_LISTEN":          "127.0.0.1:0",
		"FN_DATABASE_URL":    "sqlite:" + filepath.Join(dir, "relay.db"),
		"FN_ISSUER_KEY_FILE": keyFile,
	}
	maps.Copy(vars, extra)
	p = start(t, vars)
	return p, "http://" + p.addr, keyFile
}

func startCmd(t *testing.T, cmd *exec.Cmd, vars map[string]string) *process {
	t.Helper()
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, out: &bytes.Buffer{}, done: make(chan error, 1)}
	cmd.Stdout = p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.stderr.WriteString(line + "\n")
			if m := metricsLine.FindStringSubmatch(line); m != nil {
				p.metrics = m[1]
			}
			if m := pprofLine.FindStringSubmatch(line); m != nil {
				p.pprof = m[1]
			}
			p.mu.Unlock()
			if m := servingLine.FindStringSubmatch(line); m != nil {
				found <- m[1] + m[2]
			}
		}
		p.done <- cmd.Wait()
	}()
	select {
	case p.addr = <-found:
	case err := <-p.done:
		t.Fatalf("relay exited before serving: %v", err)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("relay did not start")
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	return p
}

// stop sends SIGTERM and returns how long the process took to exit and its exit error.
func (p *process) stop(t *testing.T) (time.Duration, error) {
	t.Helper()
	begin := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		return time.Since(begin), err
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		t.Fatal("relay did not stop on SIGTERM")
		return 0, nil
	}
}

func request(t *testing.T, method, url, tok, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != "" {
		req.Header.Set("Content-Type", "application/json") // as clients do
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestSIGTERMKeepsPending: a relay stopped with SIGTERM while envelopes are
// pending and a poll is held exits 0 at once, and a relay started on the
// same data delivers every envelope.
func TestSIGTERMKeepsPending(t *testing.T) {
	k := newKeyed(t, map[string]string{
		"FN_LISTEN":       "127.0.0.1:0",
		"FN_DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "relay.db"),
	})
	vars := k.vars
	phone, laptop := k.mint(t, "phone"), k.mint(t, "laptop")
	p := start(t, vars)
	base := "http://" + p.addr
	if code, body := request(t, "POST", base+"/v1/register", phone, ""); code != 200 {
		t.Fatalf("register: %d %s", code, body)
	}
	const n = 50
	for i := range n {
		body := fmt.Sprintf(`{"id":"m%d","to":["phone"],"payload":"%s"}`, i, base64.StdEncoding.EncodeToString([]byte(fmt.Sprint(i))))
		if code, b := request(t, "POST", base+"/v1/send", laptop, body); code != 202 {
			t.Fatalf("send %d: %d %s", i, code, b)
		}
	}
	// A poll held by another device must not keep the relay from stopping.
	// It may be held when SIGTERM lands, or arrive after the listener
	// closed; either way it must not hold the relay up. (request would call
	// t.Fatal off the test's goroutine, so the poll is made by hand.)
	held := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("GET", base+"/v1/poll?wait=60", nil)
		req.Header.Set("Authorization", "Bearer "+laptop)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		held <- err
	}()
	took, err := p.stop(t)
	if err != nil {
		t.Fatalf("relay exit: %v", err)
	}
	if took > 10*time.Second {
		t.Fatalf("SIGTERM took %v", took)
	}
	<-held

	p = start(t, vars)
	base = "http://" + p.addr
	var got []string
	for cursor := 0; ; {
		ids, next := pollIDs(t, base, phone, cursor, 0)
		if len(ids) == 0 {
			break
		}
		got, cursor = append(got, ids...), next
	}
	if len(got) != n {
		t.Fatalf("after restart %d envelopes, want %d", len(got), n)
	}
	if _, err := p.stop(t); err != nil {
		t.Fatalf("second exit: %v", err)
	}
}

// TestFirstRun: with no issuer configured the relay creates a key, trusts
// it, and prints a token command and a curl line that work.
func TestFirstRun(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "issuer.key")
	vars := map[string]string{
		"FN_LISTEN":          "127.0.0.1:0",
		"FN_DATABASE_URL":    "sqlite:" + filepath.Join(dir, "relay.db"),
		"FN_ISSUER_KEY_FILE": keyFile,
	}
	p := start(t, vars)
	info, err := os.Stat(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("issuer key mode %v", info.Mode().Perm())
	}
	var tok bytes.Buffer
	if err := run(context.Background(), []string{"token", "-household", "home", "-device", "phone"}, env(map[string]string{"FN_ISSUER_KEY_FILE": keyFile}), &tok, io.Discard); err != nil {
		t.Fatal(err)
	}
	code, body := request(t, "POST", "http://"+p.addr+"/v1/register", strings.TrimSpace(tok.String()), "")
	if code != 200 || !strings.Contains(string(body), `"device":"phone"`) {
		t.Fatalf("register with the minted token: %d %s", code, body)
	}
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	// The commands name this binary and the key file by its absolute
	// path (the test's key file is absolute already: a relative one is
	// TestWelcomeNamesBinaryAndKey's).
	for _, want := range []string{
		relayBin + " invite -url http://" + p.addr + " -issuer-key-file " + keyFile + " -device phone",
		"TOKEN=$(" + relayBin + " token -issuer-key-file " + keyFile + " -household home -device phone)",
		"curl", "http://" + p.addr + "/v1/register",
	} {
		if !strings.Contains(p.out.String(), want) {
			t.Fatalf("welcome text lacks %q:\n%s", want, p.out)
		}
	}
	if strings.Contains(p.out.String(), "go run") {
		t.Errorf("welcome text of a built binary says go run:\n%s", p.out)
	}
}

// TestWelcomeNamesBinaryAndKey: the start-up text's commands run this
// binary as it was started ("go run ." only when go run built it) with
// the key file's absolute path, quoted for the shell when needed, in text
// and in the JSON log line alike (TestInvite runs the invite command).
func TestWelcomeNamesBinaryAndKey(t *testing.T) {
	// A second go run . runs the binary from the build cache.
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	entry := filepath.Join("50", "503f93d28aad7d8e66ec85e9fb8f8a4d8613203700f2122af86bf547969d81fe-d", "relay")
	for arg0, want := range map[string]string{
		"/tmp/go-build123456/b001/exe/relay":           "go run .",
		filepath.Join(cache, "go-build", entry):        "go run .",
		filepath.Join("/srv/gocache", entry):           "go run .", // GOCACHE elsewhere
		"./relay":                                      "./relay",
		"relay":                                        "relay",
		"/opt/my relay/relay":                          "'/opt/my relay/relay'",
		"/opt/it's/relay":                              `'/opt/it'\''s/relay'`,
		"/home/me/go-build/relay":                      "/home/me/go-build/relay",
		"/srv/50/503f93d28aad7d8e66ec85e9fb8f-d/relay": "/srv/50/503f93d28aad7d8e66ec85e9fb8f-d/relay",
	} {
		if got := selfCommand(arg0); got != want {
			t.Errorf("selfCommand(%q) = %q, want %q", arg0, got, want)
		}
	}
	dir := t.TempDir()
	t.Chdir(dir)
	var text, logs bytes.Buffer
	welcome("text", &text, nil, "127.0.0.1:8080", "data/issuer.key", "./relay", true)
	abs := filepath.Join(dir, "data", "issuer.key")
	for _, want := range []string{
		"The household console is at http://127.0.0.1:8080/console/",
		"./relay invite -url http://127.0.0.1:8080 -issuer-key-file " + abs + " -household home -device browser -scope admin",
		"./relay invite -url http://127.0.0.1:8080 -issuer-key-file " + abs + " -device phone",
		"./relay token -issuer-key-file " + abs + " -household home -device phone",
		"The relay trusts the issuer key in " + abs,
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("welcome text lacks %q:\n%s", want, text.String())
		}
	}
	var quiet bytes.Buffer
	welcome("text", &quiet, nil, "127.0.0.1:8080", "data/issuer.key", "./relay", false)
	if strings.Contains(quiet.String(), "console") {
		t.Errorf("welcome text names the console, which is off:\n%s", quiet.String())
	}
	welcome("json", io.Discard, slog.New(slog.NewJSONHandler(&logs, nil)), "127.0.0.1:8080", "data/issuer.key", "./relay", false)
	var line map[string]any
	if err := json.Unmarshal(logs.Bytes(), &line); err != nil {
		t.Fatalf("welcome log %q: %v", logs.String(), err)
	}
	if msg, _ := line["msg"].(string); line["key_file"] != abs || !strings.Contains(msg, "./relay invite -url http://127.0.0.1:8080 -issuer-key-file "+abs) {
		t.Errorf("welcome log line %s", logs.String())
	}
}

func TestProbe(t *testing.T) {
	ok := httptestServer(t, http.StatusOK)
	down := httptestServer(t, http.StatusServiceUnavailable)
	if err := run(context.Background(), []string{"probe", ok}, env(nil), io.Discard, io.Discard); err != nil {
		t.Fatalf("probe of a ready server: %v", err)
	}
	if err := run(context.Background(), []string{"probe", down}, env(nil), io.Discard, io.Discard); err == nil {
		t.Fatal("probe of a 503 server succeeded")
	}
}

func httptestServer(t *testing.T, status int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestTwoReplicas: two relay processes sharing Postgres and Redis; a send
// accepted by one wakes a poll held on the other within a second.
func TestTwoReplicas(t *testing.T) {
	dbURL := servicetest.PostgresDatabase(t)
	rs := servicetest.StartRedis(t)
	k := newKeyed(t, map[string]string{
		"FN_LISTEN":         "127.0.0.1:0",
		"FN_DATABASE_URL":   dbURL,
		"FN_RELAY_REPLICAS": "2",
		"FN_REDIS_URL":      rs.URL(),
		"FN_METRICS_ADDR":   "127.0.0.1:0",
	})
	a := start(t, k.vars)
	b := start(t, k.vars)
	crossWakes(t, k, a, b)
	waitMetric(t, b, "fn_redis_healthy", 1)
	waitMetric(t, b, "fn_redis_subscriber_connections", 1)
	if n := b.metric(t, "fn_redis_wakeups_received_total"); n < 5 {
		t.Fatalf("fn_redis_wakeups_received_total = %v, want 5", n)
	}
	b.documented(t)
	for _, p := range []*process{a, b} {
		if _, err := p.stop(t); err != nil {
			t.Fatalf("replica exit: %v", err)
		}
	}
}

// crossWakes sends five envelopes through a to a poll held on b; each must
// wake the poll within a second of the send.
func crossWakes(t *testing.T, k keyed, a, b *process) {
	t.Helper()
	phone, laptop := k.mint(t, "phone"), k.mint(t, "laptop")
	if code, body := request(t, "POST", "http://"+b.addr+"/v1/register", phone, ""); code != 200 {
		t.Fatalf("register: %d %s", code, body)
	}
	_, body := request(t, "GET", "http://"+b.addr+"/v1/poll?wait=0", phone, "")
	var head struct{ Cursor int }
	if err := json.Unmarshal(body, &head); err != nil {
		t.Fatalf("poll: %v %s", err, body)
	}
	for n := range 5 {
		i := head.Cursor + n
		type result struct {
			code int
			body []byte
			at   time.Time
		}
		done := make(chan result, 1)
		go func() {
			code, body := request(t, "GET", fmt.Sprintf("http://%s/v1/poll?cursor=%d&wait=30", b.addr, i), phone, "")
			done <- result{code, body, time.Now()}
		}()
		waitMetric(t, b, "fn_held_polls", 1)
		code, body := request(t, "POST", "http://"+a.addr+"/v1/send", laptop, fmt.Sprintf(`{"id":"m%d","to":["phone"],"payload":"eA=="}`, i))
		accepted := time.Now()
		if code != 202 {
			t.Fatalf("send: %d %s", code, body)
		}
		select {
		case r := <-done:
			if r.code != 200 || !strings.Contains(string(r.body), fmt.Sprintf(`"id":"m%d"`, i)) {
				t.Fatalf("poll on the other replica: %d %s", r.code, r.body)
			}
			if d := r.at.Sub(accepted); d > time.Second {
				t.Fatalf("woken %v after the send, want within a second", d)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the poll on the other replica was not woken")
		}
	}
}

// TestReplicaStartsWithoutRedis: a replica whose Redis is down at start
// serves anyway (its held polls re-read the store), says so once, and
// wakes across replicas once Redis is up. go-redis's own "failed to dial"
// lines do not reach stderr: with the call to wakeredis.RouteLogs removed
// from serve.go, this went red ("go-redis wrote 2 unstructured dial
// lines"), which was tried.
func TestReplicaStartsWithoutRedis(t *testing.T) {
	dbURL := servicetest.PostgresDatabase(t)
	rs := servicetest.StartRedis(t)
	rs.Stop()
	k := newKeyed(t, map[string]string{
		"FN_LISTEN":         "127.0.0.1:0",
		"FN_DATABASE_URL":   dbURL,
		"FN_RELAY_REPLICAS": "2",
		"FN_REDIS_URL":      rs.URL(),
		"FN_METRICS_ADDR":   "127.0.0.1:0",
	})
	b := start(t, k.vars)
	if !strings.Contains(b.logs(), "redis unreachable at start") {
		t.Fatalf("no warning about Redis at start:\n%s", b.logs())
	}
	if code, body := request(t, "GET", "http://"+b.addr+"/ready", "", ""); code != 200 {
		t.Fatalf("/ready with Redis down: %d %s", code, body)
	}
	waitMetric(t, b, "fn_redis_healthy", 0)
	rs.Start()
	waitMetric(t, b, "fn_redis_healthy", 1)
	a := start(t, k.vars)
	crossWakes(t, k, a, b)
	if n := strings.Count(b.logs(), "failed to dial"); n > 0 {
		t.Fatalf("go-redis wrote %d unstructured dial lines:\n%s", n, b.logs())
	}
	for _, p := range []*process{a, b} {
		if _, err := p.stop(t); err != nil {
			t.Fatalf("replica exit: %v", err)
		}
	}
}

// TestRedisSettingsStopStart: a Redis that refuses FN_REDIS_URL's
// password or database stops the relay at start with one line naming
// the setting.
func TestRedisSettingsStopStart(t *testing.T) {
	dbURL := servicetest.PostgresDatabase(t)
	rs := servicetest.StartRedis(t, "--requirepass", "right")
	for _, tt := range []struct{ name, url, want string }{
		{"wrong password", "redis://:wrong@" + rs.Addr() + "/0", "WRONGPASS"},
		{"no password", "redis://" + rs.Addr() + "/0", "NOAUTH"},
		{"no such database", "redis://:right@" + rs.Addr() + "/99", "DB index"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := newKeyed(t, map[string]string{
				"FN_LISTEN":         "127.0.0.1:0",
				"FN_DATABASE_URL":   dbURL,
				"FN_RELAY_REPLICAS": "2",
				"FN_REDIS_URL":      tt.url,
			})
			err := run(context.Background(), nil, env(k.vars), io.Discard, io.Discard)
			if err == nil {
				t.Fatal("the relay started with a Redis that refuses its settings")
			}
			if msg := err.Error(); !strings.Contains(msg, "FN_REDIS_URL") || !strings.Contains(msg, tt.want) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q: want one line naming FN_REDIS_URL and %q", msg, tt.want)
			}
		})
	}
}

// metric reads one sample from the process's metrics listener; a missing
// series reads as -1.
func (p *process) metric(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

func waitMetric(t *testing.T, p *process, series string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := p.metric(t, series)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v, want %v", series, got, want)
		}
		time.Sleep(5 * time.Millisecond) // bounded poll of the scrape
	}
}

type keyed struct {
	key  ed25519.PrivateKey
	vars map[string]string
}

func newKeyed(t *testing.T, vars map[string]string) keyed {
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	vars["FN_ISSUER_KEYS"] = base64.StdEncoding.EncodeToString(pub)
	return keyed{key, vars}
}

func (k keyed) mint(t *testing.T, dev string) string {
	t.Helper()
	tok, err := token.Mint(k.key, token.Claims{Household: "home", Device: dev, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// documented fails the test for every fn_ series the process exports that
// docs/OPERATIONS.md does not list.
func (p *process) documented(t *testing.T) {
	t.Helper()
	doc, err := os.ReadFile("docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		name, ok := strings.CutPrefix(line, "# TYPE ")
		if !ok || !strings.HasPrefix(name, "fn_") {
			continue
		}
		name = strings.Fields(name)[0]
		// A row of the metrics table, not a mention elsewhere.
		if !regexp.MustCompile("(?m)^\\| `" + regexp.QuoteMeta(name) + "[`{]").Match(doc) {
			t.Errorf("docs/OPERATIONS.md's metrics table has no row for %s", name)
		}
	}
}

// TestMetrics scrapes the metrics listener during a real send and poll
// exchange and watches the series move; /live and /ready disclose nothing.
func TestMetrics(t *testing.T) {
	k := newKeyed(t, map[string]string{
		"FN_LISTEN": "127.0.0.1:0", "FN_METRICS_ADDR": "127.0.0.1:0",
		"FN_DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "relay.db"),
	})
	p := start(t, k.vars)
	base := "http://" + p.addr
	phone, laptop := k.mint(t, "phone"), k.mint(t, "laptop")
	request(t, "POST", base+"/v1/register", phone, "")

	waitMetric(t, p, "fn_held_polls", 0)
	polled := make(chan []byte, 1)
	go func() {
		req, _ := http.NewRequest("GET", base+"/v1/poll?wait=30", nil)
		req.Header.Set("Authorization", "Bearer "+phone)
		var b []byte
		if resp, err := http.DefaultClient.Do(req); err == nil {
			b, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		polled <- b // nil on failure: the check below reports it
	}()
	waitMetric(t, p, "fn_held_polls", 1)
	if code, b := request(t, "POST", base+"/v1/send", laptop, `{"id":"m1","to":["phone"],"payload":"eA=="}`); code != 202 {
		t.Fatalf("send: %d %s", code, b)
	}
	if b := <-polled; !strings.Contains(string(b), `"m1"`) {
		t.Fatalf("poll: %s", b)
	}
	waitMetric(t, p, "fn_held_polls", 0)
	waitMetric(t, p, `fn_sends_total{code="202"}`, 1)
	waitMetric(t, p, "fn_envelopes_stored_total", 1)
	waitMetric(t, p, `fn_wakeups_signalled_total{hub="local"}`, 1)
	waitMetric(t, p, `fn_wakeups_received_total{hub="local"}`, 1)
	waitMetric(t, p, `fn_polls_total{outcome="delivered"}`, 1)
	request(t, "POST", base+"/v1/ack", phone, `{"cursor":1}`)
	waitMetric(t, p, "fn_envelopes_acknowledged_total", 1)
	request(t, "POST", base+"/v1/send", laptop, `{"id":"m2","to":["tablet"],"payload":"eA=="}`)
	waitMetric(t, p, `fn_sends_total{code="404"}`, 1)
	if p.metric(t, "fn_store_pool_max_connections") <= 0 || p.metric(t, "go_goroutines") <= 0 || p.metric(t, "process_open_fds") <= 0 {
		t.Fatal("pool, Go or process series missing")
	}
	p.documented(t)
	for _, path := range []string{"/live", "/ready"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(b) > 8 || resp.Header.Get("Server") != "" {
			t.Fatalf("%s discloses %q %v", path, b, resp.Header)
		}
	}
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestPprofOptIn: profiles are not served unless FN_PPROF_ADDR is set, and
// then only there, never on the metrics listener that a cluster scrapes.
func TestPprofOptIn(t *testing.T) {
	get := func(url string) int {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	dir := t.TempDir()
	vars := map[string]string{
		"FN_LISTEN": "127.0.0.1:0", "FN_METRICS_ADDR": "127.0.0.1:0",
		"FN_DATABASE_URL": "sqlite:" + filepath.Join(dir, "relay.db"), "FN_ISSUER_KEY_FILE": filepath.Join(dir, "issuer.key"),
	}
	p := start(t, vars)
	if p.pprof != "" {
		t.Fatalf("profiles served at %s by default", p.pprof)
	}
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/profile?seconds=1"} {
		if code := get("http://" + p.metrics + path); code != http.StatusNotFound {
			t.Errorf("metrics listener %s: %d, want 404", path, code)
		}
	}
	if code := get("http://" + p.metrics + "/metrics"); code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}

	vars["FN_PPROF_ADDR"] = "127.0.0.1:0"
	p = start(t, vars)
	if p.pprof == "" || p.pprof == p.metrics {
		t.Fatalf("profiles listener %q (metrics %q): want one of its own", p.pprof, p.metrics)
	}
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=1"} {
		if code := get("http://" + p.pprof + path); code != http.StatusOK {
			t.Errorf("profiles listener %s: %d, want 200", path, code)
		}
	}
	if code := get("http://" + p.metrics + "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("metrics listener /debug/pprof/ with FN_PPROF_ADDR set: %d, want 404", code)
	}
	if code := get("http://" + p.pprof + "/metrics"); code != http.StatusNotFound {
		t.Errorf("profiles listener /metrics: %d, want 404", code)
	}
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestLowFileLimit: under a low open-file limit (set for the child) the
// relay warns at start, answers 503 overloaded past its held-poll cap, and
// keeps serving.
func TestLowFileLimit(t *testing.T) {
	k := newKeyed(t, map[string]string{
		"FN_LISTEN": "127.0.0.1:0", "FN_METRICS_ADDR": "127.0.0.1:0", "FN_SEND_INFLIGHT": "16",
		"FN_DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "relay.db"),
	})
	// 200 descriptors, less 16 sends, 64 spare and 16 for SQLite: 104 polls.
	const limit, want = 200, 104
	p := startCmd(t, exec.Command("sh", "-c", fmt.Sprintf("ulimit -n %d && exec %s", limit, relayBin)), k.vars)
	logs := p.logs()
	if !strings.Contains(logs, "open-file limit leaves room for few held polls") || !strings.Contains(logs, fmt.Sprintf("held_polls=%d", want)) {
		t.Fatalf("no warning for the low limit:\n%s", logs)
	}
	base := "http://" + p.addr
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: want + 10}}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range want {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/poll?wait=60", nil)
			req.Header.Set("Authorization", "Bearer "+k.mint(t, fmt.Sprint("d", i)))
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	waitMetric(t, p, "fn_held_polls", want)
	code, body := request(t, "GET", base+"/v1/poll?wait=60", k.mint(t, "one-too-many"), "")
	if code != 503 || !strings.Contains(string(body), `"overloaded"`) {
		t.Fatalf("poll past the cap: %d %s", code, body)
	}
	waitMetric(t, p, `fn_admission_refusals_total{reason="held_polls"}`, 1)
	// The held polls count before their ack registers their device, so the
	// recipient here is registered explicitly.
	if code, body := request(t, "POST", base+"/v1/register", k.mint(t, "target"), ""); code != 200 {
		t.Fatalf("register with the cap reached: %d %s", code, body)
	}
	if code, body := request(t, "POST", base+"/v1/send", k.mint(t, "d0"), `{"id":"x","to":["target"],"payload":"eA=="}`); code != 202 {
		t.Fatalf("send with the cap reached: %d %s", code, body)
	}
	cancel()
	wg.Wait()
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestCrashWithAcksInFlight: devices acknowledge while sends go on, the
// relay is killed (SIGKILL) with acknowledgements not yet written, and
// started again on the same file. Each device then polls from the relay's
// stored cursor: it gets every envelope above that cursor, dense and in
// seq order, none of those above its own last ack missing. Envelopes it
// had acknowledged come back only if their ack was lost in the crash
// (delivered again, never lost), and each device's next poll with its own
// cursor acknowledges them again.
func TestCrashWithAcksInFlight(t *testing.T) {
	k := newKeyed(t, map[string]string{
		"FN_LISTEN":       "127.0.0.1:0",
		"FN_DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "relay.db"),
		// Long enough that the kill lands with acks gathered, not written.
		"FN_ACK_INTERVAL": "2s",
	})
	const devices, sends = 8, 30
	sender := k.mint(t, "sender")
	toks := make([]string, devices)
	for i := range toks {
		toks[i] = k.mint(t, fmt.Sprint("d", i))
	}
	p := start(t, k.vars)
	base := "http://" + p.addr
	for _, tok := range toks {
		if code, b := request(t, "POST", base+"/v1/register", tok, ""); code != 200 {
			t.Fatalf("register: %d %s", code, b)
		}
	}
	type envelope struct {
		Seq int64  `json:"seq"`
		ID  string `json:"id"`
	}
	poll := func(base, tok, query string) (cursor int64, got []envelope) {
		t.Helper()
		code, b := request(t, "GET", base+"/v1/poll?"+query, tok, "")
		if code != 200 {
			t.Fatalf("poll: %d %s", code, b)
		}
		var pr struct {
			Cursor    int64      `json:"cursor"`
			Envelopes []envelope `json:"envelopes"`
		}
		if err := json.Unmarshal(b, &pr); err != nil {
			t.Fatal(err)
		}
		return pr.Cursor, pr.Envelopes
	}
	acked := make([]int64, devices) // each device's last cursor sent
	for i := range sends {
		to := `"d0"`
		for d := 1; d < devices; d++ {
			to += fmt.Sprintf(`,"d%d"`, d)
		}
		body := fmt.Sprintf(`{"id":"m%d","to":[%s],"payload":"eA=="}`, i, to)
		if code, b := request(t, "POST", base+"/v1/send", sender, body); code != 202 {
			t.Fatalf("send %d: %d %s", i, code, b)
		}
		// Every few sends, each device reads and acknowledges what it has.
		if i%7 == 6 {
			for d, tok := range toks {
				cursor, _ := poll(base, tok, fmt.Sprintf("cursor=%d", acked[d]))
				acked[d] = cursor
				if code, b := request(t, "POST", base+"/v1/ack", tok, fmt.Sprintf(`{"cursor":%d}`, cursor)); code != 204 {
					t.Fatalf("ack: %d %s", code, b)
				}
			}
		}
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done

	p = start(t, k.vars)
	base = "http://" + p.addr
	redelivered := 0
	for d, tok := range toks {
		// From the stored cursor, as a client that lost its own would.
		stored, got := poll(base, tok, "limit=1000")
		if len(got) == 0 {
			t.Fatalf("d%d: nothing above stored cursor %d, want up to seq %d", d, stored, sends)
		}
		first := got[0].Seq
		if first > acked[d]+1 {
			t.Fatalf("d%d: the first envelope after the crash is seq %d, but the device had acknowledged only %d: lost", d, first, acked[d])
		}
		for i, e := range got {
			if e.Seq != first+int64(i) || e.ID != fmt.Sprint("m", e.Seq-1) {
				t.Fatalf("d%d: after the crash got %+v: not dense, in order and right", d, got)
			}
		}
		if last := got[len(got)-1].Seq; last != sends {
			t.Fatalf("d%d: last seq after the crash %d, want %d", d, last, sends)
		}
		redelivered += int(max(0, acked[d]-first+1))
		// The device's own cursor acknowledges the redelivered ones again.
		if _, again := poll(base, tok, fmt.Sprintf("cursor=%d", acked[d])); len(again) != int(sends-acked[d]) {
			t.Fatalf("d%d: from its own cursor %d got %d envelopes, want %d", d, acked[d], len(again), sends-acked[d])
		}
	}
	t.Logf("%d envelopes delivered again after the crash (their acks were not yet written)", redelivered)
	if _, err := p.stop(t); err != nil {
		t.Fatalf("relay exit: %v", err)
	}
}
