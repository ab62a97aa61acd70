package cli

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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

// httpMark splits the session's output from the curl session's.
const httpMark = "=== over HTTP ==="

// answersBlock is the first plain code block after the sh block after
// heading: the answers the README shows for it.
func answersBlock(t *testing.T, readme, heading string) string {
	t.Helper()
	_, rest, _ := strings.Cut(readme, "\n"+heading+"\n")
	m := regexp.MustCompile("(?s)```sh\n.*?```\n.*?```\n(.*?)```\n").FindStringSubmatch(rest)
	if m == nil {
		t.Fatalf("no answers block after %q", heading)
	}
	return m[1]
}

// sameAnswers compares the README's answers with the relay's, line by
// line: a JSON answer must have the same fields, at every depth and in the
// same order, as the README's (the values differ: ids, times), any other
// line the same text. Seen red when the README's register and poll answers
// lacked epoch, and when its poll answer put epoch last.
func sameAnswers(t *testing.T, readme, got string) {
	t.Helper()
	want, have := strings.Split(strings.TrimSpace(readme), "\n"), splitAnswers(got)
	if len(want) != len(have) {
		t.Fatalf("the README shows %d answers, the relay gave %d:\n%q", len(want), len(have), got)
	}
	for i := range want {
		var w, h any
		if json.Unmarshal([]byte(want[i]), &w) != nil {
			if want[i] != have[i] {
				t.Errorf("answer %d: the README shows %q, the relay gave %q", i+1, want[i], have[i])
			}
			continue
		}
		if err := json.Unmarshal([]byte(have[i]), &h); err != nil {
			t.Errorf("answer %d: the README shows JSON, the relay gave %q", i+1, have[i])
			continue
		}
		if wf, hf := fieldPaths(w, ""), fieldPaths(h, ""); !slices.Equal(wf, hf) {
			t.Errorf("answer %d's fields: the README shows %q, the relay gives %q", i+1, wf, hf)
			continue
		}
		if wo, ho := keyOrder(want[i]), keyOrder(have[i]); !slices.Equal(wo, ho) {
			t.Errorf("answer %d's field order: the README shows %q, the relay gives %q", i+1, wo, ho)
		}
	}
}

// splitAnswers splits curl's output into answers: a JSON body may end
// without a newline, right before the next answer.
func splitAnswers(out string) []string {
	var answers []string
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			break
		}
		answers = append(answers, string(raw))
	}
	return answers
}

// fieldPaths lists the fields of a decoded JSON value, sorted, as dotted
// paths ("envelopes[].seq").
func fieldPaths(v any, prefix string) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			out = append(out, prefix+k)
			out = append(out, fieldPaths(x, prefix+k+".")...)
		}
	case []any:
		for _, x := range v {
			out = append(out, fieldPaths(x, strings.TrimSuffix(prefix, ".")+"[].")...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// keyOrder lists the fields of a JSON text as fieldPaths names them, in
// the order they first appear: a map loses it.
func keyOrder(text string) []string {
	dec := json.NewDecoder(strings.NewReader(text))
	var out []string
	seen := map[string]bool{}
	var walk func(prefix string) bool
	walk = func(prefix string) bool {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		switch tok {
		case json.Delim('{'):
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return false
				}
				path := prefix + k.(string)
				if !seen[path] {
					seen[path] = true
					out = append(out, path)
				}
				if !walk(path + ".") {
					return false
				}
			}
		case json.Delim('['):
			for dec.More() {
				if !walk(strings.TrimSuffix(prefix, ".") + "[].") {
					return false
				}
			}
		default:
			return true
		}
		_, err = dec.Token() // the closing delimiter
		return err == nil
	}
	walk("")
	return out
}

// TestReadmeSealedSession runs the README's session, the plain round trip
// and then the sealed one, with bash in a fresh directory beside a relay
// process started there (as `go run .` would be), and checks what the
// README says it prints. What is changed for the test: the relay binary is
// the test's (no `go build`); each listener stops after one envelope
// (-count 1) and is waited for where the README kills it; and where the
// README sleeps a second for the listener to register, the script waits
// until the directory shows it. Last, the curl session runs as written,
// with FN_RELAY_URL set and the relay off the default port, as a reader's
// who followed the README with FN_LISTEN set; its answers' fields are
// compared with the README's. Seen red when the curl lines named
// http://127.0.0.1:8080 outright.
func TestReadmeSealedSession(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	plain := sessionBlock(t, readme, "## A session")
	sealed := sessionBlock(t, readme, "### Sealed")
	overHTTP := sessionBlock(t, readme, "### The same over HTTP")
	answers := answersBlock(t, readme, "### The same over HTTP")
	// The section's commands outside the block (a held poll) too.
	section, _, _ := strings.Cut(strings.SplitN(readme, "\n### The same over HTTP\n", 2)[1], "\n## ")
	if n, m := strings.Count(section, "http://127.0.0.1:8080"), strings.Count(section, "${FN_RELAY_URL:-http://127.0.0.1:8080}"); n != m {
		t.Errorf("%d of the HTTP section's %d addresses do not follow FN_RELAY_URL (${FN_RELAY_URL:-http://127.0.0.1:8080})", n-m, n)
	}

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
	// Then the curl session, as written: the relay is not on the default
	// port, so its commands must follow FN_RELAY_URL.
	script.WriteString("echo " + httpMark + "\n")
	script.WriteString(overHTTP)
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
	out, httpOut, ok := strings.Cut(stdout.String(), httpMark+"\n")
	if !ok {
		t.Fatalf("the curl session never ran:\n%s", stdout.String())
	}
	sameAnswers(t, answers, httpOut)
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
