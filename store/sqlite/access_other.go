//go:build !unix

package sqlite

import "os"

// canWrite is weaker here than on Unix: it only tells a missing file.
func canWrite(path string) error {
	_, err := os.Stat(path)
	return err
}
