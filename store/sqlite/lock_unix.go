//go:build unix

package sqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lock takes a flock(2) on path (created, empty, if missing), held until
// the returned file is closed. Every open store holds a shared one;
// Restore takes it exclusively, so that it never replaces a database a
// relay has open, and no relay opens one being replaced. flock is apart
// from the fcntl locks SQLite takes, so the two never interfere.
func lock(path string, exclusive bool) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	if err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, errInUse
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// claim makes this process the one relay serving the database at path
// (a store opened with Config.Serve), until the returned file is closed
// with release: an exclusive flock on path+".lock", not on the database,
// whose shared flock backups and migrations take beside a relay. The lock
// file holds the holder's pid, for the refusal to name it. Symlinks are
// resolved first, so that two spellings of one file meet in one lock.
func claim(path string) (*os.File, error) {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	} else if dir, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		path = filepath.Join(dir, filepath.Base(path)) // not created yet
	}
	name := path + ".lock"
	_, statErr := os.Lstat(name)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	if errors.Is(statErr, fs.ErrNotExist) && os.Geteuid() == 0 {
		// As SQLite does with its -wal and -shm: a relay started once
		// as root must not leave a file its own user cannot open.
		owner, err := os.Stat(path)
		if err != nil {
			owner, err = os.Stat(filepath.Dir(path))
		}
		if err == nil {
			err = chownLike(name, owner)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock: give %s the database's owner: %w", name, err)
		}
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", name, err)
		}
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0) // the pid is a courtesy: without it, the refusal still stands
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n]))); err == nil && pid > 0 {
			return nil, fmt.Errorf("%w (pid %d)", errServed, pid)
		}
		return nil, errServed
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	return f, nil
}

// release gives up claim's lock. The pid goes first, so that it never
// names a relay that has stopped; failing that, the lock goes anyway.
func release(f *os.File) error {
	_ = f.Truncate(0)
	return f.Close()
}

// chownLike gives path the owner and group of like.
func chownLike(path string, like os.FileInfo) error {
	st, ok := like.Sys().(*unix.Stat_t)
	if !ok {
		return nil
	}
	return os.Chown(path, int(st.Uid), int(st.Gid))
}
