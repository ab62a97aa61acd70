// Package conformance drives client implementations through their command
// lines against a real relay process, in the faults a client must survive:
// a relay restarted, a storm of 429s, a cursor above the head, a lost
// answer, a client killed between two envelopes. Each scenario checks that
// the listener printed every envelope sent exactly once, in seq order.
package conformance

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/token"
)

// relayBin is the relay binary, built once; it is also the Go client's CLI.
var relayBin string

func TestMain(m *testing.M) { os.Exit(servicetest.RunWithRelay(m, &relayBin)) }

// waitFor polls cond until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond) // bounded poll of the condition
	}
}

// relayProc is the relay binary serving on SQLite in a directory of the
// test's, on a fixed loopback port so that it can be restarted in place.
type relayProc struct {
	t       *testing.T
	dir     string
	addr    string
	metrics string
	env     []string
	key     ed25519.PrivateKey
	cmd     *exec.Cmd
	done    chan error
	logs    *servicetest.Buffer
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startRelay starts a relay with the extra settings in vars (FN_*=value).
func startRelay(t *testing.T, vars ...string) *relayProc {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	r := &relayProc{t: t, dir: t.TempDir(), addr: freeAddr(t), metrics: freeAddr(t), key: key, logs: &servicetest.Buffer{}}
	r.env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"FN_LISTEN=" + r.addr,
		"FN_METRICS_ADDR=" + r.metrics,
		"FN_DATABASE_URL=sqlite:" + filepath.Join(r.dir, "relay.db"),
		"FN_ISSUER_KEYS=" + base64.StdEncoding.EncodeToString(pub),
		"FN_ACK_INTERVAL=50ms",
	}, vars...)
	r.start()
	t.Cleanup(func() {
		if r.cmd != nil {
			r.cmd.Process.Kill()
			<-r.done
		}
		if t.Failed() {
			t.Logf("relay log:\n%s", r.logs.String())
		}
	})
	return r
}

func (r *relayProc) url() string { return "http://" + r.addr }

