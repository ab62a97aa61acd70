package relay

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/wire"
	"github.com/flamenet/relay/token"
)

// TestBadInput: every malformed request gets its 4xx and the protocol's JSON
// error, never a 5xx, and the relay keeps serving.
func TestBadInput(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxEnvelopeBytes = 1024; c.MaxRecipients = 3 })
	tok := h.register("home", "phone")
	h.register("home", "laptop")
	smallOrder := base64.StdEncoding.EncodeToString(make([]byte, 32))
	tooMany := `["a","b","c","d"]`

	tests := []struct {
		name, method, path, body string
		header                   []string
		tok                      string
		status                   int
		code                     string
	}{
		{name: "send malformed json", method: "POST", path: "/v1/send", body: `{"id":`, status: 400, code: codeBadRequest},
		{name: "send trailing data", method: "POST", path: "/v1/send", body: `{"id":"a","to":["phone"],"payload":"eA=="} {}`, status: 400, code: codeBadRequest},
		{name: "send not an object", method: "POST", path: "/v1/send", body: `[1,2]`, status: 400, code: codeBadRequest},
		{name: "send id wrong type", method: "POST", path: "/v1/send", body: `{"id":5,"to":["phone"],"payload":"eA=="}`, status: 400, code: codeBadRequest},
		{name: "send to wrong type", method: "POST", path: "/v1/send", body: `{"id":"a","to":"phone","payload":"eA=="}`, status: 400, code: codeBadRequest},
		{name: "send payload not base64", method: "POST", path: "/v1/send", body: `{"id":"a","to":["phone"],"payload":"%%%"}`, status: 400, code: codeBadRequest},
		{name: "send payload number", method: "POST", path: "/v1/send", body: `{"id":"a","to":["phone"],"payload":7}`, status: 400, code: codeBadRequest},
		{name: "send empty body", method: "POST", path: "/v1/send", body: ``, status: 400, code: codeBadRequest},
		{name: "send no id", method: "POST", path: "/v1/send", body: `{"to":["phone"],"payload":"eA=="}`, status: 400, code: codeBadRequest},
		{name: "send id too long", method: "POST", path: "/v1/send", body: `{"id":"` + strings.Repeat("a", 129) + `","to":["phone"],"payload":"eA=="}`, status: 400, code: codeBadRequest},
		{name: "send id not printable", method: "POST", path: "/v1/send", body: `{"id":"a\u0001","to":["phone"],"payload":"eA=="}`, status: 400, code: codeBadRequest},
		{name: "send id not ascii", method: "POST", path: "/v1/send", body: `{"id":"é","to":["phone"],"payload":"eA=="}`, status: 400, code: codeBadRequest},
		{name: "send no recipients", method: "POST", path: "/v1/send", body: `{"id":"a","to":[],"payload":"eA=="}`, status: 400, code: codeBadRequest},
		{name: "send too many recipients", method: "POST", path: "/v1/send", body: `{"id":"a","to":` + tooMany + `,"payload":"eA=="}`, status: 400, code: codeBadRequest},
		{name: "send bad recipient name", method: "POST", path: "/v1/send", body: `{"id":"a","to":["ph one"],"payload":"eA=="}`, status: 400, code: codeBadRequest},
		{name: "send empty payload", method: "POST", path: "/v1/send", body: `{"id":"a","to":["phone"],"payload":""}`, status: 400, code: codeBadRequest},
		{name: "send payload over limit", method: "POST", path: "/v1/send", body: `{"id":"a","to":["phone"],"payload":"` + base64.StdEncoding.EncodeToString(make([]byte, 1025)) + `"}`, status: 413, code: codePayloadTooLarge},
		{name: "send body over limit", method: "POST", path: "/v1/send", body: `{"id":"a","to":["phone"],"pad":"` + strings.Repeat("x", 64<<10) + `"}`, status: 413, code: codePayloadTooLarge},
		{name: "send bad msgpack", method: "POST", path: "/v1/send", body: "\x81\xa2id", header: []string{"Content-Type", wire.ContentMsgpack}, status: 400, code: codeBadRequest},
		{name: "send msgpack wrong type", method: "POST", path: "/v1/send", body: string(msgpackBody(t, map[string]any{"id": 1, "to": []string{"phone"}, "payload": []byte("x")})), header: []string{"Content-Type", wire.ContentMsgpack}, status: 400, code: codeBadRequest},
		{name: "register bad identity key", method: "POST", path: "/v1/register", body: `{"identity_key":"AAAA"}`, status: 400, code: codeBadRequest},
		{name: "register small-order identity key", method: "POST", path: "/v1/register", body: `{"identity_key":"` + smallOrder + `"}`, status: 400, code: codeBadRequest},
		{name: "register unknown push kind", method: "POST", path: "/v1/register", body: `{"push":{"kind":"pigeon"}}`, status: 400, code: codeBadRequest},
		{name: "register push not a url", method: "POST", path: "/v1/register", body: `{"push":{"kind":"unifiedpush","endpoint":"ftp://x"}}`, status: 400, code: codeBadRequest},
		{name: "register push with credentials", method: "POST", path: "/v1/register", body: `{"push":{"kind":"unifiedpush","endpoint":"https://u:p@push.example/x"}}`, status: 400, code: codeBadRequest},
		{name: "register apns not hex", method: "POST", path: "/v1/register", body: `{"push":{"kind":"apns","endpoint":"zz"}}`, status: 400, code: codeBadRequest},
		{name: "register push wrong type", method: "POST", path: "/v1/register", body: `{"push":"yes"}`, status: 400, code: codeBadRequest},
		{name: "register oversize body", method: "POST", path: "/v1/register", body: `{"x":"` + strings.Repeat("x", 20<<10) + `"}`, status: 413, code: codePayloadTooLarge},
		{name: "ack no cursor", method: "POST", path: "/v1/ack", body: `{}`, status: 400, code: codeBadRequest},
		{name: "ack negative cursor", method: "POST", path: "/v1/ack", body: `{"cursor":-1}`, status: 400, code: codeBadRequest},
		{name: "ack fractional cursor", method: "POST", path: "/v1/ack", body: `{"cursor":1.5}`, status: 400, code: codeBadRequest},
		{name: "ack huge cursor", method: "POST", path: "/v1/ack", body: `{"cursor":9223372036854775808}`, status: 400, code: codeBadRequest},
		{name: "ack cursor ahead", method: "POST", path: "/v1/ack", body: `{"cursor":3}`, status: 409, code: codeCursorAhead},
		{name: "poll cursor negative", method: "GET", path: "/v1/poll?cursor=-1", status: 400, code: codeBadRequest},
		{name: "poll cursor plus sign", method: "GET", path: "/v1/poll?cursor=+1", status: 400, code: codeBadRequest},
		{name: "poll cursor not a number", method: "GET", path: "/v1/poll?cursor=abc", status: 400, code: codeBadRequest},
		{name: "poll cursor overflow", method: "GET", path: "/v1/poll?cursor=9223372036854775808", status: 400, code: codeBadRequest},
		{name: "poll cursor empty", method: "GET", path: "/v1/poll?cursor=", status: 400, code: codeBadRequest},
		{name: "poll cursor twice", method: "GET", path: "/v1/poll?cursor=0&cursor=1", status: 400, code: codeBadRequest},
		{name: "poll wait too long", method: "GET", path: "/v1/poll?wait=61", status: 400, code: codeBadRequest},
		{name: "poll wait fractional", method: "GET", path: "/v1/poll?wait=1.5", status: 400, code: codeBadRequest},
		{name: "poll limit zero", method: "GET", path: "/v1/poll?limit=0", status: 400, code: codeBadRequest},
		{name: "poll limit too big", method: "GET", path: "/v1/poll?limit=1001", status: 400, code: codeBadRequest},
		{name: "poll bad query encoding", method: "GET", path: "/v1/poll?cursor=%zz", status: 400, code: codeBadRequest},
		{name: "devices limit too big", method: "GET", path: "/v1/devices?limit=5000", status: 400, code: codeBadRequest},
		{name: "devices bad after", method: "GET", path: "/v1/devices?after=%2F", status: 400, code: codeBadRequest},
		{name: "unknown endpoint", method: "GET", path: "/v1/nope", status: 404, code: codeNotFound},
		{name: "wrong method", method: "GET", path: "/v1/send", status: 405, code: codeBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.must(tt.method, tt.path, tok, tt.body, tt.status, tt.header...)
			if got := r.errCode(t); got != tt.code {
				t.Fatalf("code = %q, want %q", got, tt.code)
			}
			if ct := r.header.Get("Content-Type"); ct != wire.ContentJSON {
				t.Fatalf("content type %q", ct)
			}
		})
	}
	// Still serving, and nothing was stored by any of the above.
	if p := h.poll(tok, ""); len(p.Envelopes) != 0 {
		t.Fatalf("bad sends stored envelopes: %+v", p)
	}
}

