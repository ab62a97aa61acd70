package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"

	"github.com/flamenet/relay/internal/atomicfile"
)

// HeldStore keeps the sealed envelopes a Sealer held back because their
// sender's key differs from its pin (seal.ErrKeyChanged): the cursor moves
// past them, so the relay no longer has them, and this store is their
// only copy until the sender's new key is trusted (Sealer.ReopenHeld) or
// the user drops them (Sealer.DropHeld). Save must be durable when it
// returns: ListenSealed saves before the cursor moves past the envelope.
type HeldStore interface {
	// Load returns the envelopes held, none when nothing was ever saved.
	Load(ctx context.Context) ([]Envelope, error)
	Save(ctx context.Context, es []Envelope) error
}

// FileHeld keeps the held envelopes in a file, as a JSON array (payloads
// in base64, still sealed), replaced atomically as FileCursor is, mode
// 0600. A missing file holds nothing.
type FileHeld string

// Load reads the file.
func (f FileHeld) Load(context.Context) ([]Envelope, error) {
	b, err := os.ReadFile(string(f))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("client: held file: %w", err)
	}
	var es []Envelope
	if err := json.Unmarshal(b, &es); err != nil {
		return nil, fmt.Errorf("client: held file %s: %w", f, err)
	}
	return es, nil
}

// Save replaces the file atomically and durably.
func (f FileHeld) Save(_ context.Context, es []Envelope) error {
	if es == nil {
		es = []Envelope{}
	}
	b, err := json.Marshal(es)
	if err != nil {
		return fmt.Errorf("client: held file: %w", err)
	}
	if err := atomicfile.Write(string(f), append(b, '\n')); err != nil {
		return fmt.Errorf("client: held file: %w", err)
	}
	return nil
}

// MemoryHeld keeps the held envelopes in memory: they are lost when the
// process ends. For tests and for apps that keep them elsewhere.
type MemoryHeld struct {
	mu sync.Mutex
	es []Envelope
}

// Load returns the envelopes last saved.
func (m *MemoryHeld) Load(context.Context) ([]Envelope, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.es), nil
}

// Save keeps es.
func (m *MemoryHeld) Save(_ context.Context, es []Envelope) error {
	m.mu.Lock()
	m.es = slices.Clone(es)
	m.mu.Unlock()
	return nil
}
