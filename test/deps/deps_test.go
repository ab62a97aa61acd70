package deps

import (
	"os/exec"
	"path"
	"strings"
	"testing"
)

// TestBinariesLinkNoTestCode: no binary of the module (every main package)
// links the testing package or a test helper package (a name ending in
// "test"): helpers that take a testing.TB live in xxxtest packages, which
// only tests import. Seen red with the load tester importing hapg's Start.
func TestBinariesLinkNoTestCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, "github.com/flamenet/relay/...").Output()
	if err != nil {
		t.Fatal(err)
	}
	bins := strings.Fields(string(out))
	if len(bins) < 2 {
		t.Fatalf("found binaries %v, want the relay and the load tester at least", bins)
	}
	for _, bin := range bins {
		out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}} {{.Standard}}`, bin).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			pkg, std, _ := strings.Cut(line, " ")
			switch {
			case pkg == bin:
			case pkg == "testing", std == "false" && strings.HasSuffix(path.Base(pkg), "test"):
				t.Errorf("%s links %s", bin, pkg)
			}
		}
	}
}
