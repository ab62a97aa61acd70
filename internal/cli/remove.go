package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"

	"github.com/flamenet/relay/client"
)

const removeUsage = `usage: relay remove [-household HOME] [-url URL] [-issuer-key-file FILE] NAME

Removes the device NAME from the household (DELETE /v1/devices/{device}).

Its pending envelopes, renewal secret and invitations go at once, its held
polls end and its tokens issued before the removal are refused; a new
invitation (relay invite -household HOME -device NAME, no -replace: the
device is gone) pairs it again. The request carries
a 60-second admin token minted with the issuer private key, as relay
invite's does.`

func removeCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("remove", flag.ContinueOnError)
	var af adminFlags
	af.bind(fs)
	if err := parseFlags(fs, args, getenv, removeUsage, stdout, stderr); err != nil {
		return err
	}
	switch {
	case fs.NArg() == 0:
		return usageErr("remove: name the device: relay remove NAME")
	case fs.NArg() > 1:
		return usageErr("remove: unexpected argument %q (flags go before NAME)", fs.Arg(1))
	}
	name := fs.Arg(0)
	c, from, err := af.client(fs, getenv)
	if err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	if err := c.RemoveDevice(ctx, name); err != nil {
		hint := adminHint(err)
		var e *client.Error
		if errors.As(err, &e) && e.Status == http.StatusNotFound {
			hint = fmt.Sprintf(": household %q has no device %q (relay devices lists them)", af.household, name)
		}
		return fmt.Errorf("remove: %s: %w%s (key from %s)", af.base(), err, hint, from)
	}
	fmt.Fprintf(stdout, "removed device %q of household %q: its tokens, renewal secret and envelopes are gone; %s pairs it again\n",
		name, af.household, inviteAgain(af.household, name, ""))
	return nil
}
