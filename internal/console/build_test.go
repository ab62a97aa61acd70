package console

import (
	"encoding/json"
	"flag"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/flamenet/relay/internal/servicetest"
)

var update = flag.Bool("update", false, "rewrite assets/ from a fresh build of web/ and the TypeScript client")

// TestAssetsBuilt holds the committed assets/ to a fresh build: web/'s
// page and style as they are, console.ts compiled against the TypeScript
// client's types, and the client's compiled modules that console.js
// imports, the pairing page (web/pair/, its pair.ts compiled), and
// nothing else. With -update it writes the build to
// assets/. Needs node and npm (npm ci fetches the TypeScript compiler).
func TestAssetsBuilt(t *testing.T) {
	want := build(t)
	if *update {
		if err := os.RemoveAll("assets"); err != nil {
			t.Fatal(err)
		}
		for name, b := range want {
			p := filepath.Join("assets", filepath.FromSlash(name))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	got := map[string][]byte{}
	err := filepath.WalkDir("assets", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel("assets", p)
		got[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if b, ok := got[name]; !ok {
			t.Errorf("assets/%s is missing", name)
		} else if string(b) != string(want[name]) {
			t.Errorf("assets/%s differs from a fresh build", name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[name]; !ok {
			t.Errorf("assets/%s is not built from the sources", name)
		}
	}
	if t.Failed() {
		t.Log("run go test ./console -run TestAssetsBuilt -update")
	}
	if len(want) < 4 {
		t.Errorf("the build made only %v", slices.Sorted(maps.Keys(want)))
	}
}

// build compiles the console into a map from path (below assets/) to
// content.
func build(t *testing.T) map[string][]byte {
	t.Helper()
	ts := servicetest.TypeScriptClient(t)
	web, err := filepath.Abs("web")
	if err != nil {
		t.Fatal(err)
	}
	dist := filepath.Join(ts, "dist")
	tmp := t.TempDir()
	// The client's declarations beside where console.ts finds its
	// modules (./client/...): rootDirs merges the two folders.
	types := filepath.Join(tmp, "types")
	decls, err := filepath.Glob(filepath.Join(dist, "*.d.ts"))
	if err != nil || len(decls) == 0 {
		t.Fatalf("no declarations in %s (%v)", dist, err)
	}
	for _, d := range decls {
		copyFile(t, d, filepath.Join(types, "client", filepath.Base(d)))
	}
	out := filepath.Join(tmp, "out")
	conf, err := json.Marshal(map[string]any{
		"extends":         filepath.Join(web, "tsconfig.json"),
		"compilerOptions": map[string]any{"rootDirs": []string{web, types}, "rootDir": web, "outDir": out},
		"files":           []string{filepath.Join(web, "console.ts"), filepath.Join(web, "pair", "pair.ts")},
	})
	if err != nil {
		t.Fatal(err)
	}
	confFile := filepath.Join(tmp, "tsconfig.json")
	if err := os.WriteFile(confFile, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", filepath.Join(ts, "node_modules", "typescript", "bin", "tsc"), "-p", confFile)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tsc: %v\n%s", err, b)
	}

	files := map[string][]byte{}
	for _, name := range []string{"index.html", "console.css", "favicon.svg", "pair/index.html", "pair/pair.css"} {
		files[name] = read(t, filepath.Join(web, filepath.FromSlash(name)))
	}
	files["console.js"] = read(t, filepath.Join(out, "console.js"))
	files["pair/pair.js"] = read(t, filepath.Join(out, "pair", "pair.js"))
	// The client's modules console.js needs, and theirs.
	imports := regexp.MustCompile(`(?m)^(?:import|export)\b[^;]*?\bfrom "\./((?:client/)?[a-z0-9-]+\.js)";`)
	todo := []string{"console.js"}
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		for _, m := range imports.FindAllStringSubmatch(string(files[name]), -1) {
			dep := m[1]
			if name != "console.js" {
				dep = "client/" + dep
			}
			if _, ok := files[dep]; ok {
				continue
			}
			if name == "console.js" && filepath.Dir(dep) != "client" {
				t.Fatalf("console.js imports %s, which is not the client's", dep)
			}
			files[dep] = read(t, filepath.Join(dist, filepath.Base(dep)))
			todo = append(todo, dep)
		}
	}
	// A browser resolves only relative imports without an import map,
	// which the page's policy would not run.
	bare := regexp.MustCompile(`\bfrom "([^".][^"]*)"`)
	for name, b := range files {
		if m := bare.FindSubmatch(b); m != nil && filepath.Ext(name) == ".js" {
			t.Errorf("%s imports %s, which the page cannot load", name, m[1])
		}
	}
	return files
}

func read(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, read(t, from), 0o644); err != nil {
		t.Fatal(err)
	}
}
