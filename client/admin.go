package client

import (
	"context"
	"net/http"
	"net/url"
)

// The calls of an admin device (a token of scope admin); any other token
// gets a *Error of status 403. They mirror the TypeScript client's invite,
// invitations, cancelInvitation and removeDevice.

// InviteOptions are Invite's optional settings.
type InviteOptions struct {
	// Scope is the paired device's tokens' scope: "device" (also when
	// empty) or "admin".
	Scope string
	// Replace lets the name be a device's already: redeeming the
	// invitation removes that device first.
	Replace bool
}

type invitationRequest struct {
	Device  string `json:"device" msgpack:"device"`
	Scope   string `json:"scope,omitempty" msgpack:"scope,omitempty"`
	Replace bool   `json:"replace,omitempty" msgpack:"replace,omitempty"`
}

// Invitation is a new invitation (POST /v1/invitations' answer).
type Invitation struct {
	// Code is single use, and shown only here: the new device redeems it
	// with Pair.
	Code string `json:"code" msgpack:"code"`
	// URL is the pairing link: <base>/pair/#code=<code>&household=<household>
	// for a device (the relay's page, which hands the code to the app),
	// <base>/console/#pair=<code>&household=<household>&scope=admin for an
	// admin (the console).
	URL       string `json:"url" msgpack:"url"`
	Household string `json:"household" msgpack:"household"`
	Device    string `json:"device" msgpack:"device"`
	Scope     string `json:"scope" msgpack:"scope"`
	Replace   bool   `json:"replace" msgpack:"replace"`
	ExpiresAt string `json:"expires_at" msgpack:"expires_at"`
}

// InvitationEntry is one invitation of the household's list: pending, or
// redeemed in the last day. Its code is never shown again.
type InvitationEntry struct {
	Device    string `json:"device" msgpack:"device"`
	Scope     string `json:"scope" msgpack:"scope"`
	ExpiresAt string `json:"expires_at" msgpack:"expires_at"`
	// RedeemedAt is "" while pending.
	RedeemedAt string `json:"redeemed_at" msgpack:"redeemed_at"`
	// IdentityKey is the key the device gave when pairing, for the admin
	// to compare its fingerprint with the device's; nil while pending.
	IdentityKey []byte `json:"identity_key" msgpack:"identity_key"`
	Replace     bool   `json:"replace" msgpack:"replace"`
	// CreatedBy is the device whose admin token made it.
	CreatedBy string `json:"created_by" msgpack:"created_by"`
}

// Invite invites a device of the token's household (POST
// /v1/invitations). Inviting a device again replaces its unredeemed code.
// A device of that name that exists is a *Error of status 409
// (device_exists) unless opts.Replace.
func (c *Client) Invite(ctx context.Context, device string, opts InviteOptions) (Invitation, error) {
	var out Invitation
	err := c.do(ctx, c.requestTimeout, http.MethodPost, "/v1/invitations",
		invitationRequest{Device: device, Scope: opts.Scope, Replace: opts.Replace}, http.StatusCreated, &out)
	return out, err
}

// Invitations lists the household's pending invitations and those
// redeemed in the last day (GET /v1/invitations).
func (c *Client) Invitations(ctx context.Context) ([]InvitationEntry, error) {
	var out struct {
		Invitations []InvitationEntry `json:"invitations" msgpack:"invitations"`
	}
	err := c.do(ctx, c.requestTimeout, http.MethodGet, "/v1/invitations", nil, http.StatusOK, &out)
	return out.Invitations, err
}

// CancelInvitation cancels device's pending invitation (DELETE
// /v1/invitations/{device}): its code no longer pairs. A *Error of status
// 404 when none is pending.
func (c *Client) CancelInvitation(ctx context.Context, device string) error {
	return c.do(ctx, c.requestTimeout, http.MethodDelete, "/v1/invitations/"+url.PathEscape(device), nil, http.StatusNoContent, nil)
}

// RemoveDevice removes a device of the token's household (DELETE
// /v1/devices/{device}): its pending envelopes, renewal secret and
// invitations go, its held polls end and its tokens issued before now are
// refused. A *Error of status 404 when there is no such device.
func (c *Client) RemoveDevice(ctx context.Context, device string) error {
	return c.do(ctx, c.requestTimeout, http.MethodDelete, "/v1/devices/"+url.PathEscape(device), nil, http.StatusNoContent, nil)
}
