//go:build unix

package sqlite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestOneServingStore: a store opened to serve keeps the database to
// itself: a second one is refused, on one line naming the file and the
// holder's pid, even through a symlinked directory. A backup and a store
// opened to migrate still open the database beside it; a restore is still
// refused. Once the first is closed, another serves.
func TestOneServingStore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "relay.db")
	first, err := Open(t.Context(), Config{Path: path, Serve: true})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			first.Close()
		}
	}()

	link := filepath.Join(t.TempDir(), "data")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, filepath.Join(link, "relay.db")} {
		second, err := Open(t.Context(), Config{Path: p, Serve: true})
		if err == nil {
			second.Close()
			t.Fatalf("a second store opened %s to serve while the first serves it", p)
		}
		if want := fmt.Sprintf("sqlite: %s is in use by another relay (pid %d)", p, os.Getpid()); err.Error() != want {
			t.Errorf("the second store's error = %q, want %q", err, want)
		}
	}

	migrating, err := Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatalf("a store opened to migrate beside the serving one: %v", err)
	}
	migrating.Close()
	backup := filepath.Join(dir, "backup.db")
	if err := Backup(t.Context(), path, backup); err != nil {
		t.Fatalf("a backup beside the serving store: %v", err)
	}
	if err := Restore(t.Context(), backup, path); !errors.Is(err, errInUse) {
		t.Fatalf("Restore while served = %v, want errInUse", err)
	}

	closed = true
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := Open(t.Context(), Config{Path: path, Serve: true})
	if err != nil {
		t.Fatalf("a store opened to serve once the first is closed: %v", err)
	}
	again.Close()
}
