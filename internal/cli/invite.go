package cli

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"slices"
	"time"

	qrcode "github.com/skip2/go-qrcode"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/seal"
	"github.com/flamenet/relay/token"
)

// inviteSubject is the sub of the admin tokens relay invite mints: the
// access log names the command, not a device.
const inviteSubject = "relay-cli"

// inviteTokenLife is how long relay invite's admin token lives: the one
// request it makes, with room for clocks a little apart.
const inviteTokenLife = 60 * time.Second

const inviteUsage = `usage: relay invite -device DEVICE [-replace] [-household HOME] [-scope device|admin] [-url URL] [-issuer-key-file FILE]
       relay invite -cancel -device DEVICE [-household HOME] [-url URL] [-issuer-key-file FILE]
       relay invite -list [-household HOME] [-url URL] [-issuer-key-file FILE]

Asks the relay for a single-use invitation code for DEVICE (POST
/v1/invitations) and prints the code, the pairing link, its expiry and the
link as a QR code.

The request carries a 60-second admin token minted with the issuer private
key (read as relay token reads it). On the device: relay pair -url URL
-code CODE -store FILE, or open the link. Only a relay that mints its own
tokens (FN_ISSUER_KEYS empty) pairs devices.

A device of that name that exists is refused, unless -replace: redeeming
the invitation then removes that device (its envelopes, credentials and
key) before the new one takes the name.

-cancel cancels DEVICE's pending invitation: its code no longer pairs.

-list prints the household's pending invitations and those redeemed in the
last day, each with the fingerprint of the key the device paired with
(relay pair -identity prints the same digits on the device: compare them).`

// inviteAnswer is POST /v1/invitations' 201 answer.
type inviteAnswer struct {
	Code      string `json:"code"`
	URL       string `json:"url"`
	Household string `json:"household"`
	Device    string `json:"device"`
	Scope     string `json:"scope"`
	Replace   bool   `json:"replace"`
	ExpiresAt string `json:"expires_at"`
}

func inviteCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("invite", flag.ContinueOnError)
	var af adminFlags
	af.bind(fs)
	household := &af.household
	device := fs.String("device", "", "the device to invite (its name)")
	scope := fs.String("scope", token.ScopeDevice, "the paired device's scope: device or admin")
	list := fs.Bool("list", false, "list the household's invitations, with the fingerprint of each paired device's key")
	replace := fs.Bool("replace", false, "the device may exist: pairing removes it first")
	cancelInv := fs.Bool("cancel", false, "cancel the device's pending invitation")
	if err := parseFlags(fs, args, getenv, inviteUsage, stdout, stderr); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return usageErr("invite: unexpected argument %q", fs.Arg(0))
	case *list && *device != "":
		return usageErr("invite: -list lists every device's; give no -device")
	case *list && *cancelInv, *cancelInv && *replace:
		return usageErr("invite: -cancel goes with -device alone")
	case *list:
	case *device == "":
		return usageErr("invite: -device is required")
	case *scope != token.ScopeDevice && *scope != token.ScopeAdmin:
		return usageErr("invite: -scope %q: want device or admin", *scope)
	}
	tok, from, err := af.token(fs, getenv)
	if err != nil {
		return fmt.Errorf("invite: %w", err)
	}
	base := af.base()
	if *list {
		if err := listInvitations(ctx, stdout, base, tok); err != nil {
			return fmt.Errorf("invite: %s: %w (key from %s)", base, err, from)
		}
		return nil
	}
	if *cancelInv {
		if err := cancelInvitation(ctx, base, tok, *device); err != nil {
			return fmt.Errorf("invite: %s: %w (key from %s)", base, err, from)
		}
		fmt.Fprintf(stdout, "Cancelled the pending invitation of device %q of household %q: its code no longer pairs.\n", *device, *household)
		return nil
	}
	inv, err := requestInvitation(ctx, base, tok, *device, *scope, *replace)
	if err != nil {
		return fmt.Errorf("invite: %s: %w (key from %s)", base, err, from)
	}
	note := ""
	if inv.Replace {
		// The answer says only that the invitation may replace a device:
		// whether there is one, the directory says.
		switch exists, err := deviceExists(ctx, base, tok, inv.Device); {
		case err != nil:
			note = fmt.Sprintf("Redeeming it removes the device %q, if there is one by then, with its envelopes and credentials.", inv.Device)
		case exists:
			note = fmt.Sprintf("Redeeming it removes the device %q there is now, with its envelopes and credentials.", inv.Device)
		}
	}
	return printInvitation(stdout, base, inv, note, time.Now())
}

// deviceExists reports whether the household's directory lists device.
func deviceExists(ctx context.Context, base, tok, device string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := client.New(base, tok)
	if err != nil {
		return false, err
	}
	devices, err := c.Directory(ctx)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(devices, func(d client.DirectoryEntry) bool { return d.Device == device }), nil
}

// inviteToken returns the admin token of household relay invite sends: sub
// relay-cli, living inviteTokenLife from now.
func inviteToken(key ed25519.PrivateKey, household string, now time.Time) (string, error) {
	return token.Mint(key, token.Claims{Household: household, Device: inviteSubject, Scope: token.ScopeAdmin,
		IssuedAt: now, Expires: now.Add(inviteTokenLife)})
}

