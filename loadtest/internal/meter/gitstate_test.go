package meter

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGitStateIgnoresItsOwnOutput: evidence and the page rendered from it
// do not make a checkout dirty; any other change does.
func TestGitStateIgnoresItsOwnOutput(t *testing.T) {
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.invalid"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git("init", "-q")
	write("main.go", "package main\n")
	write("docs/CAPACITY.md", "page\n")
	git("add", ".")
	git("commit", "-qm", "init")
	ctx := context.Background()
	if g := GitState(ctx, dir); g.Dirty || g.Commit == "unknown" {
		t.Fatalf("clean checkout: %+v", g)
	}
	write("docs/evidence/run.json", "{}\n")
	write("docs/CAPACITY.md", "page, re-rendered\n")
	if g := GitState(ctx, dir); g.Dirty {
		t.Fatalf("the tool's own output made the checkout dirty: %+v", g)
	}
	write("main.go", "package main // changed\n")
	if g := GitState(ctx, dir); !g.Dirty || g.DirtyPaths != 1 {
		t.Fatalf("a changed source file: %+v", g)
	}
}
