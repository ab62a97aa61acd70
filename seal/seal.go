// Package seal is the sealed-envelope format v1 (docs/E2E.md): a payload
// encrypted once under a fresh content key, that key wrapped with HPKE
// (RFC 9180, DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM) for each
// recipient device, the whole signed with the sender's Ed25519 identity and
// bound to the household, the envelope id and the sender's name.
//
// It is pure format and cryptography, no HTTP, and meant for apps: [Seal]
// and [Open] are the format, [Keyring] the pinned keys of a household's
// devices. The client package's
// [github.com/flamenet/relay/client.Sealer] ties it to the relay's
// directory and poll loop.
package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/hpke"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/flamenet/relay/device"
)

// Version is the format version this package seals and opens.
const Version = 1

// Opening fails with exactly one of these (errors.Is), in the order the
// checks run: a parse failure, then the envelope's claims against what the
// relay delivered, then the sender's pinned key, the signature, the
// opener's slot, and last the decryption.
var (
	ErrMalformed      = errors.New("seal: malformed envelope")
	ErrVersion        = errors.New("seal: unsupported envelope version")
	ErrWrongHousehold = errors.New("seal: envelope of another household")
	ErrWrongID        = errors.New("seal: envelope sealed under another id")
	ErrWrongSender    = errors.New("seal: envelope sealed by another sender than the relay says")
	ErrUnknownSender  = errors.New("seal: no pinned key for the device")
	ErrKeyChanged     = errors.New("seal: the device's key differs from its pin")
	ErrSignature      = errors.New("seal: bad signature")
	ErrNotAddressed   = errors.New("seal: envelope not addressed to this device")
	ErrDecrypt        = errors.New("seal: envelope does not decrypt")
)

// codes are the format's names of the errors, as the TypeScript client's
// SealError.code and the test vectors spell them.
var codes = []struct {
	err  error
	code string
}{
	{ErrMalformed, "malformed"},
	{ErrVersion, "version"},
	{ErrWrongHousehold, "wrong_household"},
	{ErrWrongID, "wrong_id"},
	{ErrWrongSender, "wrong_sender"},
	{ErrUnknownSender, "unknown_sender"},
	{ErrKeyChanged, "key_changed"},
	{ErrSignature, "signature"},
	{ErrNotAddressed, "not_addressed"},
	{ErrDecrypt, "decrypt"},
}

// Code returns err's code in the format ("decrypt", "key_changed", ...), or ""
// when err is none of the sentinel errors.
func Code(err error) string {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return ""
}

const (
	keySize     = 32
	keyIDSize   = 8
	encSize     = 32
	wrappedSize = keySize + 16
	nonceSize   = 12
	sigSize     = ed25519.SignatureSize
	maxIDLen    = 128
	sigContext  = "fn-seal v1 sig\x00"
	infoContext = "fn-seal v1 key\x00"
)

var magic = [3]byte{'F', 'N', 'E'}

// The HPKE suite of format v1; the KEM, DHKEM(X25519, HKDF-SHA256), comes
// with the keys (hpke.NewDHKEMPublicKey).
var (
	kdf  = hpke.HKDFSHA256()
	aead = hpke.AES256GCM()
)

// Recipient is a device an envelope is sealed to, with the key the sender
// has pinned for it.
type Recipient struct {
	Device string
	Key    ed25519.PublicKey
}

// SealParams is what Seal needs.
type SealParams struct {
	Household string    // the sender's household
	ID        string    // the envelope id of the send that will carry it
	Sender    string    // the sending device's name
	Identity  *Identity // the sender's identity
	// Recipients, 1 to 255 with distinct names, in the order their slots
	// take.
	Recipients []Recipient
	Plaintext  []byte
}

