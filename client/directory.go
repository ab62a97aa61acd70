package client

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// RegisterOption adds a field to a register's body; a field left out
// keeps what the relay stored (docs/PROTOCOL.md, POST /v1/register).
type RegisterOption func(*registerRequest)

type registerRequest struct {
	Push        *pushTarget `json:"push,omitempty" msgpack:"push,omitempty"`
	IdentityKey []byte      `json:"identity_key,omitempty" msgpack:"identity_key,omitempty"`
}

type pushTarget struct {
	Kind     string    `json:"kind" msgpack:"kind"`
	Endpoint string    `json:"endpoint,omitempty" msgpack:"endpoint,omitempty"`
	Alert    bool      `json:"alert,omitempty" msgpack:"alert,omitempty"`
	Keys     *pushKeys `json:"keys,omitempty" msgpack:"keys,omitempty"`
}

type pushKeys struct {
	P256dh string `json:"p256dh" msgpack:"p256dh"`
	Auth   string `json:"auth" msgpack:"auth"`
}

// WithIdentityKey publishes key (a device's Ed25519 identity, see package
// seal) in the household's directory, where other devices read it to
// seal envelopes to this one.
func WithIdentityKey(key ed25519.PublicKey) RegisterOption {
	return func(r *registerRequest) { r.IdentityKey = key }
}

// WithPushTarget sets where the relay sends a content-free wake-up:
// kind "unifiedpush" (endpoint a URL), "apns" (a device token), "fcm" (a
// registration token), or "none" (endpoint "") to clear it.
func WithPushTarget(kind, endpoint string) RegisterOption {
	return func(r *registerRequest) { r.Push = &pushTarget{Kind: kind, Endpoint: endpoint} }
}

// WithAPNsAlerts sets an APNs device token as the push target, with
// alert pushes (mutable-content) that the app's Notification Service
// Extension opens, instead of background pushes, which iOS delivers at
// its discretion and never to an app the user swiped away.
func WithAPNsAlerts(deviceToken string) RegisterOption {
	return func(r *registerRequest) { r.Push = &pushTarget{Kind: "apns", Endpoint: deviceToken, Alert: true} }
}

// WithWebPush sets a Web Push subscription as the push target: kind
// "webpush" (a browser's subscription), or "unifiedpush" from a
// distributor that speaks Web Push, whose wakes are then encrypted to
// the subscription and VAPID-signed. p256dh and auth are the
// subscription's keys in unpadded base64url, as PushSubscription.toJSON()
// and UnifiedPush connectors give them.
func WithWebPush(kind, endpoint, p256dh, auth string) RegisterOption {
	return func(r *registerRequest) {
		r.Push = &pushTarget{Kind: kind, Endpoint: endpoint, Keys: &pushKeys{P256dh: p256dh, Auth: auth}}
	}
}

// DirectoryEntry is one device of the household's directory.
type DirectoryEntry struct {
	Device string `json:"device" msgpack:"device"`
	// IdentityKey is the Ed25519 key the device registered, nil when it
	// registered none.
	IdentityKey []byte `json:"identity_key" msgpack:"identity_key"`
	// X25519Key is the relay's Montgomery form of IdentityKey. A client
	// that seals derives it from the key it pinned instead (package seal).
	X25519Key []byte `json:"x25519_key" msgpack:"x25519_key"`
	// PushKind is the kind of the device's push target ("unifiedpush",
	// "webpush", "apns", "fcm"), or "none"; the target itself is never shown.
	PushKind     string `json:"push_kind" msgpack:"push_kind"`
	RegisteredAt string `json:"registered_at" msgpack:"registered_at"`
	LastSeen     string `json:"last_seen" msgpack:"last_seen"`
}

// DevicesQuery is one directory page's parameters.
type DevicesQuery struct {
	After string // the page starts after this device name ("": at the start)
	Limit int    // devices per page, 1 to 1000 (0: the relay's default, 100)
}

// DevicesPage is one page of the directory, in device name order.
type DevicesPage struct {
	Devices []DirectoryEntry `json:"devices" msgpack:"devices"`
	// Next, when not "", is the After of the next page.
	Next string `json:"next" msgpack:"next"`
}

// Devices reads one page of the household's directory (GET /v1/devices).
func (c *Client) Devices(ctx context.Context, q DevicesQuery) (DevicesPage, error) {
	v := url.Values{}
	if q.After != "" {
		v.Set("after", q.After)
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	path := "/v1/devices"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var out DevicesPage
	err := c.do(ctx, c.requestTimeout, http.MethodGet, path, nil, http.StatusOK, &out)
	return out, err
}

// Directory reads every page of the household's directory.
func (c *Client) Directory(ctx context.Context) ([]DirectoryEntry, error) {
	var all []DirectoryEntry
	q := DevicesQuery{Limit: 1000}
	for {
		page, err := c.Devices(ctx, q)
		if err != nil {
			return nil, err
		}
		all = append(all, page.Devices...)
		if page.Next == "" {
			return all, nil
		}
		// Pages go forward in name order; a relay that says otherwise
		// would keep this loop reading for ever.
		if page.Next <= q.After {
			return nil, fmt.Errorf("client: directory page after %q names %q as the next", q.After, page.Next)
		}
		q.After = page.Next
	}
}