// TestTokenFailures: every token failure is the same 401 with
// WWW-Authenticate; a bad name in a validly signed token is a 400.
func TestTokenFailures(t *testing.T) {
	h := newHarness(t, nil)
	now := time.Now()
	valid := token.Claims{Household: "home", Device: "phone", IssuedAt: now, Expires: now.Add(time.Hour)}
	with := func(f func(*token.Claims)) string { c := valid; f(&c); return h.mint(c) }
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	wrongKey, _ := token.Mint(otherKey, valid)
	enc := base64.RawURLEncoding
	claims, _ := json.Marshal(map[string]any{"hh": "home", "sub": "phone", "exp": now.Add(time.Hour).Unix()})
	unsigned := func(alg string) string {
		return enc.EncodeToString([]byte(`{"alg":"`+alg+`","typ":"JWT"}`)) + "." + enc.EncodeToString(claims)
	}
	mac := hmac.New(sha256.New, []byte("secret"))
	mac.Write([]byte(unsigned("HS256")))
	good := h.mint(valid)
	parts := strings.Split(good, ".")
	tampered := parts[0] + "." + enc.EncodeToString([]byte(`{"hh":"home","sub":"laptop","exp":9999999999}`)) + "." + parts[2]
	// signed is a validly signed token with these claims, even ones Mint
	// refuses to write.
	signed := func(claims string) string {
		s := enc.EncodeToString([]byte(`{"alg":"EdDSA","typ":"JWT"}`)) + "." + enc.EncodeToString([]byte(claims))
		return s + "." + enc.EncodeToString(ed25519.Sign(h.key, []byte(s)))
	}
	exp := now.Add(time.Hour).Unix()

	tests := []struct {
		name, auth string
		status     int
	}{
		{"no header", "", 401},
		{"not bearer", "Basic " + good, 401},
		{"alg none", "Bearer " + unsigned("none") + ".", 401},
		{"HS256", "Bearer " + unsigned("HS256") + "." + enc.EncodeToString(mac.Sum(nil)), 401},
		{"wrong key", "Bearer " + wrongKey, 401},
		{"expired", "Bearer " + with(func(c *token.Claims) { c.Expires = now.Add(-2 * time.Minute) }), 401},
		{"future nbf", "Bearer " + with(func(c *token.Claims) { c.NotBefore = now.Add(2 * time.Minute) }), 401},
		{"tampered", "Bearer " + tampered, 401},
		{"oversize", "Bearer " + with(func(c *token.Claims) { c.Device = strings.Repeat("a", 4096) }), 401},
		{"garbage", "Bearer not.a.token", 401},
		{"bad household name", "Bearer " + with(func(c *token.Claims) { c.Household = "a/b" }), 400},
		{"device name too long", "Bearer " + with(func(c *token.Claims) { c.Device = strings.Repeat("a", 65) }), 400},
		{"empty household name", "Bearer " + signed(fmt.Sprintf(`{"hh":"","sub":"phone","exp":%d}`, exp)), 400},
		{"empty device name", "Bearer " + signed(fmt.Sprintf(`{"hh":"home","sub":"","exp":%d}`, exp)), 400},
		{"no household", "Bearer " + signed(fmt.Sprintf(`{"sub":"phone","exp":%d}`, exp)), 401},
		{"iat far ahead", "Bearer " + with(func(c *token.Claims) { c.IssuedAt = now.Add(time.Hour) }), 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, ep := range []struct{ method, path, body string }{
				{"GET", "/v1/poll", ""}, {"POST", "/v1/send", `{"id":"a","to":["phone"],"payload":"eA=="}`}, {"POST", "/v1/register", ""},
			} {
				var header []string
				if tt.auth != "" {
					header = []string{"Authorization", tt.auth}
				}
				r := h.must(ep.method, ep.path, "", ep.body, tt.status, header...)
				want := codeUnauthorized
				if tt.status == 400 {
					want = codeBadRequest
				} else if r.header.Get("WWW-Authenticate") == "" {
					t.Fatalf("%s: 401 without WWW-Authenticate", ep.path)
				}
				if got := r.errCode(t); got != want {
					t.Fatalf("%s: code %q, want %q", ep.path, got, want)
				}
			}
		})
	}
	h.must("GET", "/v1/poll", good, nil, http.StatusOK)
}

// TestBadBase64NamesTheField: a field of bytes that is not base64 is a
// 400 whose message names the field, for each request that has one.
func TestBadBase64NamesTheField(t *testing.T) {
	h := newHarness(t, nil)
	tok := h.register("home", "phone")
	for path, body := range map[string]string{
		"/v1/send":     `{"id":"a","to":["phone"],"payload":"not base64!"}`,
		"/v1/register": `{"identity_key":"not base64!"}`,
	} {
		var e errorBody
		h.must("POST", path, tok, body, http.StatusBadRequest).json(t, &e)
		field := map[string]string{"/v1/send": `"payload"`, "/v1/register": `"identity_key"`}[path]
		if !strings.Contains(e.Message, field) || !strings.Contains(e.Message, "base64") {
			t.Errorf("%s: message %q does not name %s as not base64", path, e.Message, field)
		}
	}
}
