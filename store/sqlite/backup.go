package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// errInUse: the database is held by another open store (a running relay),
// or is being restored.
var errInUse = errors.New("the database is in use (a relay has it open, or a restore is under way)")

// errServed: another store opened to serve has the database (claim).
var errServed = errors.New("in use by another relay")

// Backup writes a consistent copy of the database at path to dst while
// relays go on using it: VACUUM INTO reads one snapshot, so the copy holds
// every transaction committed before it began and none half. The copy is
// written beside dst and renamed into place, mode 0600; an existing dst is
// refused.
func Backup(ctx context.Context, path, dst string) error {
	path, err := filepath.Abs(path) // for dsn
	if err != nil {
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("sqlite: backup: %s exists; name a new file", dst)
	}
	tmp := dst + ".partial"
	_ = os.Remove(tmp) // left by a backup that was cut short
	db, err := sql.Open("sqlite", dsn(path, nil))
	if err != nil {
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	defer db.Close()
	if err := vacuumInto(ctx, db, tmp); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	if err := syncFile(tmp, 0o600); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	return syncDir(filepath.Dir(dst))
}

// vacuumInto writes db's copy to tmp, created first, empty and mode 0600
// (SQLite takes an empty file), so that the copy is never readable by
// others, not even while it is written; O_EXCL: never through a link.
func vacuumInto(ctx context.Context, db *sql.DB, tmp string) error {
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, `VACUUM INTO ?`, tmp)
	return err
}

// Restore puts the backup src in place of the database at path. It
// refuses while a relay has the database open, and a src that is not a
// sound database of this relay (integrity_check, a schema no newer than
// this build's). The copy gets a new epoch (store.History), the owner of
// the database it replaces (or of its directory) and mode 0600, and
// replaces it in one rename; the old database's -wal and -shm files go
// first: SQLite would apply them to the new file.
func Restore(ctx context.Context, src, path string) error {
	if err := check(ctx, src); err != nil {
		return fmt.Errorf("sqlite: restore: %s: %w", src, err)
	}
	path, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("sqlite: restore: %w", err)
	}
	dir := filepath.Dir(path)
	owner, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("sqlite: restore: %w", err)
	}
	if fi, err := os.Stat(path); err == nil {
		owner = fi
	}
	held, err := lock(path, true)
	if err != nil {
		return fmt.Errorf("sqlite: restore: %s: %w; stop the relay first", path, err)
	}
	defer held.Close()

	tmp := path + ".restoring"
	if err := copyFile(src, tmp); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("sqlite: restore: %w", err)
	}
	// The copy's history is older than the one relays and clients last
	// saw: a new epoch tells them (store.History).
	if err := writeEpoch(ctx, tmp); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("sqlite: restore: write a new epoch into the copy: %w", err)
	}
	if err := chownLike(tmp, owner); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("sqlite: restore: give the copy the database's owner: %w", err)
	}
	for _, f := range []string{path + "-wal", path + "-shm"} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			_ = os.Remove(tmp)
			return fmt.Errorf("sqlite: restore: %w", err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("sqlite: restore: %w", err)
	}
	return syncDir(dir)
}

// check opens src read-only and asks SQLite whether it is sound and of a
// schema this build knows.
func check(ctx context.Context, src string) error {
	src, err := filepath.Abs(src) // for dsn
	if err != nil {
		return err
	}
	if _, err := os.Stat(src); err != nil {
		return err
	}
	db, err := sql.Open("sqlite", dsn(src, map[string][]string{"mode": {"ro"}}))
	if err != nil {
		return err
	}
	defer db.Close()
	var verdict string
	if err := db.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&verdict); err != nil {
		return fmt.Errorf("not a SQLite database: %w", err)
	}
	if verdict != "ok" {
		return fmt.Errorf("damaged: integrity_check says %q", verdict)
	}
	var version int
	if err := db.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM schema_version`).Scan(&version); err != nil {
		return fmt.Errorf("not a relay's database: %w", err)
	}
	ms, err := migrations()
	if err != nil {
		return err
	}
	if latest := ms[len(ms)-1].Version; version > latest {
		return fmt.Errorf("its schema (version %d) is newer than this relay's (%d): restore it with the relay that wrote it", version, latest)
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// syncFile sets path's mode and flushes it to disk.
func syncFile(path string, mode os.FileMode) error {
	if err := os.Chmod(path, mode); err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
