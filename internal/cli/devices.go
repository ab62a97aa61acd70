package cli

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/seal"
)

// adminFlags are the flags of the commands that act as the household's
// admin with a short-lived token minted with the issuer key: invite,
// devices and remove.
type adminFlags struct {
	household, url, keyFile string
}

func (f *adminFlags) bind(fs *flag.FlagSet) {
	keyFileSetting, _ := config.Lookup("FN_ISSUER_KEY_FILE")
	fs.StringVar(&f.household, "household", "home", "household")
	fs.StringVar(&f.url, "url", defaultRelayURL, "relay base URL (env FN_RELAY_URL)")
	fs.StringVar(&f.keyFile, "issuer-key-file", keyFileSetting.Default, "issuer private key file (env FN_ISSUER_KEY_FILE), the relay's own flag's name")
}

// token returns the admin token (inviteToken) minted with the issuer key that
// cliIssuerKey finds; from says where the key came from, for messages.
func (f *adminFlags) token(fs *flag.FlagSet, getenv func(string) string) (tok, from string, err error) {
	key, from, err := cliIssuerKey(fs, f.keyFile, getenv)
	if err != nil {
		return "", from, fmt.Errorf("issuer key: %w", err)
	}
	tok, err = inviteToken(key, f.household, time.Now())
	return tok, from, err
}

// base returns -url without a trailing slash.
func (f *adminFlags) base() string { return strings.TrimRight(f.url, "/") }

// client returns a client of the relay with the admin token.
func (f *adminFlags) client(fs *flag.FlagSet, getenv func(string) string) (c *client.Client, from string, err error) {
	tok, from, err := f.token(fs, getenv)
	if err != nil {
		return nil, from, err
	}
	c, err = client.New(f.base(), tok)
	if err != nil {
		return nil, from, usageErr("-url: %w", err)
	}
	return c, from, nil
}

// adminHint returns what a refusal of an admin call most likely means.
func adminHint(err error) string {
	var e *client.Error
	if errors.As(err, &e) && e.Status == http.StatusUnauthorized {
		return ": the relay does not trust this issuer key"
	}
	return ""
}

const devicesUsage = `usage: relay devices [-household HOME] [-url URL] [-issuer-key-file FILE]

Lists the household's devices (GET /v1/devices), one a line, in name order.

A line reads NAME: last seen TIME, registered TIME, push KIND; then
"fingerprint" and the digits of the device's key (relay pair -identity
prints the same digits on the device), or "no key". The request carries a
60-second admin token minted with the issuer private key, as relay
invite's does.`

func devicesCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("devices", flag.ContinueOnError)
	var af adminFlags
	af.bind(fs)
	if err := parseFlags(fs, args, getenv, devicesUsage, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("devices: unexpected argument %q", fs.Arg(0))
	}
	c, from, err := af.client(fs, getenv)
	if err != nil {
		return fmt.Errorf("devices: %w", err)
	}
	devices, err := c.Directory(ctx)
	if err != nil {
		return fmt.Errorf("devices: %s: %w%s (key from %s)", af.base(), err, adminHint(err), from)
	}
	if len(devices) == 0 {
		fmt.Fprintf(stdout, "no devices in household %q\n", af.household)
	}
	for _, d := range devices {
		fp := "no key"
		if len(d.IdentityKey) == ed25519.PublicKeySize {
			fp = "fingerprint " + seal.Fingerprint(d.IdentityKey)
		}
		fmt.Fprintf(stdout, "%s: last seen %s, registered %s, push %s; %s\n", d.Device, d.LastSeen, d.RegisteredAt, d.PushKind, fp)
	}
	return nil
}
