//go:build !unix

package sqlite

import "os"

// lock is only an open file here: Restore cannot tell a database in use.
func lock(path string, _ bool) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
}

// claim does nothing here: a second relay on the database is not refused.
func claim(string) (*os.File, error) { return nil, nil }

func release(*os.File) error { return nil }

// chownLike does nothing here: files have no Unix owner.
func chownLike(string, os.FileInfo) error { return nil }
