package client

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// CursorStore keeps a device's cursor: the highest seq it has processed.
// Listen saves it after each envelope's handler returned, before the next
// is handled, so Save must be durable when it returns.
type CursorStore interface {
	// Load returns the saved cursor, 0 when none was ever saved.
	Load(ctx context.Context) (int64, error)
	Save(ctx context.Context, cursor int64) error
}

// FileCursor keeps the cursor in a file, as its decimal digits and a
// newline. Save writes a temporary file beside it, syncs it and renames it
// over the old one, so a crash leaves either the old cursor or the new one,
// never a torn file.
type FileCursor string

// Load reads the file; a missing file is cursor 0.
func (f FileCursor) Load(context.Context) (int64, error) {
	b, err := os.ReadFile(string(f))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("client: cursor file: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("client: cursor file %s does not hold a cursor: %q", f, b)
	}
	return n, nil
}

// Save replaces the file atomically and durably.
func (f FileCursor) Save(_ context.Context, cursor int64) error {
	path := string(f)
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("client: cursor file: %w", err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.WriteString(strconv.FormatInt(cursor, 10) + "\n"); err != nil {
		return fmt.Errorf("client: cursor file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("client: cursor file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("client: cursor file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("client: cursor file: %w", err)
	}
	done = true
	// The rename is durable once the directory is synced.
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("client: cursor file: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("client: cursor file: %w", err)
	}
	return nil
}

// MemoryCursor keeps the cursor in memory: a process that starts again
// starts at 0 and sees again what the relay still holds. For tests and
// for apps that process idempotently.
type MemoryCursor struct {
	mu     sync.Mutex
	cursor int64
}

// Load returns the cursor last saved (0 at first).
func (m *MemoryCursor) Load(context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cursor, nil
}

// Save keeps cursor.
func (m *MemoryCursor) Save(_ context.Context, cursor int64) error {
	m.mu.Lock()
	m.cursor = cursor
	m.mu.Unlock()
	return nil
}
