package cli

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/token"
)

// errRefused ends `relay token check` with exit status 1 once it has
// printed why the relay would refuse the token.
var errRefused = &exitError{code: 1}

// askExit is token check's exit status when -url names a relay it could
// not ask: no verdict, which a script must not read as refused.
const askExit = 3

// checkToken runs `relay token check`: it shows what a token says and
// whether a relay with the same issuer settings would accept it, using the
// relay's own verification (package token) and name rule.
func checkToken(args []string, getenv func(string) string, stdout io.Writer) error {
	fset := flags("token check", `[-issuer-keys KEYS] [-issuer-key-file FILE] [-url URL] TOKEN|-
       relay token check [flags] -token-file FILE`, `Prints a token's header and claims, then why a relay trusting these keys
refuses it, or that its signature and expiry are valid. "-" reads the token
from standard input. The keys are the relay's own settings: FN_ISSUER_KEYS,
or when that is empty the key in FN_ISSUER_KEY_FILE.

Whether the token's device was removed (its tokens issued before then are
refused) only the relay knows: -url asks the relay at URL with the token
(GET /v1/devices, which changes nothing) and prints its verdict.

Exit status 0 when valid (with -url: the relay accepts it), 1 when
refused, 3 when -url's relay could not be asked.`, stdout)
	keysFlag := fset.String("issuer-keys", "", "comma-separated base64 Ed25519 public keys the relay trusts (env FN_ISSUER_KEYS)")
	keyFile := fset.String("issuer-key-file", config.Default().IssuerKeyFile,
		"issuer private key file the relay trusts when no keys are given (env FN_ISSUER_KEY_FILE); it is read, never created")
	tokenFile := fset.String("token-file", "", "read the token from this file instead of an argument")
	url := fset.String("url", "", "also ask the relay at this base URL whether it accepts the token (default: offline)")
	env := map[string]string{"issuer-keys": "FN_ISSUER_KEYS", "issuer-key-file": "FN_ISSUER_KEY_FILE"}
	if _, err := config.Parse(fset, args, getenv, func(f string) string { return env[f] }); err != nil {
		return err
	}
	raw, err := readToken(fset, *tokenFile)
	if err != nil {
		return fmt.Errorf("token check: %w", err)
	}
	keys, source, err := trustedKeys(*keysFlag, *keyFile)
	if err != nil {
		return fmt.Errorf("token check: %w", err)
	}
	now := time.Now()
	fmt.Fprintf(stdout, "trusted  %s\n", source)
	hdr, shown, inspectErr := token.Inspect(raw)
	if inspectErr == nil {
		printToken(stdout, hdr, shown, now)
	}
	c, err := token.Verify(raw, keys, now)
	if err != nil {
		fmt.Fprintf(stdout, "refused: %s; the relay answers 401\n", refusal(err, shown, now))
		return errRefused
	}
	for i, k := range keys {
		if _, err := token.Verify(raw, []ed25519.PublicKey{k}, now); err == nil {
			fmt.Fprintf(stdout, "signed   by key %d of %d (%s)\n", i+1, len(keys), base64.StdEncoding.EncodeToString(k))
			break
		}
	}
	if !device.ValidName(c.Household) || !device.ValidName(c.Device) {
		fmt.Fprintln(stdout, "refused: bad names: the household or device is not 1 to 64 characters of A-Z a-z 0-9 . _ -; the relay answers 400")
		return errRefused
	}
	if c.IssuedAt.IsZero() {
		fmt.Fprintln(stdout, "note     no iat: refused as soon as its device is ever removed")
	}
	if *url == "" {
		fmt.Fprintln(stdout, "valid signature and expiry; whether the device was removed only the relay knows (-url asks it)")
		return nil
	}
	return askRelay(*url, raw, stdout)
}

