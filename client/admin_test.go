package client_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/relay"
	"github.com/flamenet/relay/token"
)

// TestAdminCalls: an admin device's calls, in both codecs, against a
// relay that pairs devices: Invite, whose code pairs the device; the
// household's Invitations with the key the device paired with;
// CancelInvitation; the directory with each device's push kind; and
// RemoveDevice, after which the device's token is refused. A device token
// may do none of it.
func TestAdminCalls(t *testing.T) {
	for _, codec := range []struct {
		name  string
		codec client.Codec
	}{{"json", client.JSON}, {"msgpack", client.MessagePack}} {
		t.Run(codec.name, func(t *testing.T) { testAdminCalls(t, codec.codec) })
	}
}

func testAdminCalls(t *testing.T, codec client.Codec) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	r := newRelay(t, func(c *relay.Config) { c.IssuerKeys, c.IssuerKey = []ed25519.PublicKey{pub}, key })
	mint := func(device, scope string) string {
		now := time.Now()
		tok, err := token.Mint(key, token.Claims{Household: "home", Device: device, Scope: scope, IssuedAt: now, Expires: now.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	ctx := context.Background()
	admin, err := client.New(r.URL, mint("admin", token.ScopeAdmin), client.WithCodec(codec))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Register(ctx); err != nil {
		t.Fatal(err)
	}

	inv, err := admin.Invite(ctx, "phone", client.InviteOptions{})
	if err != nil {
		t.Fatalf("Invite: %v", err)
	}
	if !regexp.MustCompile(`^[0-9A-Z]{5}-[0-9A-Z]{5}$`).MatchString(inv.Code) || inv.Household != "home" || inv.Device != "phone" ||
		inv.Scope != token.ScopeDevice || inv.Replace || !strings.HasPrefix(inv.URL, r.URL+"/") || !strings.Contains(inv.URL, inv.Code) {
		t.Fatalf("Invite: %+v", inv)
	}
	if exp, err := time.Parse(time.RFC3339Nano, inv.ExpiresAt); err != nil || !exp.After(time.Now()) {
		t.Errorf("expires_at %q (%v)", inv.ExpiresAt, err)
	}
	idPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := client.Pair(ctx, r.URL, inv.Code, client.PairOptions{IdentityKey: idPub})
	if err != nil {
		t.Fatalf("pairing with the code: %v", err)
	}
	phone, err := client.New(r.URL, creds.AccessToken, client.WithCodec(codec))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Invite(ctx, "tablet", client.InviteOptions{Scope: token.ScopeAdmin}); err != nil {
		t.Fatal(err)
	}

	list, err := admin.Invitations(ctx)
	if err != nil {
		t.Fatalf("Invitations: %v", err)
	}
	if len(list) != 2 {
		t.Fatalf("Invitations: %+v, want phone and tablet", list)
	}
	for _, e := range list {
		switch e.Device {
		case "phone":
			if e.RedeemedAt == "" || !bytes.Equal(e.IdentityKey, idPub) || e.Scope != token.ScopeDevice || e.CreatedBy != "admin" {
				t.Errorf("phone's invitation: %+v, want redeemed with its identity key", e)
			}
		case "tablet":
			if e.RedeemedAt != "" || e.IdentityKey != nil || e.Scope != token.ScopeAdmin || e.ExpiresAt == "" {
				t.Errorf("tablet's invitation: %+v, want pending, of scope admin", e)
			}
		default:
			t.Errorf("an invitation for %q", e.Device)
		}
	}
	if err := admin.CancelInvitation(ctx, "tablet"); err != nil {
		t.Fatalf("CancelInvitation: %v", err)
	}
	wantStatus(t, "CancelInvitation of nothing pending", admin.CancelInvitation(ctx, "tablet"), http.StatusNotFound)

	page, err := admin.Devices(ctx, client.DevicesQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Devices) != 2 || page.Devices[1].Device != "phone" || page.Devices[1].PushKind != "none" || page.Devices[1].LastSeen == "" {
		t.Fatalf("Devices: %+v, want admin and phone, phone without a push target", page.Devices)
	}

	// The name is in use: refused unless the invitation replaces it.
	_, err = admin.Invite(ctx, "phone", client.InviteOptions{})
	var e *client.Error
	if !errors.As(err, &e) || e.Status != http.StatusConflict || e.Code != "device_exists" {
		t.Errorf("Invite of a device in use: %v, want 409 device_exists", err)
	}
	if inv, err := admin.Invite(ctx, "phone", client.InviteOptions{Replace: true}); err != nil || !inv.Replace {
		t.Errorf("Invite with Replace: %+v, %v", inv, err)
	}

	// A device token may neither invite nor remove.
	_, err = phone.Invite(ctx, "watch", client.InviteOptions{})
	wantStatus(t, "a device token's Invite", err, http.StatusForbidden)
	wantStatus(t, "a device token's RemoveDevice", phone.RemoveDevice(ctx, "admin"), http.StatusForbidden)
	_, err = phone.Invitations(ctx)
	wantStatus(t, "a device token's Invitations", err, http.StatusForbidden)

	if err := admin.RemoveDevice(ctx, "phone"); err != nil {
		t.Fatalf("RemoveDevice: %v", err)
	}
	_, err = phone.Register(ctx)
	wantStatus(t, "the removed device's register", err, http.StatusUnauthorized)
	wantStatus(t, "RemoveDevice of no such device", admin.RemoveDevice(ctx, "phone"), http.StatusNotFound)
	if page, err := admin.Devices(ctx, client.DevicesQuery{}); err != nil || len(page.Devices) != 1 {
		t.Errorf("Devices after the removal: %+v, %v", page.Devices, err)
	}
}

func wantStatus(t *testing.T, what string, err error, status int) {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) || e.Status != status {
		t.Errorf("%s: %v, want a %d", what, err, status)
	}
}