// Seal makes a sealed envelope, the payload of a send with id p.ID to the
// recipients. It checks p's names and keys; it does not check pins: that
// is the Keyring's work (Keyring.Recipients).
func Seal(p SealParams) ([]byte, error) {
	if p.Identity == nil {
		return nil, errors.New("seal: no identity")
	}
	if !device.ValidName(p.Household) || !device.ValidName(p.Sender) || !validID(p.ID) {
		return nil, fmt.Errorf("seal: household %q, sender %q or id %q is not valid in the protocol", p.Household, p.Sender, p.ID)
	}
	if len(p.Recipients) < 1 || len(p.Recipients) > 255 {
		return nil, fmt.Errorf("seal: %d recipients: 1 to 255", len(p.Recipients))
	}
	if uint64(len(p.Plaintext)) > 1<<32-1-16 {
		return nil, errors.New("seal: plaintext too large")
	}
	seen := make(map[string]bool, len(p.Recipients))
	for _, r := range p.Recipients {
		if !device.ValidName(r.Device) || seen[r.Device] {
			return nil, fmt.Errorf("seal: recipient %q is not a valid name or is named twice", r.Device)
		}
		seen[r.Device] = true
	}
	contentKey := make([]byte, keySize)
	nonce := make([]byte, nonceSize)
	if _, err := rand.Read(contentKey); err != nil {
		return nil, err
	}
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	senderKey := p.Identity.Public()

	var h []byte
	h = append(h, magic[:]...)
	h = append(h, Version)
	h = appendStr8(h, p.Household)
	h = appendStr8(h, p.ID)
	h = appendStr8(h, p.Sender)
	h = append(h, senderKey...)
	h = append(h, byte(len(p.Recipients)))
	for _, r := range p.Recipients {
		u, err := X25519Key(r.Key)
		if err != nil {
			return nil, fmt.Errorf("seal: key of %s: %w", r.Device, err)
		}
		xpub, err := ecdh.X25519().NewPublicKey(u)
		if err != nil {
			return nil, fmt.Errorf("seal: key of %s: %w", r.Device, err)
		}
		pk, err := hpke.NewDHKEMPublicKey(xpub)
		if err != nil {
			return nil, fmt.Errorf("seal: key of %s: %w", r.Device, err)
		}
		kid := KeyID(r.Key)
		ct, err := hpke.Seal(pk, kdf, aead, slotInfo(p.Household, p.ID, p.Sender, senderKey, r.Device, kid), contentKey)
		if err != nil {
			return nil, fmt.Errorf("seal: wrapping the key for %s: %w", r.Device, err)
		}
		if len(ct) != encSize+wrappedSize {
			return nil, fmt.Errorf("seal: HPKE gave %d bytes, not %d", len(ct), encSize+wrappedSize)
		}
		h = appendStr8(h, r.Device)
		h = append(h, kid[:]...)
		h = append(h, ct...) // enc || wrapped
	}
	h = append(h, nonce...)

	gcm, err := newGCM(contentKey)
	if err != nil {
		return nil, err
	}
	ct := gcm.Seal(nil, nonce, p.Plaintext, h)
	out := make([]byte, 0, len(h)+4+len(ct)+sigSize)
	out = append(out, h...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(ct)))
	out = append(out, ct...)
	sig := ed25519.Sign(p.Identity.priv, signed(out))
	return append(out, sig...), nil
}

// OpenParams is what Open needs: the opener's own names and identity, and
// what the relay delivered with the envelope.
type OpenParams struct {
	Household string    // the opener's household
	Device    string    // the opener's device name
	Identity  *Identity // the opener's identity
	ID        string    // the delivered envelope's id
	From      string    // the delivered envelope's from
	// SenderKey is the key the opener has pinned for From; nil when it has
	// none (ErrUnknownSender).
	SenderKey ed25519.PublicKey
	Sealed    []byte // the delivered payload
}

// Open checks a sealed envelope as the format says, in its order, and
// returns the plaintext; every failure is one of the sentinel errors.
func Open(p OpenParams) ([]byte, error) {
	if p.Identity == nil {
		return nil, errors.New("seal: no identity")
	}
	e, err := parse(p.Sealed)
	if err != nil {
		return nil, err
	}
	switch {
	case e.household != p.Household:
		return nil, fmt.Errorf("%w: %q, not %q", ErrWrongHousehold, e.household, p.Household)
	case e.id != p.ID:
		return nil, fmt.Errorf("%w: %q, delivered as %q", ErrWrongID, e.id, p.ID)
	case e.sender != p.From:
		return nil, fmt.Errorf("%w: sealed by %q, delivered from %q", ErrWrongSender, e.sender, p.From)
	case p.SenderKey == nil:
		return nil, fmt.Errorf("%w: %s", ErrUnknownSender, e.sender)
	case !bytes.Equal(e.senderKey, p.SenderKey):
		return nil, fmt.Errorf("%w: %s sealed with %s, pinned %s", ErrKeyChanged, e.sender, Fingerprint(e.senderKey), Fingerprint(p.SenderKey))
	}
	if !ed25519.Verify(e.senderKey, signed(p.Sealed[:e.bodyEnd]), p.Sealed[e.bodyEnd:]) {
		return nil, ErrSignature
	}
	kid := KeyID(p.Identity.Public())
	var slot *slot
	for i := range e.slots {
		if e.slots[i].recipient == p.Device && e.slots[i].keyID == kid {
			slot = &e.slots[i]
			break
		}
	}
	if slot == nil {
		return nil, fmt.Errorf("%w: %s with key %x", ErrNotAddressed, p.Device, kid)
	}
	sk, err := hpke.NewDHKEMPrivateKey(p.Identity.x)
	if err != nil {
		return nil, fmt.Errorf("seal: identity: %w", err)
	}
	info := slotInfo(e.household, e.id, e.sender, e.senderKey, slot.recipient, slot.keyID)
	contentKey, err := hpke.Open(sk, kdf, aead, info, slot.encWrapped)
	if err != nil {
		return nil, fmt.Errorf("%w: content key: %w", ErrDecrypt, err)
	}
	gcm, err := newGCM(contentKey)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDecrypt, err)
	}
	pt, err := gcm.Open(nil, e.nonce, e.ciphertext, p.Sealed[:e.headerEnd])
	if err != nil {
		return nil, fmt.Errorf("%w: content: %w", ErrDecrypt, err)
	}
	if pt == nil {
		pt = []byte{}
	}
	return pt, nil
}

