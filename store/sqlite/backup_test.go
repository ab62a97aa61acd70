package sqlite

import (
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

// TestRestoreChecksTheCopy: a file that is not a sound database of this
// relay is refused, and the database in place is left as it was.
func TestRestoreChecksTheCopy(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "relay.db")
	db, err := Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Register(t.Context(), store.RegisterParams{Household: "h", Device: "d", Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	good := filepath.Join(dir, "good.db")
	if err := Backup(t.Context(), path, good); err != nil {
		t.Fatal(err)
	}
	if err := Backup(t.Context(), path, good); err == nil {
		t.Fatal("Backup over an existing file succeeded")
	}
	if fi, err := os.Stat(good); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup's mode: %v %v", fi, err)
	}

	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, []byte(strings.Repeat("not a database ", 100)), 0o644); err != nil {
		t.Fatal(err)
	}
	truncated := filepath.Join(dir, "truncated.db")
	b, _ := os.ReadFile(good)
	if err := os.WriteFile(truncated, b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "foreign.db")
	other, _ := sql.Open("sqlite", dsn(foreign, nil))
	if _, err := other.Exec(`CREATE TABLE notes (body TEXT)`); err != nil {
		t.Fatal(err)
	}
	other.Close()
	newer := filepath.Join(dir, "newer.db")
	if err := copyFile(good, newer); err != nil {
		t.Fatal(err)
	}
	nw, _ := sql.Open("sqlite", dsn(newer, nil))
	if _, err := nw.Exec(`INSERT INTO schema_version (version, applied_at) VALUES (99999, 0)`); err != nil {
		t.Fatal(err)
	}
	nw.Close()

	for name, src := range map[string]string{"garbage": garbage, "truncated": truncated, "foreign": foreign, "newer": newer, "missing": filepath.Join(dir, "nope.db")} {
		if err := Restore(t.Context(), src, path); err == nil {
			t.Errorf("Restore of a %s file succeeded", name)
		}
	}
	db, err = Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if devs, err := db.Devices(t.Context(), store.ListParams{Household: "h", Limit: 10}); err != nil || len(devs) != 1 {
		t.Fatalf("the database after refused restores: %v, %v", devs, err)
	}
}

// TestRestoreReplaces: a restore gives the copy mode 0600, removes the old
// database's -wal and -shm (SQLite would apply them to the copy), and
// holds the database exclusively while it works: a store cannot open it
// meanwhile, nor can a restore run while a store has it open.
func TestRestoreReplaces(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "relay.db")
	db, err := Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(dir, "backup.db")
	if err := Backup(t.Context(), path, backup); err != nil {
		t.Fatal(err)
	}
	if err := Restore(t.Context(), backup, path); !errors.Is(err, errInUse) {
		t.Fatalf("Restore while open = %v, want errInUse", err)
	}
	// Written after the backup, and left in the -wal by a crash: gone
	// after the restore.
	if _, err := db.Register(t.Context(), store.RegisterParams{Household: "h", Device: "late", Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	crashed := filepath.Join(dir, "crashed")
	if err := os.Mkdir(crashed, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		if err := copyFile(path+suffix, filepath.Join(crashed, "relay.db"+suffix)); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	for _, suffix := range []string{"-wal", "-shm"} {
		if err := copyFile(filepath.Join(crashed, "relay.db"+suffix), path+suffix); err != nil {
			t.Fatal(err)
		}
	}

	held, err := lock(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(t.Context(), Config{Path: path}); !errors.Is(err, errInUse) {
		t.Fatalf("Open during a restore = %v, want errInUse", err)
	}
	held.Close()

	if err := Restore(t.Context(), backup, path); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		if _, err := os.Stat(path + suffix); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the restore: %v", suffix, err)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("restored file's mode: %v %v", fi, err)
	}
	db, err = Open(t.Context(), Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if devs, err := db.Devices(t.Context(), store.ListParams{Household: "h", Limit: 10}); err != nil || len(devs) != 0 {
		t.Fatalf("the restored database holds %v (%v), want what the backup held: nothing", devs, err)
	}
}

// TestRestoreChangesTheEpoch: a restored copy holds an older history than
// the one clients last saw, so it comes back with a new epoch, and as
// another instance; the backup itself keeps its own. An ack taken in the
// epoch before the restore is refused. Without the new epoch written in
// Restore, the epochs after the restore and before it are the same.
func TestRestoreChangesTheEpoch(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "relay.db")
	open := func() *DB {
		t.Helper()
		db, err := Open(t.Context(), Config{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	db := open()
	before, err := db.History(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Register(t.Context(), store.RegisterParams{Household: "h", Device: "d", Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(dir, "backup.db")
	if err := Backup(t.Context(), path, backup); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Send(t.Context(), store.SendParams{Household: "h", Sender: "d", ID: "1", To: []string{"d"}, Payload: []byte("x"), Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	if err := Restore(t.Context(), backup, path); err != nil {
		t.Fatal(err)
	}
	db = open()
	defer db.Close()
	after, err := db.History(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if after.Epoch == before.Epoch || len(after.Epoch) != 16 || !store.ValidEpoch(after.Epoch) {
		t.Errorf("epoch %q before the restore, %q after: want a new one", before.Epoch, after.Epoch)
	}
	if after.Instance == before.Instance {
		t.Errorf("instance %q both before and after the restore", after.Instance)
	}
	if _, err := db.Ack(t.Context(), store.AckParams{Household: "h", Device: "d", Cursor: 0, Now: time.Now(), Epoch: before.Epoch}); !errors.Is(err, store.ErrStaleEpoch) {
		t.Errorf("an ack of the epoch before the restore = %v, want ErrStaleEpoch", err)
	}
	// The backup, untouched, still says the epoch it was taken in.
	var kept string
	b, _ := sql.Open("sqlite", dsn(backup, map[string][]string{"mode": {"ro"}}))
	defer b.Close()
	if err := b.QueryRow(sqlEpoch).Scan(&kept); err != nil || kept != before.Epoch {
		t.Errorf("the backup's epoch = %q, %v, want %q", kept, err, before.Epoch)
	}
}
