package seal

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"sync"

	"github.com/flamenet/relay/internal/atomicfile"
)

// PinStore keeps a keyring's pins: device name -> pinned Ed25519 key.
// Save must be durable when it returns.
type PinStore interface {
	// Load returns the saved pins, none when nothing was ever saved.
	Load(ctx context.Context) (map[string]ed25519.PublicKey, error)
	Save(ctx context.Context, pins map[string]ed25519.PublicKey) error
}

// KeyChange is a directory key that differs from the device's pin. The
// pin stays until the app calls Keyring.Trust with the new key, having
// checked it (compare fingerprints, or the safety number, out of band):
// until then nothing is sealed to the device and nothing it seals opens.
type KeyChange struct {
	Device string
	Pinned ed25519.PublicKey // the key trusted so far
	Listed ed25519.PublicKey // the key the directory now lists
}

func (c KeyChange) String() string {
	return fmt.Sprintf("the key of %s changed: pinned %s, the directory now lists %s", c.Device, Fingerprint(c.Pinned), Fingerprint(c.Listed))
}

// Listing is one device as the directory lists it; Key is nil when the
// device registered none.
type Listing struct {
	Device string
	Key    ed25519.PublicKey
}

// Keyring pins the keys of the household's devices on first use and
// holds to them: a later directory key that differs is reported
// (KeyChange), never taken silently. It is safe for concurrent use.
type Keyring struct {
	mu       sync.Mutex
	store    PinStore
	pins     map[string]ed25519.PublicKey
	listed   map[string]ed25519.PublicKey // the directory's last word per device; nil value: no usable key
	onChange func(KeyChange)
}

// KeyringOption changes a Keyring made by OpenKeyring.
type KeyringOption func(*Keyring)

// OnKeyChange calls f (outside the keyring's lock) for each key change a
// directory read finds, besides returning it from Observe.
func OnKeyChange(f func(KeyChange)) KeyringOption {
	return func(k *Keyring) { k.onChange = f }
}

// OpenKeyring loads the pins in store.
func OpenKeyring(ctx context.Context, store PinStore, opts ...KeyringOption) (*Keyring, error) {
	pins, err := store.Load(ctx)
	if err != nil {
		return nil, err
	}
	if pins == nil {
		pins = map[string]ed25519.PublicKey{}
	}
	k := &Keyring{store: store, pins: pins, listed: map[string]ed25519.PublicKey{}, onChange: func(KeyChange) {}}
	for _, o := range opts {
		o(k)
	}
	return k, nil
}

// Pinned returns the key pinned for device.
func (k *Keyring) Pinned(device string) (ed25519.PublicKey, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key, ok := k.pins[device]
	return key, ok
}

// Listed returns the key the directory last listed for device (Observe):
// nil with true when it listed the device without a usable key, false when
// it has not listed the device.
func (k *Keyring) Listed(device string) (ed25519.PublicKey, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key, ok := k.listed[device]
	return key, ok
}

// Observe takes in what the directory lists: a key of a device never seen
// is pinned (and saved); a key that differs from the pin is reported, and
// the pin kept. A key that is not a valid Ed25519 public key counts as no
// key. The listing is remembered for Recipients.
func (k *Keyring) Observe(ctx context.Context, listings []Listing) ([]KeyChange, error) {
	k.mu.Lock()
	var changes []KeyChange
	pins := k.pins
	pinned := false
	for _, l := range listings {
		key := l.Key
		if key != nil && CheckKey(key) != nil {
			key = nil
		}
		k.listed[l.Device] = key
		if key == nil {
			continue
		}
		pin, ok := pins[l.Device]
		switch {
		case !ok:
			if !pinned {
				pins, pinned = maps.Clone(k.pins), true
			}
			pins[l.Device] = bytes.Clone(key)
		case !bytes.Equal(pin, key):
			changes = append(changes, KeyChange{Device: l.Device, Pinned: pin, Listed: bytes.Clone(key)})
		}
	}
	var err error
	if pinned {
		// The new pins count only once saved: a pin lost in a crash would
		// be taken again, perhaps from a directory that changed meanwhile.
		if err = k.store.Save(ctx, pins); err == nil {
			k.pins = pins
		}
	}
	k.mu.Unlock()
	for _, c := range changes {
		k.onChange(c)
	}
	return changes, err
}

