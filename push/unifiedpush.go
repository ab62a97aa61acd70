package push

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"
)

// WakeBody is the whole body of every UnifiedPush push and the whole data
// of every FCM message: it says "poll", and nothing else.
const WakeBody = `{"wake":"1"}`

// unifiedPushTTL is how long a push service may keep a wake for an offline
// device (RFC 8030 TTL header); past it the next poll finds the envelopes.
const unifiedPushTTL = 24 * time.Hour

// unifiedPush POSTs WakeBody to the device's endpoint (RFC 8030 style).
type unifiedPush struct {
	dialer    *guardedDialer
	transport *http.Transport
	client    *http.Client
}

func newUnifiedPush(cfg Config) *unifiedPush {
	d := newGuardedDialer(cfg.UnifiedPush.Resolver, cfg.AllowPrivate)
	tr := newTransport(cfg.UnifiedPush.RootCAs)
	// No proxy: it would make the connection, and the address check in
	// the dialer would see only the proxy.
	tr.Proxy = nil
	tr.DialContext = d.DialContext
	return &unifiedPush{dialer: d, transport: tr, client: newClient(tr)}
}

func (u *unifiedPush) Push(ctx context.Context, endpoint string) error {
	if _, err := parseEndpoint(endpoint); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader([]byte(WakeBody)))
	if err != nil {
		return fmt.Errorf("unifiedpush: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("TTL", fmt.Sprint(int(unifiedPushTTL.Seconds())))
	req.Header.Set("Urgency", "high")
	// One pending wake per subscription is enough: a newer one replaces it.
	req.Header.Set("Topic", "wake")
	resp, err := u.client.Do(req)
	if err != nil {
		return fmt.Errorf("unifiedpush: %w", err)
	}
	readBody(resp)
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return fmt.Errorf("unifiedpush: status %d: %w", resp.StatusCode, ErrGone)
	case retryable(resp.StatusCode):
		return &RetryableError{
			Err:   fmt.Errorf("unifiedpush: status %d", resp.StatusCode),
			After: retryAfter(resp.Header, time.Now()),
		}
	default:
		return fmt.Errorf("unifiedpush: status %d", resp.StatusCode)
	}
}

func (u *unifiedPush) Close() { u.transport.CloseIdleConnections() }
