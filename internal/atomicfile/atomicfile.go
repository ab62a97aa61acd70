// Package atomicfile writes a file holding a secret so that a crash leaves
// either the old contents or the new, never a part, and never a file
// others can read.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes b to a 0600 temporary file beside path, syncs it, renames
// it over path and syncs the directory, so that the rename survives a
// crash too.
func Write(path string, b []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	// CreateTemp's 0600 already; said again so that no umask or platform
	// difference widens a file holding a secret.
	if err := tmp.Chmod(0o600); err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	done = true
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
