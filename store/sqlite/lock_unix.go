//go:build unix

package sqlite

import (
	"errors"
	"fmt"
	"os"

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

// chownLike gives path the owner and group of like.
func chownLike(path string, like os.FileInfo) error {
	st, ok := like.Sys().(*unix.Stat_t)
	if !ok {
		return nil
	}
	return os.Chown(path, int(st.Uid), int(st.Gid))
}