// requestInvitation makes the invitation; a refusal is an error carrying
// the relay's message and what it most likely means.
func requestInvitation(ctx context.Context, base, tok, device, scope string, replace bool) (inviteAnswer, error) {
	body, err := json.Marshal(map[string]any{"device": device, "scope": scope, "replace": replace})
	if err != nil {
		return inviteAnswer{}, err
	}
	b, err := adminCall(ctx, http.MethodPost, base+"/v1/invitations", tok, body, http.StatusCreated, map[int]string{
		http.StatusUnauthorized: ": the relay does not trust this issuer key",
		http.StatusNotFound:     ": the relay does not pair devices (its tokens come from another issuer: FN_ISSUER_KEYS is set)",
		http.StatusConflict:     " (relay invite -replace)",
	})
	if err != nil {
		return inviteAnswer{}, err
	}
	var inv inviteAnswer
	if err := json.Unmarshal(b, &inv); err != nil || inv.Code == "" {
		return inviteAnswer{}, errors.New("the answer is not an invitation")
	}
	return inv, nil
}

// cancelInvitation cancels device's pending invitation.
func cancelInvitation(ctx context.Context, base, tok, device string) error {
	_, err := adminCall(ctx, http.MethodDelete, base+"/v1/invitations/"+neturl.PathEscape(device), tok, nil, http.StatusNoContent, nil)
	return err
}

// adminCall makes one request of relay invite with its admin token, bounded
// by 30 s, and returns the first 4 MiB of the answer, which must have status
// want; any other is an error carrying the status, the relay's message
// and hints[status].
func adminCall(ctx context.Context, method, url, tok string, body []byte, want int, hints map[int]string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != want {
		var e struct{ Message string }
		_ = json.Unmarshal(b, &e) // a body that is not the protocol's says nothing more
		return nil, fmt.Errorf("%s %s%s", resp.Status, e.Message, hints[resp.StatusCode])
	}
	return b, nil
}

// printInvitation prints the code, the link, the expiry and the link as a
// QR code of half-block characters, which most terminals show square; note,
// when not empty, under the first line.
func printInvitation(w io.Writer, base string, inv inviteAnswer, note string, now time.Time) error {
	q, err := qrcode.New(inv.URL, qrcode.Medium)
	if err != nil {
		return fmt.Errorf("invite: QR code: %w", err)
	}
	expiry := inv.ExpiresAt
	if t, err := time.Parse(time.RFC3339Nano, inv.ExpiresAt); err == nil {
		expiry = fmt.Sprintf("%s (in %s)", t.Local().Format("2006-01-02 15:04:05 MST"), t.Sub(now).Round(time.Second))
	}
	fmt.Fprintf(w, "Invitation for device %q of household %q (scope %s), single use:\n\n", inv.Device, inv.Household, inv.Scope)
	if note != "" {
		fmt.Fprintf(w, "%s\n\n", note)
	}
	fmt.Fprintf(w, "  code:     %s\n  link:     %s\n  expires:  %s\n\n", inv.Code, inv.URL, expiry)
	fmt.Fprint(w, q.ToSmallString(false))
	fmt.Fprintf(w, "\nOn the device, open the link, or run:\n\n  relay pair -url %s -code %s -store %s.json\n", base, inv.Code, inv.Device)
	return nil
}

// listInvitations prints GET /v1/invitations, a line each: the device, its
// scope, pending (until when) or paired (when), and the fingerprint of the
// key it paired with.
func listInvitations(ctx context.Context, w io.Writer, base, tok string) error {
	b, err := adminCall(ctx, http.MethodGet, base+"/v1/invitations", tok, nil, http.StatusOK, nil)
	if err != nil {
		return err
	}
	var ans struct {
		Invitations []struct {
			Device      string  `json:"device"`
			Scope       string  `json:"scope"`
			ExpiresAt   string  `json:"expires_at"`
			RedeemedAt  *string `json:"redeemed_at"`
			IdentityKey []byte  `json:"identity_key"`
			Replace     bool    `json:"replace"`
			CreatedBy   string  `json:"created_by"`
		} `json:"invitations"`
	}
	if err := json.Unmarshal(b, &ans); err != nil {
		return fmt.Errorf("the answer is not a list of invitations: %w", err)
	}
	if len(ans.Invitations) == 0 {
		fmt.Fprintln(w, "no invitations pending or redeemed in the last day")
	}
	for _, inv := range ans.Invitations {
		state := "pending until " + inv.ExpiresAt
		if inv.RedeemedAt != nil {
			state = "paired at " + *inv.RedeemedAt
		}
		fp := "no key"
		if len(inv.IdentityKey) == ed25519.PublicKeySize {
			fp = "fingerprint " + seal.Fingerprint(inv.IdentityKey)
		}
		if inv.Replace {
			state += ", replacing the device of that name"
		}
		if inv.CreatedBy != "" {
			state += ", made by " + inv.CreatedBy
		}
		fmt.Fprintf(w, "%s (%s): %s; %s\n", inv.Device, inv.Scope, state, fp)
	}
	return nil
}
