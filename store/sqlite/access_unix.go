//go:build unix

package sqlite

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// canWrite asks the kernel whether this process's effective user may write
// path, as open(2) would decide.
func canWrite(path string) error {
	return unix.Faccessat(unix.AT_FDCWD, path, unix.W_OK, unix.AT_EACCESS)
}

// fileID names the file at path by its device and inode: a file put in its
// place (a restore, a copy) has another.
func fileID(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil
}
