//go:build linux

package servicetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/procstat"
)

// Browser is headless Chromium driven over the DevTools protocol on a
// pipe (--remote-debugging-pipe: JSON messages ended by a NUL byte on
// file descriptors 3 and 4), with one page attached. It runs as the
// clients' browser test runs it: the same flags, a fresh profile, a
// process group of its own that the test's cleanup kills, and a check
// that none of its processes is left.
type Browser struct {
	t       testing.TB
	toPage  *os.File
	session string

	mu      sync.Mutex
	next    int
	waiting map[int]chan cdpMessage
	logged  []string     // errors the page logged: exceptions, policy violations
	events  []cdpMessage // ServiceWorker domain events, for Events
	closed  error
}

type cdpMessage struct {
	ID        int             `json:"id,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// Chromium starts headless Chromium with an empty page of width x height
// CSS pixels, or skips the test without it (fails it when services are
// required).
func Chromium(t testing.TB, width, height int) *Browser {
	t.Helper()
	bin := ""
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		Unavailable(t, "chromium", errors.New("not installed"))
	}
	profile := t.TempDir()
	pageIn, toPage, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	fromPage, pageOut, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var out Buffer
	cmd := exec.Command(bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--hide-scrollbars", "--remote-debugging-pipe", "--user-data-dir="+profile, "about:blank")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.ExtraFiles = []*os.File{pageIn, pageOut} // fds 3 and 4
	// Its own process group: Chromium's helpers are ended with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pageIn.Close()
	pageOut.Close()
	b := &Browser{t: t, toPage: toPage, waiting: map[int]chan cdpMessage{}}
	read := make(chan struct{})
	go func() {
		defer close(read)
		b.read(fromPage)
	}()
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		toPage.Close()
		fromPage.Close()
		<-read
		noneLeft(t, "--user-data-dir="+profile)
		if t.Failed() {
			t.Logf("chromium said:\n%s", out.String())
		}
	})

	var targets struct {
		TargetInfos []struct {
			TargetID string `json:"targetId"`
			Type     string `json:"type"`
		} `json:"targetInfos"`
	}
	b.call("", "Target.getTargets", nil, &targets)
	target := ""
	for _, ti := range targets.TargetInfos {
		if ti.Type == "page" {
			target = ti.TargetID
		}
	}
	if target == "" {
		var created struct {
			TargetID string `json:"targetId"`
		}
		b.call("", "Target.createTarget", map[string]any{"url": "about:blank"}, &created)
		target = created.TargetID
	}
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	b.call("", "Target.attachToTarget", map[string]any{"targetId": target, "flatten": true}, &attached)
	b.session = attached.SessionID
	for _, m := range []string{"Page.enable", "Runtime.enable", "Log.enable"} {
		b.Call(m, nil, nil)
	}
	b.Resize(width, height)
	return b
}

// read hands answers to their callers and keeps the page's errors, until
// the pipe closes.
func (b *Browser) read(r *os.File) {
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		line, err := br.ReadBytes(0)
		if err != nil {
			b.mu.Lock()
			b.closed = fmt.Errorf("the DevTools pipe closed: %w", err)
			for id, ch := range b.waiting {
				close(ch)
				delete(b.waiting, id)
			}
			b.mu.Unlock()
			return
		}
		var m cdpMessage
		if json.Unmarshal(bytes.TrimSuffix(line, []byte{0}), &m) != nil {
			continue
		}
		b.mu.Lock()
		if ch, ok := b.waiting[m.ID]; ok && m.ID != 0 {
			ch <- m
			delete(b.waiting, m.ID)
		} else if e := pageError(m); e != "" {
			b.logged = append(b.logged, e)
		} else if strings.HasPrefix(m.Method, "ServiceWorker.") {
			b.events = append(b.events, m)
		}
		b.mu.Unlock()
	}
}

// pageError is what an event says went wrong in the page, or "".
func pageError(m cdpMessage) string {
	switch m.Method {
	case "Log.entryAdded":
		var p struct {
			Entry struct{ Level, Source, Text, URL string } `json:"entry"`
		}
		if json.Unmarshal(m.Params, &p) == nil && p.Entry.Level == "error" {
			return fmt.Sprintf("%s: %s (%s)", p.Entry.Source, p.Entry.Text, p.Entry.URL)
		}
	case "Runtime.exceptionThrown":
		return "exception: " + string(m.Params)
	case "Runtime.consoleAPICalled":
		var p struct{ Type string }
		if json.Unmarshal(m.Params, &p) == nil && p.Type == "error" {
			return "console.error: " + string(m.Params)
		}
	}
	return ""
}

// Events are the params of the ServiceWorker domain's events named method
// received so far (after ServiceWorker.enable), oldest first.
func (b *Browser) Events(method string) []json.RawMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []json.RawMessage
	for _, m := range b.events {
		if m.Method == method {
			out = append(out, m.Params)
		}
	}
	return out
}

// CallBrowser sends a command to the browser itself (the Browser domain,
// such as Browser.grantPermissions), not to the page.
func (b *Browser) CallBrowser(method string, params, result any) {
	b.t.Helper()
	b.call("", method, params, result)
}

// Call sends a command to the page and decodes its result into result
// (when not nil); an error answer fails the test.
func (b *Browser) Call(method string, params, result any) {
	b.t.Helper()
	b.call(b.session, method, params, result)
}

func (b *Browser) call(session, method string, params, result any) {
	b.t.Helper()
	if err := b.callErr(session, method, params, result); err != nil {
		b.t.Fatal(err)
	}
}

// callErr is call that returns the page's error answer instead of
// failing the test: an evaluation while the page navigates is answered
// "Inspected target navigated or closed", which WaitFor waits out. A
// broken pipe or a silent browser still fails the test.
func (b *Browser) callErr(session, method string, params, result any) error {
	b.t.Helper()
	raw, err := json.Marshal(params)
	if err != nil {
		b.t.Fatal(err)
	}
	if params == nil {
		raw = nil
	}
	ch := make(chan cdpMessage, 1)
	b.mu.Lock()
	if b.closed != nil {
		b.mu.Unlock()
		b.t.Fatalf("%s: %v", method, b.closed)
	}
	b.next++
	id := b.next
	b.waiting[id] = ch
	b.mu.Unlock()
	msg, err := json.Marshal(cdpMessage{ID: id, Method: method, Params: raw, SessionID: session})
	if err != nil {
		b.t.Fatal(err)
	}
	if _, err := b.toPage.Write(append(msg, 0)); err != nil {
		b.t.Fatalf("%s: %v", method, err)
	}
	var m cdpMessage
	var ok bool
	select {
	case m, ok = <-ch:
	case <-time.After(30 * time.Second):
		b.t.Fatalf("%s: no answer within 30 s", method)
	}
	if !ok {
		b.t.Fatalf("%s: the DevTools pipe closed", method)
	}
	if m.Error != nil {
		return fmt.Errorf("%s: %d %s", method, m.Error.Code, m.Error.Message)
	}
	if result != nil {
		if err := json.Unmarshal(m.Result, result); err != nil {
			b.t.Fatalf("%s: %v in %s", method, err, m.Result)
		}
	}
	return nil
}

// Navigate opens url and waits until its document has loaded.
func (b *Browser) Navigate(url string) {
	b.t.Helper()
	b.Call("Page.navigate", map[string]any{"url": url}, nil)
	b.WaitFor("the page loaded", `document.readyState === "complete" && location.href !== "about:blank"`)
}

// Eval runs a JavaScript expression in the page, awaiting a promise, and
// decodes its value into result (when not nil); a throw fails the test.
func (b *Browser) Eval(expr string, result any) {
	b.t.Helper()
	if err := b.eval(expr, result); err != nil {
		b.t.Fatalf("%s: %v", expr, err)
	}
}

func (b *Browser) eval(expr string, result any) error {
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := b.callErr(b.session, "Runtime.evaluate", map[string]any{"expression": expr, "awaitPromise": true, "returnByValue": true}, &r); err != nil {
		return err
	}
	if e := r.ExceptionDetails; e != nil {
		return fmt.Errorf("%s %s", e.Text, e.Exception.Description)
	}
	if result != nil && len(r.Result.Value) > 0 {
		return json.Unmarshal(r.Result.Value, result)
	}
	return nil
}

// WaitFor polls a JavaScript condition until it is true, for up to 20 s.
func (b *Browser) WaitFor(what, cond string) {
	b.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var ok bool
		err := b.eval("!!("+cond+")", &ok)
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			var body string
			_ = b.eval("document.body ? document.body.innerText : ''", &body)
			b.t.Fatalf("waited 20 s for %s (%s; %v); the page shows:\n%s", what, cond, err, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Resize sets the page's viewport to width x height CSS pixels, one
// device pixel each.
func (b *Browser) Resize(width, height int) {
	b.t.Helper()
	b.Call("Emulation.setDeviceMetricsOverride", map[string]any{"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}, nil)
}

// Screenshot is the viewport as PNG.
func (b *Browser) Screenshot() []byte {
	b.t.Helper()
	var r struct {
		Data string `json:"data"`
	}
	b.Call("Page.captureScreenshot", map[string]any{"format": "png"}, &r)
	png, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil {
		b.t.Fatal(err)
	}
	return png
}

// Errors are the errors the page logged so far: exceptions, failed
// loads, Content-Security-Policy violations, console.error.
func (b *Browser) Errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.logged...)
}

// noneLeft fails the test if a process whose command line holds arg
// still runs, after up to 10 s.
func noneLeft(t testing.TB, arg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		left := procstat.WithArg(arg)
		if len(left) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Errorf("chromium processes left running: %v", left)
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}