// Trust pins key for device, replacing its pin: the app's answer to a
// KeyChange once it has checked the new key.
func (k *Keyring) Trust(ctx context.Context, device string, key ed25519.PublicKey) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	pins := maps.Clone(k.pins)
	pins[device] = bytes.Clone(key)
	if err := k.store.Save(ctx, pins); err != nil {
		return err
	}
	k.pins = pins
	return nil
}

// Recipients returns the devices to seal to, with their pinned keys. A device
// without a pin, or that the directory last listed without a key, is
// ErrUnknownSender; one whose listed key differs from its pin is
// ErrKeyChanged: nothing is sealed to a changed key.
func (k *Keyring) Recipients(devices []string) ([]Recipient, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]Recipient, 0, len(devices))
	for _, d := range devices {
		pin, ok := k.pins[d]
		listed, seen := k.listed[d]
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: %s has no pinned key", ErrUnknownSender, d)
		case seen && listed == nil:
			return nil, fmt.Errorf("%w: the directory lists no key for %s", ErrUnknownSender, d)
		case seen && !bytes.Equal(listed, pin):
			return nil, fmt.Errorf("%w: %s", ErrKeyChanged, KeyChange{Device: d, Pinned: pin, Listed: listed})
		}
		out = append(out, Recipient{Device: d, Key: pin})
	}
	return out, nil
}

// Open opens a sealed envelope with the sender's pin (p.SenderKey is
// replaced by the pin for p.From).
func (k *Keyring) Open(p OpenParams) ([]byte, error) {
	p.SenderKey, _ = k.Pinned(p.From)
	return Open(p)
}

// FileStore keeps pins in a JSON file, {"pins": {"device": "<base64
// key>"}}, mode 0600. Save writes a temporary file beside it, syncs it and
// renames it over the old one, so a crash leaves the old pins or the new.
type FileStore string

type pinFile struct {
	Pins map[string][]byte `json:"pins"`
}

// Load reads the file; a missing file holds no pins.
func (f FileStore) Load(context.Context) (map[string]ed25519.PublicKey, error) {
	b, err := os.ReadFile(string(f))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]ed25519.PublicKey{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("seal: keyring file: %w", err)
	}
	var pf pinFile
	if err := json.Unmarshal(b, &pf); err != nil {
		return nil, fmt.Errorf("seal: keyring file %s: %w", f, err)
	}
	pins := make(map[string]ed25519.PublicKey, len(pf.Pins))
	for d, key := range pf.Pins {
		if err := CheckKey(key); err != nil {
			return nil, fmt.Errorf("seal: keyring file %s, device %s: %w", f, d, err)
		}
		pins[d] = key
	}
	return pins, nil
}

// Save replaces the file atomically and durably.
func (f FileStore) Save(_ context.Context, pins map[string]ed25519.PublicKey) error {
	pf := pinFile{Pins: make(map[string][]byte, len(pins))}
	for d, key := range pins {
		pf.Pins[d] = key
	}
	b, err := json.MarshalIndent(pf, "", "  ") // map keys sorted
	if err != nil {
		return err
	}
	if err := atomicfile.Write(string(f), append(b, '\n')); err != nil {
		return fmt.Errorf("seal: keyring file: %w", err)
	}
	return nil
}

// MemoryStore keeps pins in memory, for tests and for apps that keep
// them elsewhere themselves.
type MemoryStore struct {
	mu   sync.Mutex
	pins map[string]ed25519.PublicKey
}

// Load returns the pins last saved.
func (m *MemoryStore) Load(context.Context) (map[string]ed25519.PublicKey, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.pins), nil
}

// Save keeps a copy of pins.
func (m *MemoryStore) Save(_ context.Context, pins map[string]ed25519.PublicKey) error {
	m.mu.Lock()
	m.pins = maps.Clone(pins)
	m.mu.Unlock()
	return nil
}
