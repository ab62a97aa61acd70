// Package webpush is the sending side of Web Push: message encryption
// (RFC 8291, the aes128gcm content coding of RFC 8188 in one record) and
// the VAPID header that identifies the sender to the push service
// (RFC 8292). It is built on the standard library's ECDH, HKDF, AES-GCM
// and ECDSA, and checked against RFC 8291's own example.
package webpush

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Sizes of the subscription's keys and of the encrypted body's parts.
const (
	// AuthSize is the subscription's authentication secret's length.
	AuthSize = 16
	// PublicKeySize is an uncompressed P-256 point's length.
	PublicKeySize = 65
	saltSize      = 16
	tagSize       = 16
	headerSize    = saltSize + 4 + 1 + PublicKeySize
	// RecordSize is the rs the body declares: the most a push service
	// must take (RFC 8291 section 4).
	RecordSize = 4096
)

// ErrKey is a subscription key that cannot be used: a p256dh that is not
// a P-256 point, or an auth secret that is not 16 bytes.
var ErrKey = errors.New("webpush: subscription key not usable")

// Subscription is what a browser's PushSubscription gives the sender:
// its user agent's public key (p256dh) and authentication secret.
type Subscription struct {
	P256dh []byte // an uncompressed P-256 point, 65 bytes
	Auth   []byte // 16 bytes
}

// Check says whether s's keys can be encrypted to, with ErrKey naming
// which field is wrong.
func (s Subscription) Check() error {
	if !s.P256dhOK() {
		return fmt.Errorf("%w: p256dh is not an uncompressed P-256 point (65 bytes, 0x04 first)", ErrKey)
	}
	if len(s.Auth) != AuthSize {
		return fmt.Errorf("%w: auth is %d bytes, not %d", ErrKey, len(s.Auth), AuthSize)
	}
	return nil
}

// P256dhOK says whether s's p256dh, at least, is usable.
func (s Subscription) P256dhOK() bool {
	if len(s.P256dh) != PublicKeySize || s.P256dh[0] != 4 {
		return false
	}
	_, err := ecdh.P256().NewPublicKey(s.P256dh)
	return err == nil
}

// Encrypt returns plaintext encrypted to s as an aes128gcm body of one record,
// padded to pad bytes of plaintext and padding (so that its length says
// nothing more; 0: no padding), from a fresh sender key and salt.
func Encrypt(s Subscription, plaintext []byte, pad int) ([]byte, error) {
	sender, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	salt := make([]byte, saltSize)
	if _, err := io.ReadFull(rand.Reader, salt); err != nil {
		return nil, err
	}
	return encrypt(s, plaintext, pad, sender, salt)
}

// encrypt is Encrypt with the sender key and salt given (RFC 8291's
// example fixes both).
func encrypt(s Subscription, plaintext []byte, pad int, sender *ecdh.PrivateKey, salt []byte) ([]byte, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	padding := max(0, pad-len(plaintext))
	if headerSize+len(plaintext)+1+padding+tagSize > RecordSize+headerSize {
		return nil, errors.New("webpush: the message does not fit one record")
	}
	ua, _ := ecdh.P256().NewPublicKey(s.P256dh) // checked above
	shared, err := sender.ECDH(ua)
	if err != nil {
		return nil, err
	}
	asPublic := sender.PublicKey().Bytes()

	// RFC 8291 section 3.4: the input keying material from the ECDH
	// secret and the auth secret, then RFC 8188's key and nonce from it
	// and the salt.
	keyInfo := append(append([]byte("WebPush: info\x00"), s.P256dh...), asPublic...)
	ikm, err := hkdf.Key(sha256.New, shared, s.Auth, string(keyInfo), 32)
	if err != nil {
		return nil, err
	}
	prk, err := hkdf.Extract(sha256.New, ikm, salt)
	if err != nil {
		return nil, err
	}
	cek, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: aes128gcm\x00", 16)
	if err != nil {
		return nil, err
	}
	nonce, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: nonce\x00", 12)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(cek)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}

	body := make([]byte, 0, headerSize+len(plaintext)+1+padding+tagSize)
	body = append(body, salt...)
	body = binary.BigEndian.AppendUint32(body, RecordSize)
	body = append(body, PublicKeySize)
	body = append(body, asPublic...)
	// The last (only) record: the plaintext, the delimiter 2, zeros.
	record := make([]byte, 0, len(plaintext)+1+padding)
	record = append(record, plaintext...)
	record = append(record, 2)
	record = append(record, make([]byte, padding)...)
	return gcm.Seal(body, nonce, record, nil), nil
}
