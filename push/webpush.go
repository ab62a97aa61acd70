package push

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/webpush"
)

// A Web Push target (kind webpush, or unifiedpush with keys) is one
// address: the endpoint, the subscription's p256dh and its auth, each in
// unpadded base64url, on three lines. No endpoint holds a line break
// (parseEndpoint takes printable ASCII only), so the split is exact.

// WebPushAddress is the address of a Web Push subscription.
func WebPushAddress(endpoint string, p256dh, auth []byte) string {
	enc := base64.RawURLEncoding
	return endpoint + "\n" + enc.EncodeToString(p256dh) + "\n" + enc.EncodeToString(auth)
}

// KeyError is a subscription key a registration gave that cannot be
// used, naming its field (p256dh or auth).
type KeyError struct {
	Field, Reason string
}

func (e *KeyError) Error() string { return "push: keys." + e.Field + " " + e.Reason }

// WebPushTarget is the address of a subscription as a browser's
// PushSubscription.toJSON() gives it (keys in base64url, padded or not),
// or a *KeyError naming the key that is wrong. The endpoint is checked
// with the target (CheckTarget), not here.
func WebPushTarget(endpoint, p256dh, auth string) (string, error) {
	dec := func(field, v string) ([]byte, error) {
		b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(v, "="))
		if err != nil {
			return nil, &KeyError{Field: field, Reason: "is not base64url"}
		}
		return b, nil
	}
	p, err := dec("p256dh", p256dh)
	if err != nil {
		return "", err
	}
	a, err := dec("auth", auth)
	if err != nil {
		return "", err
	}
	sub := webpush.Subscription{P256dh: p, Auth: a}
	switch {
	case !sub.P256dhOK():
		return "", &KeyError{Field: "p256dh", Reason: "must be a P-256 public key (65 bytes, uncompressed)"}
	case sub.Check() != nil:
		return "", &KeyError{Field: "auth", Reason: fmt.Sprintf("must be %d bytes", webpush.AuthSize)}
	}
	return WebPushAddress(endpoint, p, a), nil
}

// hasKeys says whether address carries a subscription's keys.
func hasKeys(address string) bool { return strings.Contains(address, "\n") }

// splitWebPush is WebPushAddress's inverse.
func splitWebPush(address string) (endpoint string, sub webpush.Subscription, err error) {
	parts := strings.Split(address, "\n")
	if len(parts) != 3 {
		return "", sub, fmt.Errorf("%w: not an endpoint with its keys", ErrInvalidTarget)
	}
	enc := base64.RawURLEncoding
	if sub.P256dh, err = enc.DecodeString(parts[1]); err != nil {
		return "", sub, fmt.Errorf("%w: p256dh is not base64url", ErrInvalidTarget)
	}
	if sub.Auth, err = enc.DecodeString(parts[2]); err != nil {
		return "", sub, fmt.Errorf("%w: auth is not base64url", ErrInvalidTarget)
	}
	if err := sub.Check(); err != nil {
		return "", sub, fmt.Errorf("%w: %w", ErrInvalidTarget, err)
	}
	return parts[0], sub, nil
}

// checkWebPush is the register-time check of a Web Push target.
func checkWebPush(ctx context.Context, address string, allowPrivate bool, r Resolver) error {
	endpoint, _, err := splitWebPush(address)
	if err != nil {
		return err
	}
	return checkEndpoint(ctx, endpoint, allowPrivate, r)
}

// webPusher sends Web Push (RFC 8030): the wake encrypted to the
// subscription (RFC 8291) and, when the relay has a VAPID key, signed for
// the push service (RFC 8292). It shares UnifiedPush's guarded transport.
type webPusher struct {
	caller *caller
	vapid  *webpush.VAPID // nil: no Authorization
	now    func() time.Time
}

func (w *webPusher) push(ctx context.Context, address, kind string) error {
	endpoint, sub, err := splitWebPush(address)
	if err != nil {
		return err
	}
	if _, err := parseEndpoint(endpoint); err != nil {
		return err
	}
	body, err := webpush.Encrypt(sub, []byte(WakeBody), 0)
	if err != nil {
		return err
	}
	h := http.Header{}
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Encoding", "aes128gcm")
	wakeHeaders(h)
	if w.vapid != nil {
		auth, err := w.vapid.Authorization(endpoint, w.now())
		if err != nil {
			return err
		}
		h.Set("Authorization", auth)
	}
	a, err := w.caller.call(ctx, http.MethodPost, endpoint, body, h)
	if err != nil {
		return fmt.Errorf("%s: %w", kind, err)
	}
	return answered(kind, a)
}

// wakeHeaders are RFC 8030's headers of a wake: kept a day for a device
// that is offline, delivered at once, and one pending per subscription
// (a newer wake replaces it).
func wakeHeaders(h http.Header) {
	h.Set("TTL", fmt.Sprint(int(unifiedPushTTL.Seconds())))
	h.Set("Urgency", "high")
	h.Set("Topic", "wake")
}

// answered is a push service's answer as the queue takes it: 2xx done,
// 404 and 410 gone, 429 and 5xx retried.
func answered(kind string, a answer) error {
	se := &statusError{from: kind, status: a.status}
	switch {
	case a.status >= 200 && a.status < 300:
		return nil
	case a.status == http.StatusNotFound || a.status == http.StatusGone:
		return fmt.Errorf("%w: %w", se, ErrGone)
	case retryable(a.status):
		return &RetryableError{Err: se, After: retryAfter(a.header, time.Now())}
	default:
		return se
	}
}

// webPushProvider is the webpush kind's provider.
type webPushProvider struct{ w *webPusher }

func (p webPushProvider) Push(ctx context.Context, address string) error {
	if !hasKeys(address) {
		return errors.New("webpush: a target without keys")
	}
	return p.w.push(ctx, address, device.PushWebPush)
}

// Close closes the idle connections it shares with UnifiedPush (closing
// twice is harmless).
func (p webPushProvider) Close() { p.w.caller.close() }
