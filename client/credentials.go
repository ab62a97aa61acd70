package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/flamenet/relay/internal/atomicfile"
)

// CredentialSource gives the client the bearer token of each request.
// StaticToken is a fixed token; *Renewing keeps paired credentials fresh.
type CredentialSource interface {
	// Token is the access token to send now. An error wrapping
	// ErrUnauthorized means the credentials are refused for good.
	Token(ctx context.Context) (string, error)
	// Refused is told that the relay answered 401 to tok. It returns the
	// token to retry the call with once, or an error: the call then fails
	// with the relay's 401 (or with this error when it is a passing one).
	Refused(ctx context.Context, tok string) (string, error)
}

// RenewalDue is a CredentialSource that can tell when its token is due for
// renewal. A stream is authorized once, when it opens: Listen ends one
// whose token is due (it looks at each event, and the relay pings at
// least every 25 s) and opens the next, renewing, so that a device that
// only streams renews before its token expires, as one that polls does.
type RenewalDue interface {
	// Due reports whether the next Token would renew.
	Due() bool
}

// ErrUnauthorized is what a call's error wraps when the device's
// credentials are refused and no renewal can help: the device must be
// paired again (or given a new token). When the relay refused the call's
// token, the error is also that answer's *Error (Status 401).
var ErrUnauthorized = errors.New("client: credentials refused")

// StaticToken is a fixed token, as New uses: a 401 is final.
type StaticToken string

// Token returns the token.
func (t StaticToken) Token(context.Context) (string, error) { return string(t), nil }

// Refused gives up: a fixed token cannot be renewed.
func (t StaticToken) Refused(context.Context, string) (string, error) {
	return "", ErrUnauthorized
}

// Credentials are what pairing and each renewal return
// (docs/PROTOCOL.md, POST /v1/pair), and what a CredentialStore keeps.
type Credentials struct {
	// URL is the relay's base URL, kept with the credentials so that a
	// store file is all a command line needs (not part of the answer).
	URL              string    `json:"url,omitempty"`
	Household        string    `json:"household"`
	Device           string    `json:"device"`
	Scope            string    `json:"scope"`
	AccessToken      string    `json:"access_token"`
	AccessExpiresAt  time.Time `json:"access_expires_at"`
	RenewalSecret    string    `json:"renewal_secret"`
	RenewalExpiresAt time.Time `json:"renewal_expires_at"`
}

func (c Credentials) valid() error {
	if c.AccessToken == "" || c.RenewalSecret == "" || c.AccessExpiresAt.IsZero() {
		return errors.New("client: credentials without an access token, a renewal secret or an expiry")
	}
	return nil
}

// renewLead returns how long before the access token's expiry it is renewed:
// a third of its life, or 5 minutes, whichever is less. Its life is read
// from the token's own iat and exp (the relay's clock on both ends, so a
// client clock that is off does not shorten or stretch it); without iat,
// 5 minutes.
func renewLead(c Credentials) time.Duration {
	const most = 5 * time.Minute
	life := tokenLife(c)
	if life <= 0 {
		return most
	}
	return min(life/3, most)
}

// tokenLife returns the access token's exp less its iat (0 when unknown).
func tokenLife(c Credentials) time.Duration {
	iat, exp, ok := tokenTimes(c.AccessToken)
	if !ok || exp <= iat {
		return 0
	}
	return time.Duration(exp-iat) * time.Second
}

// tokenTimes reads a JWT's iat and exp without checking it: the relay
// checks it, the client only plans when to renew.
func tokenTimes(tok string) (iat, exp int64, ok bool) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return 0, 0, false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return 0, 0, false
	}
	var claims struct {
		Iat *int64 `json:"iat"`
		Exp *int64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil || claims.Iat == nil || claims.Exp == nil {
		return 0, 0, false
	}
	return *claims.Iat, *claims.Exp, true
}

// CredentialStore keeps a device's credentials. A renewal makes the old
// renewal secret useless, so *Renewing saves each new set before it uses
// it: Save must be durable when it returns.
type CredentialStore interface {
	// Load returns the saved credentials; an error wrapping
	// ErrNoCredentials when none were saved.
	Load(ctx context.Context) (Credentials, error)
	Save(ctx context.Context, c Credentials) error
}

// A LockingStore is a CredentialStore that several holders may share (two
// processes on one file): Renewing takes its lock around each renewal and
// reads the store under it, so that a set another holder renewed is taken
// up rather than renewed again. Presenting a secret another holder has
// spent would revoke every secret of the device (docs/PROTOCOL.md).
type LockingStore interface {
	CredentialStore
	// Lock waits until no other holder has the lock, takes it, and
	// returns its release.
	Lock(ctx context.Context) (unlock func(), err error)
}

// ErrNoCredentials is a store's Load before any Save.
var ErrNoCredentials = errors.New("client: no credentials saved")

// FileStore keeps the credentials in a JSON file, readable by its owner
// only (0600): Save writes a temporary file beside it, syncs it and
// renames it over the old one, so a crash leaves the old set or the new
// one, never a torn file. It is a LockingStore: processes that share the
// file renew one at a time.
type FileStore string

// Load reads the file; a missing file wraps ErrNoCredentials.
func (f FileStore) Load(context.Context) (Credentials, error) {
	b, err := os.ReadFile(string(f))
	if errors.Is(err, fs.ErrNotExist) {
		return Credentials{}, fmt.Errorf("%w: %s does not exist", ErrNoCredentials, f)
	}
	if err != nil {
		return Credentials{}, fmt.Errorf("client: credentials file: %w", err)
	}
	var c Credentials
	if err := json.Unmarshal(b, &c); err != nil {
		return Credentials{}, fmt.Errorf("client: credentials file %s: %w", f, err)
	}
	return c, nil
}

// Save replaces the file atomically and durably.
func (f FileStore) Save(_ context.Context, c Credentials) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("client: credentials file: %w", err)
	}
	if err := atomicfile.Write(string(f), append(b, '\n')); err != nil {
		return fmt.Errorf("client: credentials file: %w", err)
	}
	return nil
}

// MemoryStore keeps the credentials in memory: for tests, and for apps
// that keep them elsewhere themselves.
type MemoryStore struct {
	mu    sync.Mutex
	c     Credentials
	saved bool
}

// Load returns the credentials last saved.
func (m *MemoryStore) Load(context.Context) (Credentials, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.saved {
		return Credentials{}, ErrNoCredentials
	}
	return m.c, nil
}

// Save keeps c.
func (m *MemoryStore) Save(_ context.Context, c Credentials) error {
	m.mu.Lock()
	m.c, m.saved = c, true
	m.mu.Unlock()
	return nil
}
