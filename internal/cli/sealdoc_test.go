package cli

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// docExample is a Go block in a doc, headed by a marker naming the example
// function it copies.
var docExample = regexp.MustCompile("(?s)<!-- example: (\\S+) (\\S+) -->\n```go\n(.*?)```\n")

// TestE2EDocExample keeps each Go snippet of docs/E2E.md equal to the body
// of the example it names, which go test runs against a real relay: the
// doc shows code that runs, and says what it prints.
func TestE2EDocExample(t *testing.T) {
	doc, err := os.ReadFile("docs/E2E.md")
	if err != nil {
		t.Fatal(err)
	}
	ms := docExample.FindAllStringSubmatch(string(doc), -1)
	if len(ms) == 0 {
		t.Fatal("docs/E2E.md has no example marker")
	}
	for _, m := range ms {
		file, fn, snippet := m[1], m[2], m[3]
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		body, ok := funcBody(string(src), fn)
		if !ok {
			t.Errorf("%s has no func %s", file, fn)
			continue
		}
		if body != snippet {
			t.Errorf("docs/E2E.md's copy of %s differs from %s:\n--- doc\n%s--- code\n%s", fn, file, snippet, body)
		}
	}
}

// funcBody is the body of the top-level func name in src, one tab of
// indentation taken off each line.
func funcBody(src, name string) (string, bool) {
	_, rest, ok := strings.Cut(src, "\nfunc "+name+"() {\n")
	if !ok {
		return "", false
	}
	body, _, ok := strings.Cut(rest, "\n}\n")
	if !ok {
		return "", false
	}
	var b strings.Builder
	for line := range strings.Lines(body + "\n") {
		b.WriteString(strings.TrimPrefix(line, "\t"))
	}
	return b.String(), true
}
