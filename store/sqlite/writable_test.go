package sqlite

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

// TestPingTellsReplacedFile: a file moved into the database's place while
// the store is open (a restore done under a running relay) makes Ping fail
// with the reason, and nothing is written into the new file.
func TestPingTellsReplacedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.db")
	db, err := Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Ping(t.Context()); err != nil {
		t.Fatalf("Ping before: %v", err)
	}
	if err := copyFile(path, path+".restored"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".restored", path); err != nil {
		t.Fatal(err)
	}
	err = db.Ping(t.Context())
	if !errors.Is(err, store.ErrNotWritable) || !strings.Contains(err.Error(), "replaced") {
		t.Fatalf("Ping after the file was replaced = %v, want ErrUnavailable naming the replacement", err)
	}
	// Nothing is written any more: the write would reach the new file
	// through the -wal file both share by name.
	if _, err := db.Register(t.Context(), store.RegisterParams{Household: "h", Device: "d", Now: time.Now()}); !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "replaced") {
		t.Fatalf("Register after the file was replaced = %v, want ErrUnavailable naming the replacement", err)
	}
}

// TestUnwritableFileRecovers: a database file this process cannot write
// makes Ping fail naming the file, and once it can be written again, writes
// succeed without reopening the store. Root may write anything, so it runs
// only as another user (CI covers it as nobody in the main package).
func TestUnwritableFileRecovers(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root may write any file; TestUnwritableDatabase in the main package runs the relay as nobody")
	}
	path := filepath.Join(t.TempDir(), "relay.db")
	db, err := Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if err := os.Chmod(path, 0o444); err != nil {
		t.Fatal(err)
	}
	db, err = Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatalf("Open of a read-only file = %v, want it served not ready", err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Ping(t.Context()); !errors.Is(err, store.ErrNotWritable) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Ping = %v, want ErrUnavailable naming %s", err, path)
	}
	if _, err := db.Register(t.Context(), store.RegisterParams{Household: "h", Device: "d", Now: time.Now()}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Register into a read-only file = %v", err)
	}
	// SQLite made the -wal and -shm files with the database's mode: the
	// fix Ping names is for all three.
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	if _, err := db.Register(t.Context(), store.RegisterParams{Household: "h", Device: "d", Now: time.Now()}); err != nil {
		t.Fatalf("Register once writable = %v", err)
	}
	if err := db.Ping(t.Context()); err != nil {
		t.Fatalf("Ping once writable = %v", err)
	}
}
