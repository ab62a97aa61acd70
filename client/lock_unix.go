//go:build unix

package client

import (
	"context"
	"os"
	"syscall"
)

// Lock takes an exclusive lock on FILE.lock beside the credentials file
// (the file itself is replaced by each Save, so it cannot carry one). The
// lock is the kernel's (flock): a holder that dies releases it.
func (f FileStore) Lock(ctx context.Context) (unlock func(), err error) {
	lf, err := os.OpenFile(string(f)+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	got := make(chan error, 1)
	go func() { got <- syscall.Flock(int(lf.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-got:
		if err != nil {
			lf.Close()
			return nil, err
		}
		return func() { lf.Close() }, nil // closing releases the lock
	case <-ctx.Done():
		go func() { <-got; lf.Close() }()
		return nil, ctx.Err()
	}
}
