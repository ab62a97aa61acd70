package main

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/flamenet/relay/config"
)

var update = flag.Bool("update", false, "rewrite generated sections of the docs")

const (
	settingsBegin = "<!-- settings:begin (generated: go test . -run TestSettingsDocs -update) -->\n"
	settingsEnd   = "<!-- settings:end -->"
)

// TestSettingsDocs keeps the settings tables in the docs equal to the
// code's own list, so they cannot drift.
func TestSettingsDocs(t *testing.T) {
	for _, path := range []string{"README.md", "docs/OPERATIONS.md"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		doc := string(b)
		i, j := strings.Index(doc, settingsBegin), strings.Index(doc, settingsEnd)
		if i < 0 || j < i {
			t.Fatalf("%s: no settings section between markers", path)
		}
		want := doc[:i+len(settingsBegin)] + config.Table() + doc[j:]
		if want == doc {
			continue
		}
		if *update {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		t.Errorf("%s: the settings table differs from the code; run go test . -run TestSettingsDocs -update", path)
	}
}
