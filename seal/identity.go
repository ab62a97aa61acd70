package seal

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/flamenet/relay/internal/edkey"
)

// Identity is a device's Ed25519 key pair and the X25519 key pair derived
// from it. The 32-byte seed is the one secret an app keeps.
type Identity struct {
	priv ed25519.PrivateKey
	x    *ecdh.PrivateKey
}

// NewIdentity makes a fresh identity from crypto/rand.
func NewIdentity() (*Identity, error) {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return nil, fmt.Errorf("seal: new identity: %w", err)
	}
	return IdentityFromSeed(seed)
}

// IdentityFromSeed rebuilds the identity whose seed is seed (32 bytes).
func IdentityFromSeed(seed []byte) (*Identity, error) {
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("seal: an identity seed is %d bytes, not %d", ed25519.SeedSize, len(seed))
	}
	// As libsodium's crypto_sign_ed25519_sk_to_curve25519: the first half
	// of SHA-512(seed), which X25519 clamps when it uses it.
	h := sha512.Sum512(seed)
	x, err := ecdh.X25519().NewPrivateKey(h[:32])
	if err != nil {
		return nil, fmt.Errorf("seal: identity: %w", err)
	}
	return &Identity{priv: ed25519.NewKeyFromSeed(seed), x: x}, nil
}

// String names the identity by its fingerprint; the seed never shows in
// logs or %v.
func (id *Identity) String() string { return "seal.Identity(" + id.Fingerprint() + ")" }

// GoString is String, for %#v.
func (id *Identity) GoString() string { return id.String() }

// Seed returns the identity's secret: keep it as the app keeps its other
// secrets (SaveIdentity writes it to a 0600 file).
func (id *Identity) Seed() []byte { return id.priv.Seed() }

// Public returns the Ed25519 public key, the device's identity_key in the
// directory.
func (id *Identity) Public() ed25519.PublicKey {
	return id.priv.Public().(ed25519.PublicKey)
}

// X25519Public returns the public half of the derived X25519 key; it equals
// X25519Key(id.Public()).
func (id *Identity) X25519Public() []byte { return id.x.PublicKey().Bytes() }

// KeyID returns the first 8 bytes of SHA-256(key), as a recipient slot names
// the key it was sealed to.
func KeyID(key ed25519.PublicKey) [8]byte {
	h := sha256.Sum256(key)
	return [8]byte(h[:8])
}

// X25519Key returns the Montgomery form u = (1+y)/(1-y) of an Ed25519 public
// key, the key an envelope's content key is sealed to. It refuses a key
// that is not a canonical point or has small order, as the relay does.
func X25519Key(key ed25519.PublicKey) ([]byte, error) {
	u, err := edkey.Montgomery(key)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return u, nil
}

// CheckKey returns nil when key can be pinned and sealed to.
func CheckKey(key ed25519.PublicKey) error {
	if err := edkey.Check(key); err != nil {
		return fmt.Errorf("seal: %w", err)
	}
	return nil
}

// LoadIdentity reads an identity seed file (64 hex digits and a newline).
func LoadIdentity(path string) (*Identity, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("seal: identity file: %w", err)
	}
	seed, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("seal: identity file %s does not hold a 32-byte seed in hex", path)
	}
	return IdentityFromSeed(seed)
}

// SaveIdentity writes id's seed to path, mode 0600, and refuses to replace
// an existing file: losing an identity's seed loses what was sealed to it.
func SaveIdentity(path string, id *Identity) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("seal: identity file: %w", err)
	}
	_, err = fmt.Fprintln(f, hex.EncodeToString(id.Seed()))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("seal: identity file: %w", err)
	}
	return nil
}

// LoadOrCreateIdentity reads the identity in path or, when there is no
// such file, makes one and saves it there; created says which.
func LoadOrCreateIdentity(path string) (id *Identity, created bool, err error) {
	id, err = LoadIdentity(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return id, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, fmt.Errorf("seal: identity file: %w", err)
	}
	if id, err = NewIdentity(); err != nil {
		return nil, false, err
	}
	if err := SaveIdentity(path, id); err != nil {
		return nil, false, err
	}
	return id, true, nil
}
