//go:build !unix

package sqlite

import "os"

// canWrite is weaker here than on Unix: it only tells a missing file.
func canWrite(path string) error {
	_, err := os.Stat(path)
	return err
}

// fileID has nothing to name a file by here that a write would not change:
// the instance is then the epoch alone.
func fileID(path string) (string, error) {
	_, err := os.Stat(path)
	return "", err
}