// askRelay asks the relay at base whether it accepts tok: what an offline
// check cannot know is whether the device was removed after tok was
// issued. GET /v1/devices is the authenticated call that changes nothing.
func askRelay(base, tok string, stdout io.Writer) error {
	base = strings.TrimRight(base, "/")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/devices?limit=1", nil)
	if err != nil {
		return &exitError{code: askExit, err: fmt.Errorf("token check: -url: %w", err)}
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return &exitError{code: askExit, err: fmt.Errorf("token check: asking the relay: %w", err)}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	switch resp.StatusCode {
	case http.StatusOK:
		fmt.Fprintf(stdout, "valid: the relay at %s accepts it\n", base)
		return nil
	case http.StatusUnauthorized:
		// The offline check passed, so the relay knows what it did not.
		fmt.Fprintf(stdout, "refused: the relay at %s answers 401: the device was removed after the token was issued, or the relay trusts other keys than these\n", base)
		return errRefused
	}
	return &exitError{code: askExit, err: fmt.Errorf("token check: the relay at %s answered %s: %s", base, resp.Status, strings.TrimSpace(string(body)))}
}

// readToken takes the token from -token-file, the argument, or standard
// input for "-".
func readToken(fset *flag.FlagSet, file string) (string, error) {
	var b []byte
	var err error
	switch {
	case file != "" && fset.NArg() == 0:
		b, err = os.ReadFile(file)
	case file == "" && fset.NArg() == 1 && fset.Arg(0) == "-":
		b, err = io.ReadAll(io.LimitReader(os.Stdin, 64<<10))
	case file == "" && fset.NArg() == 1:
		b = []byte(fset.Arg(0))
	default:
		return "", errors.New("give one token: an argument, - for standard input, or -token-file (relay token check -h)")
	}
	if err != nil {
		return "", err
	}
	raw := strings.TrimSpace(string(b))
	if raw == "" {
		return "", errors.New("the token is empty")
	}
	return raw, nil
}

// trustedKeys resolves the keys as the relay does at start: FN_ISSUER_KEYS,
// else the public half of FN_ISSUER_KEY_FILE. Unlike the relay it never
// creates that file: a new key would verify no existing token.
func trustedKeys(keysFlag, keyFile string) ([]ed25519.PublicKey, string, error) {
	keys, err := config.ParseIssuerKeys(keysFlag)
	if err != nil {
		return nil, "", fmt.Errorf("FN_ISSUER_KEYS: %w", err)
	}
	if len(keys) > 0 {
		return keys, fmt.Sprintf("%d key(s) from FN_ISSUER_KEYS", len(keys)), nil
	}
	priv, err := readIssuerKey(keyFile)
	if err != nil {
		return nil, "", fmt.Errorf("FN_ISSUER_KEYS is empty and FN_ISSUER_KEY_FILE cannot be read (a relay would create a new key there, trusting no existing token): %w", err)
	}
	pub := priv.Public().(ed25519.PublicKey)
	return []ed25519.PublicKey{pub}, fmt.Sprintf("the key in %s, public %s (FN_ISSUER_KEYS is empty)", keyFile, base64.StdEncoding.EncodeToString(pub)), nil
}

func printToken(w io.Writer, h token.Header, c token.Claims, now time.Time) {
	field := func(name, v string) {
		if v != "" {
			fmt.Fprintf(w, "%-8s %s\n", name, v)
		}
	}
	field("alg", h.Alg)
	field("typ", h.Typ)
	field("kid", h.Kid)
	field("hh", c.Household)
	field("sub", c.Device)
	scope := c.Scope
	if scope == "" {
		scope = token.ScopeDevice + " (none given)"
	}
	field("scope", scope)
	field("iat", when(c.IssuedAt, now))
	field("nbf", when(c.NotBefore, now))
	field("exp", when(c.Expires, now))
}

// when shows a claim's time with its distance from now.
func when(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := t.Sub(now).Round(time.Second)
	if d == 0 {
		return t.UTC().Format(time.RFC3339) + " (now)"
	}
	if d < 0 {
		return fmt.Sprintf("%s (%s ago)", t.UTC().Format(time.RFC3339), -d)
	}
	return fmt.Sprintf("%s (in %s)", t.UTC().Format(time.RFC3339), d)
}

// refusal says why Verify refused the token, in the operator's terms.
func refusal(err error, c token.Claims, now time.Time) string {
	switch {
	case errors.Is(err, token.ErrSignature):
		return "bad signature: no trusted key verifies it (signed by a key the relay does not trust, or altered after signing)"
	case errors.Is(err, token.ErrExpired):
		return fmt.Sprintf("expired: exp is %s, beyond the %s allowed for clock skew", when(c.Expires, now), token.Skew)
	case errors.Is(err, token.ErrNotYetValid):
		return fmt.Sprintf("not yet valid: nbf is %s, beyond the %s allowed for clock skew", when(c.NotBefore, now), token.Skew)
	case errors.Is(err, token.ErrFutureIssue):
		return fmt.Sprintf("iat in the future: iat is %s, beyond the %s allowed for clock skew (the issuer's clock is ahead)", when(c.IssuedAt, now), token.Skew)
	}
	// The package's own words: malformed, algorithm, claims, scope.
	return strings.TrimPrefix(err.Error(), "token: ")
}
