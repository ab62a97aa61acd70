package push

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/flamenet/relay/device"
)

// WakeBody is the whole body of every UnifiedPush push and the whole data
// of every FCM message: it says "poll", and nothing else.
const WakeBody = `{"wake":"1"}`

// unifiedPushTTL is how long a push service may keep a wake for an offline
// device (RFC 8030 TTL header); past it the next poll finds the envelopes.
const unifiedPushTTL = 24 * time.Hour

// unifiedPush POSTs WakeBody to the device's endpoint (RFC 8030 style):
// as Web Push, encrypted and VAPID-signed, when the registration carried
// the subscription's keys (the distributors that speak Web Push give
// them), and in the clear, as the first distributors take it, when not.
type unifiedPush struct {
	dialer *guardedDialer
	caller *caller
	web    *webPusher
}

func newUnifiedPush(cfg Config) *unifiedPush {
	d := newGuardedDialer(cfg.UnifiedPush.Resolver, cfg.AllowPrivate)
	tr := newTransport(cfg.UnifiedPush.RootCAs, cfg.ResponseHeaderTimeout)
	// No proxy: it would make the connection, and the address check in
	// the dialer would see only the proxy.
	tr.Proxy = nil
	tr.DialContext = d.DialContext
	c := newCaller(tr, cfg.AttemptTimeout)
	now := cfg.WebPush.Now
	if now == nil {
		now = time.Now
	}
	return &unifiedPush{dialer: d, caller: c, web: &webPusher{caller: c, vapid: cfg.WebPush.VAPID, now: now}}
}

func (u *unifiedPush) Push(ctx context.Context, endpoint string) error {
	if hasKeys(endpoint) {
		return u.web.push(ctx, endpoint, device.PushUnifiedPush)
	}
	if _, err := parseEndpoint(endpoint); err != nil {
		return err
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	wakeHeaders(h)
	a, err := u.caller.call(ctx, http.MethodPost, endpoint, []byte(WakeBody), h)
	if err != nil {
		return fmt.Errorf("unifiedpush: %w", err)
	}
	return answered(device.PushUnifiedPush, a)
}

func (u *unifiedPush) Close() { u.caller.close() }
