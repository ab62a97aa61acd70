package relay

import (
	"context"
	"crypto/ecdh"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/flamenet/relay/internal/webpush"
	"github.com/flamenet/relay/push"
)

// TestRegisterWebPush: a browser's PushSubscription.toJSON() registers as
// is (expirationTime and all) for kind webpush, and as UnifiedPush's Web
// Push with keys; a p256dh that is not a P-256 point, a short auth, no
// keys, or a private endpoint is a 400 naming the field; the relay serves
// its VAPID public key, and 404 when it sends no Web Push.
func TestRegisterWebPush(t *testing.T) {
	h := newHarness(t, func(c *Config) {})
	key, _ := webpush.GenerateVAPIDKey()
	vapid, err := webpush.NewVAPID(key, "mailto:ops@relay.example")
	if err != nil {
		t.Fatal(err)
	}
	q, err := push.New(push.Config{WebPush: push.WebPushConfig{VAPID: vapid}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close(context.Background())
	h.srv.push = q
	tok := h.token("home", "browser")

	h.must("GET", "/v1/push/vapid", "", nil, http.StatusNotFound) // the relay was not told its key
	h.srv.cfg.VAPIDPublicKey = vapid.PublicKey()
	var got struct {
		PublicKey string `json:"public_key"`
	}
	h.must("GET", "/v1/push/vapid", "", nil, http.StatusOK).json(t, &got)
	if got.PublicKey != vapid.PublicKey() {
		t.Errorf("public_key %q, want %q", got.PublicKey, vapid.PublicKey())
	}

	ua, _ := ecdh.P256().GenerateKey(nil)
	enc := base64.RawURLEncoding
	p256dh, auth := enc.EncodeToString(ua.PublicKey().Bytes()), enc.EncodeToString(make([]byte, 16))
	offCurve := []byte(ua.PublicKey().Bytes())
	offCurve[64] ^= 1
	sub := func(kind, endpoint, p, a string) string {
		return `{"push":{"kind":"` + kind + `","endpoint":"` + endpoint + `","expirationTime":null,"keys":{"p256dh":"` + p + `","auth":"` + a + `"}}}`
	}
	for _, kind := range []string{"webpush", "unifiedpush"} {
		h.must("POST", "/v1/register", tok, sub(kind, "https://93.184.216.34/push/abc", p256dh, auth), http.StatusOK)
	}
	for _, tc := range []struct{ name, body, field string }{
		{"p256dh off the curve", sub("webpush", "https://93.184.216.34/p", enc.EncodeToString(offCurve), auth), "push.keys.p256dh"},
		{"p256dh not base64url", sub("webpush", "https://93.184.216.34/p", "not base64!", auth), "push.keys.p256dh"},
		{"short auth", sub("webpush", "https://93.184.216.34/p", p256dh, enc.EncodeToString(make([]byte, 15))), "push.keys.auth"},
		{"no keys", `{"push":{"kind":"webpush","endpoint":"https://93.184.216.34/p"}}`, "push.keys"},
		{"private endpoint", sub("webpush", "http://127.0.0.1:9/p", p256dh, auth), "push.endpoint"},
		{"a line break in the endpoint", sub("webpush", `https://93.184.216.34/p\n`+p256dh+`\n`+auth, p256dh, auth), "push.endpoint"},
		{"keys on apns", `{"push":{"kind":"apns","endpoint":"` + strings.Repeat("ab", 32) + `","keys":{"p256dh":"x","auth":"y"}}}`, "push."},
	} {
		r := h.must("POST", "/v1/register", tok, tc.body, http.StatusBadRequest)
		if r.errCode(t) != codeBadRequest || !strings.Contains(string(r.body), tc.field) {
			t.Errorf("%s: %s, want a 400 naming %s", tc.name, r.body, tc.field)
		}
	}
}
