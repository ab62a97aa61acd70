package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/seal"
	"github.com/flamenet/relay/token"
)

const pairUsage = `usage: relay pair -url URL -code CODE -store FILE [-identity FILE]

Redeems an invitation's code at the relay (no token needed) and writes the
device's credentials to FILE (JSON, readable by its owner only).

relay send and relay listen then take -store FILE instead of a token, and
renew the credentials in it as they go.`

func pairCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("pair", flag.ContinueOnError)
	url := fs.String("url", defaultRelayURL, "relay base URL (env FN_RELAY_URL)")
	code := fs.String("code", "", "the invitation's code, as shown (ABCDE-FGHJK)")
	store := fs.String("store", "", "write the credentials to this file")
	identity := fs.String("identity", "", "publish this identity's key (a seed file, created 0600 when missing; relay send -seal's) and print its fingerprint, for the inviting admin to compare")
	if err := parseFlags(fs, args, getenv, pairUsage, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("pair: unexpected argument %q", fs.Arg(0))
	}
	if strings.TrimSpace(*code) == "" || *store == "" {
		return usageErr("pair: give -code and -store")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	opts := client.PairOptions{Store: client.FileStore(*store)}
	var id *seal.Identity
	if *identity != "" {
		var err error
		if id, _, err = seal.LoadOrCreateIdentity(*identity); err != nil {
			return fmt.Errorf("pair: %w", err)
		}
		opts.IdentityKey = id.Public()
	}
	c, err := client.Pair(ctx, *url, *code, opts)
	var e *client.Error
	if errors.As(err, &e) && e.Status == http.StatusUnauthorized {
		// The code alone does not name the device: the admin knows it.
		return fmt.Errorf("pair: %w (relay invite -device NAME)", err)
	}
	if err != nil {
		return fmt.Errorf("pair: %w", err)
	}
	fmt.Fprintf(stdout, "paired as device %q of household %q (scope %s); credentials in %s, renewal secret valid until %s\n",
		c.Device, c.Household, c.Scope, *store, c.RenewalExpiresAt.UTC().Format(time.RFC3339))
	if id != nil {
		// The inviting admin sees the key the relay received (relay invite
		// -list): the same digits mean no one swapped it on the way.
		fmt.Fprintf(stdout, "fingerprint: %s\n", id.Fingerprint())
	}
	return nil
}

// storeClient makes a client whose credentials come from the -store file
// and are renewed into it; the URL is the one relay pair wrote there
// unless -url (or FN_RELAY_URL) names another than the default.
func (f *clientFlags) storeClient(ctx context.Context, opts ...client.Option) (*client.Client, error) {
	if f.token != "" || f.tokenFile != "" {
		return nil, usageErr("give -store or a token, not both")
	}
	store := client.FileStore(f.store)
	creds, err := store.Load(ctx)
	if err != nil {
		return nil, usageErr("-store: %w", err)
	}
	url := f.url
	if f.url == defaultRelayURL && creds.URL != "" {
		url = creds.URL
	}
	codec, err := codecOption(f.codec)
	if err != nil {
		return nil, err
	}
	opts = append(opts, codec)
	src, err := client.NewRenewing(ctx, url, store, client.RenewingOptions{})
	if err != nil {
		return nil, usageErr("-store: %w", err)
	}
	c, err := client.NewWithCredentials(url, src, opts...)
	if err != nil {
		return nil, usageErr("%w", err)
	}
	return c, nil
}

// refused adds to err, when the relay refused the device's credentials for
// good, the commands that help: with -store, the invitation and pairing
// that replace them, with the device's names from the file; with a token,
// token check, which asks the relay why.
func (f *clientFlags) refused(ctx context.Context, err error) error {
	if !errors.Is(err, client.ErrUnauthorized) {
		return err
	}
	if f.store == "" {
		return fmt.Errorf("%w; relay token check -url %s TOKEN says why", err, f.url)
	}
	c, lerr := client.FileStore(f.store).Load(ctx)
	if lerr != nil {
		return err
	}
	scope := ""
	if c.Scope == token.ScopeAdmin {
		scope = " -scope admin"
	}
	url := f.url
	if f.url == defaultRelayURL && c.URL != "" {
		url = c.URL // as storeClient chose it
	}
	// The invitation relay remove names. The refusal does not say why: a
	// device refused for reuse of its secret still exists, and only
	// -replace invites it.
	return fmt.Errorf("%w (%s, then relay pair -url %s -code CODE -store %s; if relay devices still lists %s, invite with -replace)",
		err, inviteAgain(c.Household, c.Device, scope), url, f.store, c.Device)
}

// inviteAgain returns the command that invites a removed device again: it needs
// no -replace, the device being gone. scope is "" or " -scope admin".
func inviteAgain(household, device, scope string) string {
	return fmt.Sprintf("relay invite -household %s -device %s%s", household, device, scope)
}
