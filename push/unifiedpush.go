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

// unifiedPush POSTs WakeBody to the device's endpoint (RFC 8030 style).
type unifiedPush struct {
	dialer *guardedDialer
	caller *caller
}

func newUnifiedPush(cfg Config) *unifiedPush {
	d := newGuardedDialer(cfg.UnifiedPush.Resolver, cfg.AllowPrivate)
	tr := newTransport(cfg.UnifiedPush.RootCAs, cfg.ResponseHeaderTimeout)
	// No proxy: it would make the connection, and the address check in
	// the dialer would see only the proxy.
	tr.Proxy = nil
	tr.DialContext = d.DialContext
	return &unifiedPush{dialer: d, caller: newCaller(tr, cfg.AttemptTimeout)}
}

func (u *unifiedPush) Push(ctx context.Context, endpoint string) error {
	if _, err := parseEndpoint(endpoint); err != nil {
		return err
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("TTL", fmt.Sprint(int(unifiedPushTTL.Seconds())))
	h.Set("Urgency", "high")
	// One pending wake per subscription is enough: a newer one replaces it.
	h.Set("Topic", "wake")
	a, err := u.caller.call(ctx, http.MethodPost, endpoint, []byte(WakeBody), h)
	if err != nil {
		return fmt.Errorf("unifiedpush: %w", err)
	}
	se := &statusError{from: device.PushUnifiedPush, status: a.status}
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

func (u *unifiedPush) Close() { u.caller.close() }
