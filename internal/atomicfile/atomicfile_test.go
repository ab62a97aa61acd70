package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWrite: the file holds the new bytes, mode 0600 even where it was
// wider, and no temporary file is left beside it.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secret.json")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	fi, _ := os.Stat(path)
	if err != nil || string(b) != "new" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("after Write: %q %v, mode %v", b, err, fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("left beside it: %v", entries)
	}
	if err := Write(filepath.Join(dir, "missing", "x"), []byte("x")); err == nil {
		t.Fatal("Write into a missing directory succeeded")
	}
}
