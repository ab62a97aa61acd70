package client

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/flamenet/relay/internal/atomicfile"
)

// Position is where a device stands: its cursor, the highest seq it has
// processed, and the store epoch that cursor was taken in. The relay
// answers a poll or ack whose epoch is not its store's current one with
// 409 cursor_ahead: the store's history went back (a failover that lost
// commits, a restored backup), and the cursor may name envelopes that are
// not the ones processed.
type Position struct {
	Cursor int64
	// Epoch is "" until a relay named one (or with a relay that has none):
	// then nothing is checked.
	Epoch string
}

// CursorStore keeps a device's position. Listen saves it after each
// envelope's handler returned, before the next is handled, so Save must be
// durable when it returns, and must keep the cursor and the epoch together:
// a cursor with another epoch than its own defeats the check.
type CursorStore interface {
	// Load returns the saved position, the zero Position when none was
	// ever saved.
	Load(ctx context.Context) (Position, error)
	Save(ctx context.Context, p Position) error
}

// validEpoch reports whether e keeps the wire's rule for an epoch: 1 to 32 characters of
// [A-Za-z0-9_-].
func validEpoch(e string) bool {
	if len(e) < 1 || len(e) > 32 {
		return false
	}
	for _, r := range e {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// FileCursor keeps the position in a file: the cursor's decimal digits,
// then a space and the epoch when there is one, and a newline. A file of
// digits alone (as written before epochs) loads with no epoch. Save writes
// a temporary file beside it, syncs it and renames it over the old one, so
// a crash leaves either the old position or the new one, never a torn
// file.
type FileCursor string

// Load reads the file; a missing file is cursor 0 with no epoch.
func (f FileCursor) Load(context.Context) (Position, error) {
	b, err := os.ReadFile(string(f))
	if errors.Is(err, fs.ErrNotExist) {
		return Position{}, nil
	}
	if err != nil {
		return Position{}, fmt.Errorf("client: cursor file: %w", err)
	}
	digits, epoch, withEpoch := strings.Cut(strings.TrimSpace(string(b)), " ")
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 0 || withEpoch && !validEpoch(epoch) {
		return Position{}, fmt.Errorf("client: cursor file %s does not hold a cursor: %q", f, b)
	}
	return Position{Cursor: n, Epoch: epoch}, nil
}

// Save replaces the file atomically and durably.
func (f FileCursor) Save(_ context.Context, p Position) error {
	line := strconv.FormatInt(p.Cursor, 10)
	if p.Epoch != "" {
		if !validEpoch(p.Epoch) {
			return fmt.Errorf("client: cursor file: epoch %q is not 1 to 32 characters of [A-Za-z0-9_-]", p.Epoch)
		}
		line += " " + p.Epoch
	}
	if err := atomicfile.Write(string(f), []byte(line+"\n")); err != nil {
		return fmt.Errorf("client: cursor file: %w", err)
	}
	return nil
}

// MemoryCursor keeps the position in memory: a process that starts again
// starts at 0 and sees again what the relay still holds. For tests and
// for apps that process idempotently.
type MemoryCursor struct {
	mu  sync.Mutex
	pos Position
}

// Load returns the position last saved (the zero Position at first).
func (m *MemoryCursor) Load(context.Context) (Position, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pos, nil
}

// Save keeps p.
func (m *MemoryCursor) Save(_ context.Context, p Position) error {
	m.mu.Lock()
	m.pos = p
	m.mu.Unlock()
	return nil
}
