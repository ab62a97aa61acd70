//go:build unix

package sqlite

import (
	"database/sql"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestBackupCopyPrivateWhileWritten: the copy a backup writes is mode 0600
// from its first byte, not only once it is renamed into place: the file
// SQLite writes it into exists before, empty, with that mode.
func TestBackupCopyPrivateWhileWritten(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "relay.db")
	s, err := Open(t.Context(), Config{Path: src, Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := sql.Open("sqlite", dsn(src, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	old := syscall.Umask(0o022) // the usual umask, which leaves new files 0644
	defer syscall.Umask(old)
	tmp := filepath.Join(dir, "copy.db.partial")
	if err := vacuumInto(t.Context(), db, tmp); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Size() == 0 {
		t.Errorf("the copy as written: mode %v, %d bytes; want 0600 and the database", fi.Mode().Perm(), fi.Size())
	}
}
