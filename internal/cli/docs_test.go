package cli

import (
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/flamenet/relay/internal/config"
)

var update = flag.Bool("update", false, "rewrite generated sections of the docs")

const (
	settingsBegin = "<!-- settings:begin (generated: go test ./internal/cli -run TestSettingsDocs -update) -->\n"
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
		t.Errorf("%s: the settings table differs from the code; run go test ./internal/cli -run TestSettingsDocs -update", path)
	}
}

const (
	exampleBegin = "<!-- example:begin token.ExampleMint (generated: go test ./internal/cli -run TestExampleDocs -update) -->\n"
	exampleEnd   = "<!-- example:end -->"
)

// TestExampleDocs keeps docs/OPERATIONS.md's minting snippet equal to the
// body of token.ExampleMint, which go test runs and checks (its Output),
// so the snippet is code that compiles and does what the doc says.
func TestExampleDocs(t *testing.T) {
	const src, path = "token/example_test.go", "docs/OPERATIONS.md"
	body := exampleBody(t, src, "ExampleMint")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, exampleBegin), strings.Index(doc, exampleEnd)
	if i < 0 || j < i {
		t.Fatalf("%s: no example section between markers", path)
	}
	want := doc[:i+len(exampleBegin)] + "```go\n" + body + "```\n" + doc[j:]
	if want == doc {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s: the minting snippet differs from %s's %s; run go test ./internal/cli -run TestExampleDocs -update", path, src, "ExampleMint")
}

// exampleBody is the statements of function name in file src, one tab of
// indentation removed, without the Output comment.
func exampleBody(t *testing.T, src, name string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, src, b, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != name {
			continue
		}
		inner := string(b[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset])
		var out strings.Builder
		for line := range strings.Lines(strings.TrimPrefix(inner, "\n")) {
			if strings.HasPrefix(strings.TrimSpace(line), "// Output:") {
				continue
			}
			out.WriteString(strings.TrimPrefix(line, "\t"))
		}
		return out.String()
	}
	t.Fatalf("%s: no func %s", src, name)
	return ""
}

// TestArchitectureNamesTheTree holds ARCHITECTURE.md's first screen to the
// tree: its indented list names every directory and Go file at the root
// and nothing else, the root stays small, and its package table has a row
// for every package go list finds and none for a package that is gone.
func TestArchitectureNamesTheTree(t *testing.T) {
	b, err := os.ReadFile("docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	listed := map[string]bool{}
	for _, l := range strings.Split(doc[:strings.Index(doc, "## Packages")], "\n") {
		if name, ok := strings.CutPrefix(l, "    "); ok {
			listed[strings.TrimSuffix(strings.Fields(name)[0], "/")] = true
		}
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var shown, goFiles int
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		shown++
		if !e.IsDir() && !strings.HasSuffix(name, ".go") {
			continue
		}
		if strings.HasSuffix(name, ".go") {
			goFiles++
		}
		if !listed[name] {
			t.Errorf("docs/ARCHITECTURE.md's tree does not name %s", name)
		}
		delete(listed, name)
	}
	for name := range listed {
		t.Errorf("docs/ARCHITECTURE.md's tree names %s, which is not at the root", name)
	}
	if shown > 25 || goFiles > 2 {
		t.Errorf("the root holds %d entries, %d of them Go files: at most 25 and 2", shown, goFiles)
	}

	rows := map[string]bool{}
	for _, l := range strings.Split(doc, "\n") {
		if cell, ok := strings.CutPrefix(l, "| `"); ok {
			cell, _, _ = strings.Cut(cell, " |")
			for _, p := range strings.Split(cell, ", ") {
				rows[strings.Trim(p, "`")] = true
			}
		}
	}
	out, err := exec.Command("go", "list", "./...").Output()
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/flamenet/relay"
	for _, p := range strings.Fields(string(out)) {
		if p == module {
			continue // main.go, in the tree
		}
		p = strings.TrimPrefix(p, module+"/")
		if !rows[p] {
			t.Errorf("docs/ARCHITECTURE.md's package table has no row for %s", p)
		}
		delete(rows, p)
	}
	for p := range rows {
		t.Errorf("docs/ARCHITECTURE.md's package table has a row for %s, which go list does not find", p)
	}
}
