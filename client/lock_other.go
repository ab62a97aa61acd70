//go:build !unix

package client

import "context"

// Lock does nothing where flock is not to be had: holders of one file then
// rely on reading it again before and after each renewal alone.
func (f FileStore) Lock(context.Context) (unlock func(), err error) { return func() {}, nil }
