package client

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// PairOptions are Pair's optional settings.
type PairOptions struct {
	// IdentityKey is the device's Ed25519 public key, registered with it
	// so that the inviting admin can compare its fingerprint.
	IdentityKey ed25519.PublicKey
	// Store receives the credentials before Pair returns (nil: not saved).
	Store CredentialStore
	// HTTPClient makes the request (default: a client of its own).
	HTTPClient *http.Client
	// RequestTimeout bounds the request (default 30 s).
	RequestTimeout time.Duration
}

// Pair redeems an invitation's code at the relay at baseURL (POST
// /v1/pair, no token needed), saves the device's credentials in
// opts.Store and returns them. A wrong, used or expired code is an error
// that wraps the relay's *Error with Status 401 (errors.As) and says to
// ask for a new invitation; NewRenewing then keeps the credentials fresh:
//
//	store := client.FileStore("phone.json")
//	if _, err := client.Pair(ctx, url, "ABCDE-FGHJK", client.PairOptions{Store: store}); err != nil { ... }
//	src, err := client.NewRenewing(ctx, url, store, client.RenewingOptions{})
//	c, err := client.NewWithCredentials(url, src)
func Pair(ctx context.Context, baseURL, code string, opts PairOptions) (Credentials, error) {
	base := strings.TrimRight(baseURL, "/")
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		return Credentials{}, fmt.Errorf("client: base URL %q is not http:// or https://", baseURL)
	}
	if strings.TrimSpace(code) == "" {
		return Credentials{}, errors.New("client: no pairing code")
	}
	body := map[string]string{"code": code}
	if opts.IdentityKey != nil {
		if len(opts.IdentityKey) != ed25519.PublicKeySize {
			return Credentials{}, errors.New("client: the identity key is not an Ed25519 public key")
		}
		body["identity_key"] = base64.StdEncoding.EncodeToString(opts.IdentityKey)
	}
	timeout := opts.RequestTimeout
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	var c Credentials
	if err := postJSON(ctx, originOnly(opts.HTTPClient), timeout, base+"/v1/pair", body, &c); err != nil {
		var e *Error
		if errors.As(err, &e) && e.Status == http.StatusUnauthorized {
			// The relay gives one 401 for every cause; each needs a
			// new invitation.
			return Credentials{}, fmt.Errorf("client: pairing refused (%w): the code is wrong, used, expired or cancelled; ask an admin for a new invitation", err)
		}
		return Credentials{}, err
	}
	if err := c.valid(); err != nil {
		return Credentials{}, err
	}
	c.URL = base
	if opts.Store != nil {
		if err := opts.Store.Save(ctx, c); err != nil {
			return Credentials{}, fmt.Errorf("client: saving the paired credentials: %w", err)
		}
	}
	return c, nil
}
