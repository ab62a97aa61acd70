package sqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/flamenet/relay/store"
)

// errReplaced: the file at the database's path is not the one this
// process opened. Whatever was moved into place (a restore) must not be
// written under the memory of the old one: the relay has to restart.
var errReplaced = errors.New("the database file was replaced since the relay opened it; restart the relay to use the new one")

// writable reports whether this process can still write the database: the
// file at its path is the one it opened, and the file, its directory (where
// SQLite creates the -wal and -shm files) and those files, where they
// exist, are writable by its user. SQLite itself does not say: a file it
// cannot write it opens read-only, silently, and every write then fails.
func (db *DB) writable() error {
	fi, err := os.Stat(db.path)
	if err != nil {
		return err
	}
	if db.opened != nil && !os.SameFile(fi, db.opened) { // nil: still opening
		return errReplaced
	}
	for _, p := range []string{db.path, filepath.Dir(db.path), db.path + "-wal", db.path + "-shm"} {
		err := canWrite(p)
		if err != nil && p != db.path && p != filepath.Dir(db.path) && errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s cannot be written by this process (uid %d): %w", p, os.Geteuid(), err)
		}
	}
	return nil
}

// beforeWrite is called before each write (a group commit, or a write of
// its own). It refuses to write once the file at the path is not the one
// opened: the writes would land in the old file, or, through the -wal file
// both share by name, in the new one. And it gives the writer a new
// connection once the database can be written again: the one opened while
// it could not stays read-only. It costs one stat(2) per write, next to a
// commit's fsync.
func (db *DB) beforeWrite() error {
	if fi, err := os.Stat(db.path); err == nil && db.opened != nil && !os.SameFile(fi, db.opened) {
		return fmt.Errorf("sqlite: %w: %w", store.ErrUnavailable, errReplaced)
	}
	if db.unwritable.Load() && db.writable() == nil {
		db.unwritable.Store(false)
		db.writer.SetMaxIdleConns(0) // closes the idle, read-only connection
		db.writer.SetMaxIdleConns(1)
	}
	return nil
}
