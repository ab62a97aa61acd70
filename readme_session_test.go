package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// sessionBlock is the first sh block after heading in the README.
func sessionBlock(t *testing.T, readme, heading string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("the README has no %q", heading)
	}
	m := regexp.MustCompile("(?s)```sh\n(.*?)```\n").FindStringSubmatch(rest)
	if m == nil {
		t.Fatalf("no sh block after %q", heading)
	}
	return m[1]
}

// TestReadmeSealedSession runs the README's session, the plain round trip
// and then the sealed one, with bash in a fresh directory beside a relay
// process started there (as `go run .` would be), and checks what the
// README says it prints. What is changed for the test: the relay binary is
// the test's (no `go build`); each listener stops after one envelope
// (-count 1) and is waited for where the README kills it; and where the
// README sleeps a second for the listener to register, the script waits
// until the directory shows it.
func TestReadmeSealedSession(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	plain := sessionBlock(t, readme, "## A session")
	sealed := sessionBlock(t, readme, "### Sealed")

	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(relayBin, filepath.Join(dir, "bin", "relay")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(relayBin)
	cmd.Dir = dir
	p := startCmd(t, cmd, map[string]string{"FN_LISTEN": "127.0.0.1:0"})
	defer p.stop(t)

	settles := []string{`'"device":"phone"'`, `'"device":"phone","identity_key":"'`}
	var script strings.Builder
	// A failing script takes its listeners with it.
	script.WriteString(`trap 'kill $(jobs -p) 2>/dev/null' EXIT
settle() {
  for i in $(seq 400); do
    curl -s -H "Authorization: Bearer $LAPTOP" "$FN_RELAY_URL/v1/devices" | grep -q "$1" && return 0
    sleep 0.05
  done
  echo "the phone never registered" >&2; return 1
}
`)
	for _, line := range strings.Split(plain+sealed, "\n") {
		switch cmd, _, _ := strings.Cut(line, "#"); {
		case strings.HasPrefix(line, "go build"):
			continue
		case strings.TrimSpace(line) == "sleep 1":
			if len(settles) == 0 {
				t.Fatal("more sleeps in the session than the test knows")
			}
			line = "settle " + settles[0] + " || exit 1"
			settles = settles[1:]
		case strings.HasPrefix(line, "kill %1"):
			line = "wait"
		case strings.HasPrefix(line, "bin/relay listen") && strings.HasSuffix(strings.TrimSpace(cmd), "&"):
			line = strings.TrimSuffix(strings.TrimSpace(cmd), "&") + " -count 1 &"
		}
		script.WriteString(line + "\n")
	}
	script.WriteString("wait\n")
	if len(settles) != 0 {
		t.Fatalf("the session has fewer sleeps than the test knows:\n%s", script.String())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sh := exec.CommandContext(ctx, "bash", "-c", script.String())
	sh.WaitDelay = 5 * time.Second // a listener left behind holds the pipes
	sh.Dir = dir
	sh.Env = []string{"PATH=" + os.Getenv("PATH"), "FN_RELAY_URL=http://" + p.addr}
	var stdout, stderr strings.Builder
	sh.Stdout, sh.Stderr = &stdout, &stderr
	if err := sh.Run(); err != nil {
		t.Fatalf("the session: %v\n%s\n%s\nscript:\n%s", err, stdout.String(), stderr.String(), script.String())
	}
	out := stdout.String()
	for _, want := range []string{
		`"deliveries":[{"device":"phone","seq":1}]}`,
		`"from":"laptop",`,
		`"payload":"aGVsbG8="}`,
		`"deliveries":[{"device":"phone","seq":2}]}`,
		`{"seq":2,`,
		`"payload":"aGVsbG8sIHNlYWxlZA=="}`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the session's output lacks %s:\n%s\n%s", want, out, stderr.String())
		}
		if !strings.Contains(readme, want) {
			t.Errorf("the README does not show %s", want)
		}
	}
	for _, want := range []string{"created the identity phone.id; phone's fingerprint: ", "created the identity laptop.id; laptop's fingerprint: "} {
		if !strings.Contains(stderr.String(), want) || !strings.Contains(readme, want) {
			t.Errorf("stderr, or the README, lacks %q:\n%s", want, stderr.String())
		}
	}
}