type slot struct {
	recipient  string
	keyID      [keyIDSize]byte
	encWrapped []byte // enc || wrapped, as hpke.Open takes them
}

type envelope struct {
	household, id, sender string
	senderKey             ed25519.PublicKey
	slots                 []slot
	nonce                 []byte
	ciphertext            []byte
	headerEnd, bodyEnd    int // offsets: the header is b[:headerEnd]; the signature b[bodyEnd:]
}

// parse reads the layout strictly: every length within the bytes, names
// valid, nothing after the signature.
func parse(b []byte) (*envelope, error) {
	if len(b) < 4 || [3]byte(b[:3]) != magic {
		return nil, fmt.Errorf("%w: no magic", ErrMalformed)
	}
	if b[3] != Version {
		return nil, fmt.Errorf("%w: %d", ErrVersion, b[3])
	}
	r := reader{b: b, off: 4}
	e := &envelope{}
	e.household = r.str8()
	e.id = r.str8()
	e.sender = r.str8()
	e.senderKey = r.bytes(ed25519.PublicKeySize)
	n := int(r.byte())
	if r.bad {
		return nil, fmt.Errorf("%w: header cut short", ErrMalformed)
	}
	if !device.ValidName(e.household) || !validID(e.id) || !device.ValidName(e.sender) || n == 0 {
		return nil, fmt.Errorf("%w: a name, the id or the recipient count is not valid", ErrMalformed)
	}
	seen := make(map[string]bool, n)
	for range n {
		var s slot
		s.recipient = r.str8()
		s.keyID = [keyIDSize]byte(r.bytesOr(keyIDSize, make([]byte, keyIDSize)))
		s.encWrapped = r.bytes(encSize + wrappedSize)
		if r.bad {
			return nil, fmt.Errorf("%w: recipients cut short", ErrMalformed)
		}
		if !device.ValidName(s.recipient) || seen[s.recipient] {
			return nil, fmt.Errorf("%w: recipient %q is not a valid name or is named twice", ErrMalformed, s.recipient)
		}
		seen[s.recipient] = true
		e.slots = append(e.slots, s)
	}
	e.nonce = r.bytes(nonceSize)
	e.headerEnd = r.off
	// A length past the end fails the read (r.bytes) before any
	// allocation: nothing here allocates by a declared length.
	e.ciphertext = r.bytes(int(r.uint32()))
	e.bodyEnd = r.off
	r.bytes(sigSize)
	switch {
	case r.bad:
		return nil, fmt.Errorf("%w: body or signature cut short", ErrMalformed)
	case r.off != len(b):
		return nil, fmt.Errorf("%w: %d bytes after the signature", ErrMalformed, len(b)-r.off)
	}
	return e, nil
}

// reader reads big-endian fields; once a read runs past the end, bad is
// set and every later read returns zero values.
type reader struct {
	b   []byte
	off int
	bad bool
}

func (r *reader) bytes(n int) []byte {
	if r.bad || n > len(r.b)-r.off {
		r.bad = true
		return nil
	}
	s := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return s
}

// bytesOr returns bytes, or def when the read fails (for fixed-size arrays).
func (r *reader) bytesOr(n int, def []byte) []byte {
	if s := r.bytes(n); s != nil {
		return s
	}
	return def
}

func (r *reader) byte() byte {
	if s := r.bytes(1); s != nil {
		return s[0]
	}
	return 0
}

func (r *reader) uint32() uint32 {
	if s := r.bytes(4); s != nil {
		return binary.BigEndian.Uint32(s)
	}
	return 0
}

func (r *reader) str8() string {
	n := int(r.byte())
	return string(r.bytes(n))
}

func appendStr8(b []byte, s string) []byte {
	b = append(b, byte(len(s)))
	return append(b, s...)
}

// validID reports whether id keeps the protocol's rule for a send's id: 1 to 128 printable
// ASCII characters.
func validID(id string) bool {
	if len(id) < 1 || len(id) > maxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// slotInfo returns HPKE's info for recipient's slot: it binds the wrapped key
// to the household, the id, the sender, its key and the recipient, so a
// slot cannot be moved into another envelope.
func slotInfo(household, id, sender string, senderKey ed25519.PublicKey, recipient string, kid [keyIDSize]byte) []byte {
	b := []byte(infoContext)
	b = appendStr8(b, household)
	b = appendStr8(b, id)
	b = appendStr8(b, sender)
	b = append(b, senderKey...)
	b = appendStr8(b, recipient)
	return append(b, kid[:]...)
}

// signed returns what the signature covers: the context, then header and body.
func signed(headerAndBody []byte) []byte {
	return append([]byte(sigContext), headerAndBody...)
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return cipher.NewGCM(block)
}
