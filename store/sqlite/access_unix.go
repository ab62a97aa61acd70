//go:build unix

package sqlite

import "golang.org/x/sys/unix"

// canWrite asks the kernel whether this process's effective user may write
// path, as open(2) would decide.
func canWrite(path string) error {
	return unix.Faccessat(unix.AT_FDCWD, path, unix.W_OK, unix.AT_EACCESS)
}
