package clients

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestReadmeTypeScriptSnippet runs the README's TypeScript program as
// written, in a fresh npm project (npm init -y: "type" commonjs, as a new
// reader's), with the client installed from this checkout the way the
// README says: it prints an envelope sent to its device.
func TestReadmeTypeScriptSnippet(t *testing.T) {
	npm := need(t, "npm")
	node := need(t, "node")
	buildTypeScript(t)
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```js\n// listen.mjs\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no ```js block starting // listen.mjs")
	}
	if !strings.Contains(string(readme), "npm init -y && npm install /path/to/relay/client/typescript") {
		t.Fatal("README.md no longer says how the app installs the client")
	}

	app := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tsDirAbs, err := filepath.Abs(tsDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"init", "-y"}, {"install", "--no-audit", "--no-fund", "--offline", tsDirAbs}} {
		cmd := exec.CommandContext(ctx, npm, args...)
		cmd.Dir = app
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// As written, with the relay off the default port (8080 may be another
	// test's) and FN_RELAY_URL naming it, as a reader's who set FN_LISTEN.
	// Seen red when the program named http://127.0.0.1:8080 outright.
	relay := startRelay(t)
	if err := os.WriteFile(filepath.Join(app, "listen.mjs"), m[1], 0o644); err != nil {
		t.Fatal(err)
	}
	phone, laptop := relay.token(t, "home", "phone"), relay.token(t, "home", "laptop")
	cmd := exec.CommandContext(ctx, node, "listen.mjs")
	cmd.Dir = app
	cmd.Env = append(cleanEnv(), "PHONE="+phone, "FN_RELAY_URL="+relay.URL)
	dieWithTest(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	// The listener's first poll registers its device: wait for it in the
	// directory before sending to it.
	polled, cancelPolled := context.WithTimeout(ctx, 30*time.Second)
	defer cancelPolled()
	for !strings.Contains(devices(t, relay, laptop), `"device":"phone"`) {
		select {
		case <-polled.Done():
			t.Fatal("listen.mjs never polled the relay at FN_RELAY_URL")
		case <-time.After(20 * time.Millisecond): // bounded poll of another process
		}
	}
	send := exec.CommandContext(ctx, relay.bin, "send", "-url", relay.URL, "-to", "phone", "hello from the README")
	send.Env = append(cleanEnv(), "FN_TOKEN="+laptop)
	if out, err := send.CombinedOutput(); err != nil {
		t.Fatalf("relay send: %v\n%s", err, out)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case line, ok := <-lines:
		if !ok || line != "1 hello from the README" {
			t.Fatalf("listen.mjs printed %q (open: %v), want %q", line, ok, "1 hello from the README")
		}
	case <-ctx.Done():
		t.Fatal("listen.mjs printed nothing")
	}
}

// devices is the household's directory as tok's device reads it.
func devices(t *testing.T, relay *relayProc, tok string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", relay.URL+"/v1/devices", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