// start (re)starts the relay on its port and data and waits until it is
// ready.
func (r *relayProc) start() {
	r.t.Helper()
	cmd := exec.Command(relayBin, "serve")
	cmd.Env = r.env
	cmd.Stdout, cmd.Stderr = r.logs, r.logs
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.cmd, r.done = cmd, make(chan error, 1)
	go func() { r.done <- cmd.Wait() }()
	waitFor(r.t, 30*time.Second, "the relay to be ready", func() bool {
		resp, err := http.Get(r.url() + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// stop sends SIGTERM and waits for a clean exit.
func (r *relayProc) stop() {
	r.t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		r.t.Fatal(err)
	}
	select {
	case err := <-r.done:
		if err != nil {
			r.t.Fatalf("relay exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		r.t.Fatal("relay did not stop on SIGTERM")
	}
	r.cmd = nil
}

func (r *relayProc) token(device string) string {
	r.t.Helper()
	now := time.Now()
	tok, err := token.Mint(r.key, token.Claims{Household: "home", Device: device, IssuedAt: now, Expires: now.Add(time.Hour)})
	if err != nil {
		r.t.Fatal(err)
	}
	return tok
}

// register registers device and returns its cursor as the relay knows it.
func (r *relayProc) register(device string) int64 {
	r.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, r.url()+"/v1/register", nil)
	req.Header.Set("Authorization", "Bearer "+r.token(device))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Cursor int64 `json:"cursor"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		r.t.Fatalf("register %s: %d, %v", device, resp.StatusCode, err)
	}
	return out.Cursor
}

// metric reads one series from the relay's metrics listener (0 when absent).
func (r *relayProc) metric(series string) float64 {
	r.t.Helper()
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				r.t.Fatalf("metric %s: %q", series, line)
			}
			return f
		}
	}
	return 0
}

// cliEnv is the environment of a client process: nothing of the test's but
// PATH and HOME, so no FN_* variable leaks in.
func cliEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
}

// sendResult is one run of the send command.
type sendResult struct {
	code           int
	stdout, stderr string
}

// send runs the implementation's send command and waits for it.
func (im impl) send(t *testing.T, r *relayProc, from string, args ...string) sendResult {
	t.Helper()
	return im.sendTo(t, r.url(), r.token(from), args...)
}

func (im impl) sendTo(t *testing.T, url, tok string, args ...string) sendResult {
	t.Helper()
	argv := append(im.argv(t), append([]string{"send", "-url", url, "-token", tok}, args...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = cliEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := sendResult{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		res.code = exit.ExitCode()
	case err != nil:
		t.Errorf("running send: %v", err)
		res.code = -1
	}
	return res
}

// sendAnswer is the JSON line send prints on success.
type sendAnswer struct {
	ID         string `json:"id"`
	Deliveries []struct {
		Device string `json:"device"`
		Seq    int64  `json:"seq"`
	} `json:"deliveries"`
}

// mustSend sends payload to the devices under id and checks the answer.
func (im impl) mustSend(t *testing.T, r *relayProc, from, to, id, payload string, args ...string) sendAnswer {
	t.Helper()
	res := im.send(t, r, from, append([]string{"-to", to, "-id", id}, append(args, payload)...)...)
	return res.answer(t, id)
}

func (res sendResult) answer(t *testing.T, id string) sendAnswer {
	t.Helper()
	if res.code != 0 {
		t.Fatalf("send %s: exit %d\nstdout: %s\nstderr: %s", id, res.code, res.stdout, res.stderr)
	}
	var a sendAnswer
	if err := json.Unmarshal([]byte(res.stdout), &a); err != nil || strings.Count(res.stdout, "\n") != 1 || a.ID != id || len(a.Deliveries) == 0 {
		t.Fatalf("send %s printed %q (%v), want one JSON line with its id and deliveries", id, res.stdout, err)
	}
	return a
}

// line is one envelope line a listener printed.
type line struct {
	Seq     int64  `json:"seq"`
	ID      string `json:"id"`
	From    string `json:"from"`
	SentAt  string `json:"sent_at"`
	Payload string `json:"payload"`
	// Error is listen -open's: why the envelope did not open (payload null).
	Error string `json:"error"`
}

// listener is one run of the listen command.
type listener struct {
	t      *testing.T
	cmd    *exec.Cmd
	done   chan error
	stderr *servicetest.Buffer

	mu    sync.Mutex
	lines []line
	bad   []string // stdout lines that are not envelope lines
}

// listen starts the implementation's listen command for device.
func (im impl) listen(t *testing.T, r *relayProc, device, cursorFile string, args ...string) *listener {
	t.Helper()
	argv := append(im.argv(t), append([]string{"listen", "-url", r.url(), "-token", r.token(device), "-wait", "5"}, args...)...)
	if cursorFile != "" {
		argv = append(argv, "-cursor-file", cursorFile)
	}
	return im.listenArgv(t, argv)
}

func (im impl) listenArgv(t *testing.T, argv []string) *listener {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = cliEnv()
	l := &listener{t: t, cmd: cmd, done: make(chan error, 1), stderr: &servicetest.Buffer{}}
	cmd.Stderr = l.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var ln line
			err := json.Unmarshal(sc.Bytes(), &ln)
			l.mu.Lock()
			if err != nil || ln.Seq == 0 || ln.ID == "" {
				l.bad = append(l.bad, sc.Text())
			} else {
				l.lines = append(l.lines, ln)
			}
			l.mu.Unlock()
		}
		l.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if l.cmd.ProcessState == nil {
			l.cmd.Process.Kill()
			<-l.done
		}
		if t.Failed() {
			t.Logf("listener stderr:\n%s", l.stderr.String())
		}
	})
	return l
}

func (l *listener) printed() []line {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.bad) > 0 {
		l.t.Errorf("listener printed lines that are not envelopes: %q", l.bad)
	}
	return slices.Clone(l.lines)
}

// waitPrinted waits until the listener printed at least n lines.
func (l *listener) waitPrinted(n int, d time.Duration) {
	l.t.Helper()
	waitFor(l.t, d, fmt.Sprintf("%d envelope lines", n), func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.lines) >= n
	})
}

// stop sends SIGTERM and expects exit 0.
func (l *listener) stop() {
	l.t.Helper()
	if err := l.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		l.t.Fatal(err)
	}
	l.wait(0)
}

// kill sends SIGKILL and waits for the process to end.
func (l *listener) kill() {
	l.t.Helper()
	if err := l.cmd.Process.Kill(); err != nil {
		l.t.Fatal(err)
	}
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
		l.t.Fatal("listener did not die on SIGKILL")
	}
}

// wait waits for the listener to exit with code.
func (l *listener) wait(code int) {
	l.t.Helper()
	select {
	case err := <-l.done:
		got := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			got = exit.ExitCode()
		} else if err != nil {
			l.t.Fatalf("listener: %v", err)
		}
		if got != code {
			l.t.Fatalf("listener exit %d, want %d; stderr:\n%s", got, code, l.stderr.String())
		}
	case <-time.After(15 * time.Second):
		l.t.Fatal("listener did not exit")
	}
}

// readCursor is the cursor file's content as a number (-1 when absent or
// not a number).
func readCursor(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
		return -1
	}
	// The digits, then a space and the store's epoch once a relay named one.
	digits, _, _ := strings.Cut(string(b[:len(b)-1]), " ")
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// exactlyOnce checks that the lines are the envelopes sent (id to payload),
// each once, in strictly increasing seq order, from the sender.
func exactlyOnce(t *testing.T, lines []line, sent map[string]string, from string) {
	t.Helper()
	seen := map[string]int{}
	var prev int64
	for i, ln := range lines {
		seen[ln.ID]++
		if ln.Seq <= prev {
			t.Errorf("line %d: seq %d after %d", i, ln.Seq, prev)
		}
		prev = ln.Seq
		want, ok := sent[ln.ID]
		if !ok {
			t.Errorf("line %d: id %q was never sent", i, ln.ID)
			continue
		}
		if ln.Payload != base64.StdEncoding.EncodeToString([]byte(want)) || ln.From != from {
			t.Errorf("line %d: %+v, want payload %q from %s", i, ln, want, from)
		}
		if _, err := time.Parse(time.RFC3339Nano, ln.SentAt); err != nil {
			t.Errorf("line %d: sent_at %q: %v", i, ln.SentAt, err)
		}
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("id %s printed %d times", id, n)
		}
	}
	for id := range sent {
		if seen[id] == 0 {
			t.Errorf("id %s sent but never printed", id)
		}
	}
	if t.Failed() {
		t.Logf("printed seqs %v", seqsOf(lines))
	}
}

func seqsOf(lines []line) []int64 {
	var s []int64
	for _, l := range lines {
		s = append(s, l.Seq)
	}
	return s
}

// forEach runs f as a subtest per implementation.
func forEach(t *testing.T, f func(t *testing.T, im impl)) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) { f(t, im) })
	}
}

// stdinSend runs send with payload on its stdin.
func (im impl) stdinSend(t *testing.T, r *relayProc, payload string, args ...string) sendResult {
	t.Helper()
	argv := append(im.argv(t), append([]string{"send", "-url", r.url(), "-token", r.token("laptop")}, args...)...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = cliEnv()
	cmd.Stdin = strings.NewReader(payload)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := sendResult{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		res.code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("running send: %v", err)
	}
	return res
}

// listenTok starts listen with a token of the test's choosing and no
// cursor file.
func (im impl) listenTok(t *testing.T, url, tok string) *listener {
	t.Helper()
	return im.listenArgv(t, append(im.argv(t), "listen", "-url", url, "-token", tok, "-wait", "5"))
}
