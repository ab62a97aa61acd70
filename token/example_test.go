package token_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/flamenet/relay/token"
)

// An issuer of one's own mints a device's token with its Ed25519 private
// key; the relays trust the public key (FN_ISSUER_KEYS). Give each token
// a short life (the relay's own pairing uses one hour) and mint a new one
// before it ends: a token cannot be taken back before it expires, only
// all of a device's tokens at once, by removing the device.
func ExampleMint() {
	// The issuer's seed, as relay keygen writes it (base64); in a real
	// issuer it comes from a secret store, never from the source.
	seed, err := base64.StdEncoding.DecodeString("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
	if err != nil {
		panic(err)
	}
	key := ed25519.NewKeyFromSeed(seed)

	now := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC) // time.Now() in an issuer
	tok, err := token.Mint(key, token.Claims{
		Household: "home",
		Device:    "phone",
		Scope:     token.ScopeDevice, // or token.ScopeAdmin: may remove devices
		IssuedAt:  now,
		Expires:   now.Add(time.Hour),
	})
	if err != nil {
		panic(err)
	}

	// What a relay trusting the public key makes of it.
	c, err := token.Verify(tok, []ed25519.PublicKey{key.Public().(ed25519.PublicKey)}, now)
	if err != nil {
		panic(err)
	}
	fmt.Println(c.Household, c.Device, c.Scope, c.Expires.Sub(c.IssuedAt))
	// Output: home phone device 1h0m0s
}
