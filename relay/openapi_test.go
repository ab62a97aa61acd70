package relay

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/flamenet/relay/internal/pairing"
	"github.com/flamenet/relay/internal/webpush"
	"github.com/flamenet/relay/internal/wire"
	"github.com/flamenet/relay/push"
	"github.com/flamenet/relay/token"
)

const openapiPath = "../docs/openapi.yaml"

// loadOpenAPI loads docs/openapi.yaml and validates it as an OpenAPI 3.1
// document.
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(openapiPath)
	if err != nil {
		t.Fatalf("loading %s: %v", openapiPath, err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("%s is OpenAPI %s, want 3.1", openapiPath, doc.OpenAPI)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("%s is not a valid OpenAPI document: %v", openapiPath, err)
	}
	return doc
}

// TestOpenAPIValid: the document is OpenAPI 3.1 and valid, its schemas'
// patterns and types included. A misspelt type ("strin") and a broken
// pattern each turned it red.
func TestOpenAPIValid(t *testing.T) {
	loadOpenAPI(t)
}

// TestOpenAPIRoutes: every route the relay's router serves is in the
// document, and every operation the document lists is served. Adding a
// route to relay/server.go without documenting it turned this red.
func TestOpenAPIRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	h := newHarness(t, nil)
	var served []string
	err := chi.Walk(h.srv.router(nil), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		served = append(served, method+" "+route)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	slices.Sort(served)
	slices.Sort(documented)
	for _, r := range served {
		if !slices.Contains(documented, r) {
			t.Errorf("the relay serves %s, which %s does not document", r, openapiPath)
		}
	}
	for _, r := range documented {
		if !slices.Contains(served, r) {
			t.Errorf("%s documents %s, which the relay does not serve", openapiPath, r)
		}
	}
	if len(served) == 0 {
		t.Fatal("walked no routes")
	}
}

// TestOpenAPIStatuses drives real requests at relays on SQLite until every
// response status the document lists for every operation has been
// produced, and checks each answer against the document: its status is
// listed for the operation, its Content-Type is one listed for that status,
// its body validates against the listed schema (MessagePack bodies too,
// against the same schema, with bin fields read as base64), and the
// headers marked required are there and valid. Removing the 403 from
// DELETE /v1/devices/{device} in the document turned this red ("answered
// 403, which the document does not list"), and so did listing a 404 for
// GET /v1/poll ("documented but never produced").
func TestOpenAPIStatuses(t *testing.T) {
	doc := loadOpenAPI(t)
	c := &statusCheck{t: t, doc: doc, seen: map[string]map[int]bool{}}

	h := newHarness(t, nil)
	// Sends may be refused by the global bucket (two sends, never
	// refilled) and by a recipient's pending limit (one envelope); polls
	// by the held-poll cap (one).
	tight := newHarness(t, func(c *Config) {
		c.SendBurst, c.SendRate = 2, 1e-9
		c.HouseholdSendBurst, c.HouseholdSendRate = 100, 100
		c.MaxPendingEnvelopes = 1
		c.MaxHeldPolls = 1
	})
	// A device's poll bucket holds one poll that does not move its cursor.
	polls := newHarness(t, func(c *Config) { c.DevicePollBurst, c.DevicePollRate = 1, 1e-9 })
	// Every store call runs out of time: 503 unavailable.
	slow := newHarness(t, func(c *Config) { c.StoreTimeout = time.Nanosecond })
	// The store's database is closed under the relay: an error the relay
	// cannot name, 500 internal, and /ready says 503.
	// Streams end at once, so that their answers can be read whole.
	streams := newHarness(t, func(c *Config) { c.StreamLife = time.Millisecond })
	broken := newHarness(t, nil)
	if err := broken.db.Close(); err != nil {
		t.Fatal(err)
	}

	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// Tokens are minted per call by the harness that serves it, from the
	// device named; this one is minted before its device's removal.
	const phone, laptop, admin = "phone", "laptop", "admin"
	removedLaptop := h.token("home", laptop)
	asMsgpack := []string{"Content-Type", "application/msgpack", "Accept", "application/msgpack"}
	wantMsgpack := []string{"Accept", "application/msgpack"}
	send := func(id string, payload []byte, to ...string) map[string]any {
		return map[string]any{"id": id, "to": to, "payload": payload}
	}
	big := func(n int) string { return `{"pad":"` + strings.Repeat("x", n) + `"}` }

	for _, r := range []call{
		{h: h, op: "GET /live", status: 200},
		{h: h, op: "GET /ready", status: 200},
		{h: broken, op: "GET /ready", status: 503, code: codeUnavailable},
		{h: h, op: "HEAD /live", status: 200},
		{h: h, op: "HEAD /ready", status: 200},
		{h: broken, op: "HEAD /ready", status: 503},

		{h: h, op: "POST /v1/register", dev: phone, body: map[string]any{"identity_key": []byte(pub)}, status: 200},
		{h: h, op: "POST /v1/register", dev: laptop, body: msgpackBody(t, map[string]any{"identity_key": []byte(pub)}), header: asMsgpack, status: 200},
		{h: h, op: "POST /v1/register", dev: phone, body: `{"push":{"kind":"pigeon"}}`, status: 400, code: codeBadRequest},
		{h: h, op: "POST /v1/register", dev: "bad name", status: 400, code: codeBadRequest},
		{h: h, op: "POST /v1/register", status: 401, code: codeUnauthorized},
		{h: h, op: "POST /v1/register", tok: "x.y.z", header: wantMsgpack, status: 401, code: codeUnauthorized},
		{h: h, op: "POST /v1/register", dev: phone, body: big(17 << 10), status: 413, code: codePayloadTooLarge},
		{h: broken, op: "POST /v1/register", dev: phone, status: 500, code: codeInternal},
		{h: slow, op: "POST /v1/register", dev: phone, status: 503, code: codeUnavailable},

		{h: h, op: "POST /v1/send", dev: laptop, body: send("m1", []byte("one"), "phone", "laptop"), status: 202},
		{h: h, op: "POST /v1/send", dev: laptop, body: send("m1", []byte("one"), "laptop", "phone"), status: 202},
		{h: h, op: "POST /v1/send", dev: laptop, body: msgpackBody(t, send("m2", []byte("two"), "phone")), header: asMsgpack, status: 202},
		{h: h, op: "POST /v1/send", dev: laptop, body: send("", []byte("x"), "phone"), status: 400, code: codeBadRequest},
		{h: h, op: "POST /v1/send", body: send("m3", []byte("x"), "phone"), status: 401, code: codeUnauthorized},
		{h: h, op: "POST /v1/send", dev: laptop, body: send("m3", []byte("x"), "phone", "ghost"), status: 404, code: codeUnknownDevice},
		{h: h, op: "POST /v1/send", dev: laptop, body: send("m1", []byte("other"), "phone", "laptop"), status: 409, code: codeIDConflict},
		{h: h, op: "POST /v1/send", dev: laptop, body: send("m3", make([]byte, DefaultConfig().MaxEnvelopeBytes+1), "phone"), status: 413, code: codePayloadTooLarge},
		{h: tight, op: "POST /v1/register", dev: phone, status: 200},
		{h: tight, op: "POST /v1/send", dev: phone, body: send("t1", []byte("x"), "phone"), status: 202},
		{h: tight, op: "POST /v1/send", dev: phone, body: send("t2", []byte("x"), "phone"), status: 429, code: codeQueueFull, limit: limitDevicePending},
		{h: tight, op: "POST /v1/send", dev: phone, body: send("t3", []byte("x"), "phone"), status: 429, code: codeRateLimited, limit: limitSendRate},
		{h: broken, op: "POST /v1/send", dev: phone, body: send("b1", []byte("x"), "phone"), status: 500, code: codeInternal},
		{h: slow, op: "POST /v1/send", dev: phone, body: send("s1", []byte("x"), "phone"), status: 503, code: codeUnavailable},

		{h: h, op: "GET /v1/poll", path: "/v1/poll?cursor=0", dev: phone, status: 200},
		{h: h, op: "GET /v1/poll", path: "/v1/poll?cursor=1&limit=1", dev: phone, header: wantMsgpack, status: 200},
		{h: h, op: "GET /v1/poll", path: "/v1/poll?cursor=2&wait=1", dev: phone, status: 200},
		{h: h, op: "GET /v1/poll", path: "/v1/poll?wait=abc", dev: phone, status: 400, code: codeBadRequest},
		{h: h, op: "GET /v1/poll", path: "/v1/poll?cursor=1&cursor=2", dev: phone, status: 400, code: codeBadRequest},
		{h: h, op: "GET /v1/poll", path: "/v1/poll", status: 401, code: codeUnauthorized},
		{h: h, op: "GET /v1/poll", path: "/v1/poll?cursor=999", dev: phone, status: 409, code: codeCursorAhead},
		{h: polls, op: "GET /v1/poll", path: "/v1/poll?cursor=0", dev: phone, status: 200},
		{h: polls, op: "GET /v1/poll", path: "/v1/poll?cursor=0", dev: phone, status: 429, code: codeRateLimited, limit: limitDevicePollRate},
		{h: broken, op: "GET /v1/poll", path: "/v1/poll", dev: phone, status: 500, code: codeInternal},
		{h: slow, op: "GET /v1/poll", path: "/v1/poll", dev: phone, status: 503, code: codeUnavailable},

		{h: streams, op: "GET /v1/stream", dev: phone, status: 200},
		{h: streams, op: "GET /v1/stream", dev: phone, header: []string{"Accept", contentNDJSON}, status: 200},
		{h: h, op: "GET /v1/stream", path: "/v1/stream?cursor=abc", dev: phone, status: 400, code: codeBadRequest},
		{h: h, op: "GET /v1/stream", status: 401, code: codeUnauthorized},
		{h: h, op: "GET /v1/stream", path: "/v1/stream?cursor=999", dev: phone, status: 409, code: codeCursorAhead},
		{h: polls, op: "GET /v1/stream", path: "/v1/stream?cursor=0", dev: phone, status: 429, code: codeRateLimited, limit: limitDevicePollRate},
		{h: broken, op: "GET /v1/stream", dev: phone, status: 500, code: codeInternal},
		{h: slow, op: "GET /v1/stream", dev: phone, status: 503, code: codeUnavailable},

		{h: h, op: "POST /v1/ack", dev: laptop, body: `{"cursor":1}`, status: 204},
		{h: h, op: "POST /v1/ack", dev: laptop, body: `{}`, status: 400, code: codeBadRequest},
		{h: h, op: "POST /v1/ack", body: `{"cursor":1}`, status: 401, code: codeUnauthorized},
		{h: h, op: "POST /v1/ack", dev: laptop, body: `{"cursor":999}`, status: 409, code: codeCursorAhead},
		{h: h, op: "POST /v1/ack", dev: laptop, body: big(5 << 10), status: 413, code: codePayloadTooLarge},
		{h: broken, op: "POST /v1/ack", dev: laptop, body: `{"cursor":1}`, status: 500, code: codeInternal},
		{h: slow, op: "POST /v1/ack", dev: laptop, body: `{"cursor":1}`, status: 503, code: codeUnavailable},

		{h: h, op: "GET /v1/devices", path: "/v1/devices", dev: phone, status: 200},
		{h: h, op: "GET /v1/devices", path: "/v1/devices?limit=1", dev: phone, header: wantMsgpack, status: 200},
		{h: h, op: "GET /v1/devices", path: "/v1/devices?limit=0", dev: phone, status: 400, code: codeBadRequest},
		{h: h, op: "GET /v1/devices", path: "/v1/devices", status: 401, code: codeUnauthorized},
		{h: broken, op: "GET /v1/devices", path: "/v1/devices", dev: phone, status: 500, code: codeInternal},
		{h: slow, op: "GET /v1/devices", path: "/v1/devices", dev: phone, status: 503, code: codeUnavailable},

		{h: h, op: "DELETE /v1/devices/{device}", path: "/v1/devices/" + strings.Repeat("a", 65), dev: admin, status: 400, code: codeBadRequest},
		{h: h, op: "DELETE /v1/devices/{device}", path: "/v1/devices/laptop", status: 401, code: codeUnauthorized},
		{h: h, op: "DELETE /v1/devices/{device}", path: "/v1/devices/laptop", dev: phone, status: 403, code: codeForbidden},
		{h: h, op: "DELETE /v1/devices/{device}", path: "/v1/devices/ghost", dev: admin, status: 404, code: codeNotFound},
		{h: h, op: "DELETE /v1/devices/{device}", path: "/v1/devices/laptop", dev: admin, status: 204},
		{h: h, op: "POST /v1/ack", tok: removedLaptop, body: `{"cursor":0}`, status: 401, code: codeUnauthorized},
		{h: broken, op: "DELETE /v1/devices/{device}", path: "/v1/devices/laptop", dev: admin, status: 500, code: codeInternal},
		{h: slow, op: "DELETE /v1/devices/{device}", path: "/v1/devices/laptop", dev: admin, status: 503, code: codeUnavailable},
	} {
		c.check(r)
	}

	// Pairing: a relay that pairs (attempts unlimited but for one
	// address's bucket on tight), and one whose tokens come from elsewhere.
	pairs := newHarness(t, func(c *Config) { c.PairRatePerAddress = 1000 })
	pairTight := newHarness(t, func(c *Config) { c.PairRatePerAddress = 1 })
	off := newHarness(t, func(c *Config) { c.IssuerKey = nil })
	pairAdmin := pairs.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	toPair := pairs.invite(pairAdmin, "phone", "")
	paired := pairs.pairWith(map[string]any{"code": pairs.invite(pairAdmin, "tablet", "admin").Code}, http.StatusOK)
	code := func(c string) map[string]any { return map[string]any{"code": c} }
	secret := func(s string) map[string]any { return map[string]any{"renewal_secret": s} }
	for _, r := range []call{
		{h: pairs, op: "POST /v1/invitations", dev: admin, body: `{"device":"laptop"}`, status: 201},
		{h: pairs, op: "POST /v1/invitations", dev: admin, body: msgpackBody(t, map[string]any{"device": "watch", "scope": "admin"}), header: asMsgpack, status: 201},
		{h: pairs, op: "POST /v1/invitations", dev: admin, body: `{"device":"bad name"}`, status: 400, code: codeBadRequest},
		{h: pairs, op: "POST /v1/invitations", body: `{"device":"laptop"}`, status: 401, code: codeUnauthorized},
		{h: pairs, op: "POST /v1/invitations", dev: phone, body: `{"device":"laptop"}`, status: 403, code: codeForbidden},
		{h: off, op: "POST /v1/invitations", dev: admin, body: `{"device":"laptop"}`, status: 404, code: codeNotFound},
		{h: pairs, op: "POST /v1/invitations", dev: admin, body: big(1 << 10), status: 413, code: codePayloadTooLarge},
		{h: broken, op: "POST /v1/invitations", dev: admin, body: `{"device":"laptop"}`, status: 500, code: codeInternal},
		{h: slow, op: "POST /v1/invitations", dev: admin, body: `{"device":"laptop"}`, status: 503, code: codeUnavailable},
		{h: pairs, op: "POST /v1/invitations", dev: admin, body: `{"device":"tablet"}`, status: 409, code: codeDeviceExists},
		{h: pairs, op: "POST /v1/invitations", dev: admin, body: `{"device":"tablet","replace":true}`, status: 201},

		{h: pairs, op: "DELETE /v1/invitations/{device}", path: "/v1/invitations/tablet", dev: admin, status: 204},
		{h: pairs, op: "DELETE /v1/invitations/{device}", path: "/v1/invitations/tablet", dev: admin, status: 404, code: codeNotFound},
		{h: pairs, op: "DELETE /v1/invitations/{device}", path: "/v1/invitations/" + strings.Repeat("a", 65), dev: admin, status: 400, code: codeBadRequest},
		{h: pairs, op: "DELETE /v1/invitations/{device}", path: "/v1/invitations/laptop", status: 401, code: codeUnauthorized},
		{h: pairs, op: "DELETE /v1/invitations/{device}", path: "/v1/invitations/laptop", dev: phone, status: 403, code: codeForbidden},
		{h: broken, op: "DELETE /v1/invitations/{device}", path: "/v1/invitations/laptop", dev: admin, status: 500, code: codeInternal},
		{h: slow, op: "DELETE /v1/invitations/{device}", path: "/v1/invitations/laptop", dev: admin, status: 503, code: codeUnavailable},

		{h: pairs, op: "GET /v1/invitations", dev: admin, status: 200},
		{h: pairs, op: "GET /v1/invitations", dev: admin, header: wantMsgpack, status: 200},
		{h: pairs, op: "GET /v1/invitations", status: 401, code: codeUnauthorized},
		{h: pairs, op: "GET /v1/invitations", dev: phone, status: 403, code: codeForbidden},
		{h: off, op: "GET /v1/invitations", dev: admin, status: 404, code: codeNotFound},
		{h: broken, op: "GET /v1/invitations", dev: admin, status: 500, code: codeInternal},
		{h: slow, op: "GET /v1/invitations", dev: admin, status: 503, code: codeUnavailable},

		{h: pairs, op: "POST /v1/pair", body: map[string]any{"code": toPair.Code, "identity_key": []byte(pub)}, status: 200},
		{h: pairs, op: "POST /v1/pair", body: `{"code":5}`, status: 400, code: codeBadRequest},
		{h: pairs, op: "POST /v1/pair", body: code(toPair.Code), status: 401, code: codeUnauthorized},
		{h: pairs, op: "POST /v1/pair", body: code("ABCDE-FGHJK"), header: wantMsgpack, status: 401, code: codeUnauthorized},
		{h: off, op: "POST /v1/pair", body: code("ABCDE-FGHJK"), status: 404, code: codeNotFound},
		{h: pairs, op: "POST /v1/pair", body: big(1 << 10), status: 413, code: codePayloadTooLarge},
		{h: pairs, op: "POST /v1/pair", body: code("ABCDE-FGHJK"), header: []string{"Content-Type", "text/plain"}, status: 415, code: codeUnsupportedType},
		{h: pairs, op: "POST /v1/pair", body: code("ABCDE-FGHJK"), header: []string{"Origin", "https://elsewhere.example"}, status: 403, code: codeForbidden},
		{h: pairTight, op: "POST /v1/pair", body: code("ABCDE-FGHJK"), status: 401, code: codeUnauthorized},
		{h: pairTight, op: "POST /v1/pair", body: code("ABCDE-FGHJK"), status: 429, code: codeRateLimited, limit: pairing.LimitAddress},
		{h: broken, op: "POST /v1/pair", body: code("ABCDE-FGHJK"), status: 500, code: codeInternal},
		{h: slow, op: "POST /v1/pair", body: code("ABCDE-FGHJK"), status: 503, code: codeUnavailable},

		{h: pairs, op: "POST /v1/renew", body: msgpackBody(t, secret(paired.RenewalSecret)), header: asMsgpack, status: 200},
		{h: pairs, op: "POST /v1/renew", body: `{}`, status: 400, code: codeBadRequest},
		{h: pairs, op: "POST /v1/renew", body: secret(pairing.NewRenewalSecret()), status: 401, code: codeUnauthorized},
		{h: off, op: "POST /v1/renew", body: secret(pairing.NewRenewalSecret()), status: 404, code: codeNotFound},
		{h: pairs, op: "POST /v1/renew", body: big(1 << 10), status: 413, code: codePayloadTooLarge},
		{h: pairs, op: "POST /v1/renew", body: secret(pairing.NewRenewalSecret()), header: []string{"Content-Type", "text/plain"}, status: 415, code: codeUnsupportedType},
		{h: pairs, op: "POST /v1/renew", body: secret(pairing.NewRenewalSecret()), header: []string{"Origin", "https://elsewhere.example"}, status: 403, code: codeForbidden},
		{h: pairTight, op: "POST /v1/renew", body: secret(pairing.NewRenewalSecret()), header: wantMsgpack, status: 429, code: codeRateLimited, limit: pairing.LimitAddress},
		{h: broken, op: "POST /v1/renew", body: secret(pairing.NewRenewalSecret()), status: 500, code: codeInternal},
		{h: slow, op: "POST /v1/renew", body: secret(pairing.NewRenewalSecret()), status: 503, code: codeUnavailable},
	} {
		c.check(r)
	}

	// The VAPID key: served by a relay that sends Web Push, 404 by one
	// that does not.
	vapidKey, _ := webpush.GenerateVAPIDKey()
	vapid, err := webpush.NewVAPID(vapidKey, "mailto:ops@relay.example")
	if err != nil {
		t.Fatal(err)
	}
	wq, err := push.New(push.Config{WebPush: push.WebPushConfig{VAPID: vapid}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer wq.Close(context.Background())
	webPushing := newHarness(t, func(c *Config) { c.VAPIDPublicKey = vapid.PublicKey() })
	webPushing.srv.push = wq
	c.check(call{h: webPushing, op: "GET /v1/push/vapid", status: 200})
	c.check(call{h: webPushing, op: "GET /v1/push/vapid", header: wantMsgpack, status: 200})
	c.check(call{h: h, op: "GET /v1/push/vapid", status: 404, code: codeNotFound})

	// The held-poll cap: one poll held, the next one refused.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = tight.do(ctx, "GET", "/v1/poll?wait=30", tight.token("home", "tablet"), nil)
	}()
	eventually(t, "a held poll", func() bool { return tight.srv.HeldPolls() == 1 })
	c.check(call{h: tight, op: "GET /v1/poll", path: "/v1/poll?wait=1", dev: laptop, status: 503, code: codeOverloaded})
	cancel()
	wg.Wait()

	// Answers in flight: while a client sits on its answer, its device's
	// next poll is refused.
	stalled := newHarness(t, func(c *Config) { c.DeviceAnswerBytesInFlight = 1 << 20 })
	fillDevice(t, stalled, "home", "phone", 32, 64<<10)
	stalledPoll(t, stalled, stalled.token("home", "phone"), "cursor=0&wait=0")
	eventually(t, "an answer in flight", func() bool { return stalled.srv.limits.answers.total.Load() > 2<<20 })
	c.check(call{h: stalled, op: "GET /v1/poll", path: "/v1/poll?cursor=0", dev: phone, status: 429, code: codeAnswersInFlight, limit: limitDeviceAnswers})
	c.check(call{h: stalled, op: "GET /v1/poll", path: "/v1/poll?cursor=0", dev: phone, header: wantMsgpack, status: 429, code: codeAnswersInFlight, limit: limitDeviceAnswers})

	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for code := range op.Responses.Map() {
				status, err := strconv.Atoi(code)
				if err != nil {
					t.Errorf("%s %s: response %q is not a status", method, path, code)
					continue
				}
				if !c.seen[method+" "+path][status] {
					t.Errorf("%s %s: %s documents %d, which no request here produced", method, path, openapiPath, status)
				}
			}
		}
	}
}

// call is one request and the answer it must get. path defaults to the
// operation's path.
type call struct {
	h      *harness
	op     string // "METHOD /documented/path"
	path   string
	dev    string // mint a token of household home for this device ("admin": with scope admin)
	tok    string // else send this token as is
	body   any
	header []string
	status int
	code   string // the error code, for an error
	limit  string // the error's limit, for a 429
}

type statusCheck struct {
	t    *testing.T
	doc  *openapi3.T
	seen map[string]map[int]bool // op -> statuses produced
}

func (c *statusCheck) check(r call) {
	t := c.t
	t.Helper()
	method, tmpl, _ := strings.Cut(r.op, " ")
	path := r.path
	if path == "" {
		path = tmpl
	}
	name := fmt.Sprintf("%s %s", method, path)
	item := c.doc.Paths.Value(tmpl)
	if item == nil || item.GetOperation(method) == nil {
		t.Errorf("%s: %s does not document %s", name, openapiPath, r.op)
		return
	}
	tok := r.tok
	if r.dev != "" {
		now := time.Now()
		claims := token.Claims{Household: "home", Device: r.dev, IssuedAt: now, Expires: now.Add(time.Hour)}
		if r.dev == "admin" {
			claims.Scope = token.ScopeAdmin
		}
		tok = r.h.mint(claims)
	}
	resp, err := r.h.do(context.Background(), method, path, tok, r.body, r.header...)
	if err != nil {
		t.Errorf("%s: %v", name, err)
		return
	}
	ref := item.GetOperation(method).Responses.Status(resp.status)
	if ref == nil {
		t.Errorf("%s answered %d, which %s does not list for %s; body %s", name, resp.status, openapiPath, r.op, resp.body)
		return
	}
	if c.seen[r.op] == nil {
		c.seen[r.op] = map[int]bool{}
	}
	c.seen[r.op][resp.status] = true
	if resp.status != r.status {
		t.Errorf("%s: status %d, want %d; body %s", name, resp.status, r.status, resp.body)
		return
	}
	doc := ref.Value

	for hname, hdr := range doc.Headers {
		v := resp.header.Get(hname)
		if v == "" {
			if hdr.Value.Required {
				t.Errorf("%s: %d without its required %s header", name, resp.status, hname)
			}
			continue
		}
		var val any = v
		if hdr.Value.Schema.Value.Type.Is("integer") {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Errorf("%s: header %s: %q is not an integer", name, hname, v)
				continue
			}
			val = float64(n)
		}
		if err := hdr.Value.Schema.Value.VisitJSON(val, openapi3.EnableJSONSchema2020()); err != nil {
			t.Errorf("%s: header %s: %q does not validate: %v", name, hname, v, err)
		}
	}

	if len(doc.Content) == 0 {
		if len(resp.body) != 0 {
			t.Errorf("%s: %d documents no body, got %q", name, resp.status, resp.body)
		}
		return
	}
	ct := resp.header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		t.Errorf("%s: Content-Type %q: %v", name, ct, err)
		return
	}
	media := doc.Content.Get(mt)
	if media == nil {
		t.Errorf("%s: %d with Content-Type %s, which %s does not list", name, resp.status, mt, openapiPath)
		return
	}
	if mt == contentNDJSON {
		// Each line is one value of the schema.
		for _, line := range strings.Split(strings.TrimSuffix(string(resp.body), "\n"), "\n") {
			var v any
			if err := json.Unmarshal([]byte(line), &v); err != nil {
				t.Errorf("%s: line %q: %v", name, line, err)
				continue
			}
			if err := media.Schema.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
				t.Errorf("%s: line does not validate against %s: %v\nline: %s", name, openapiPath, err, line)
			}
		}
		return
	}
	value, err := decodeAs(mt, resp.body)
	if err != nil {
		t.Errorf("%s: %s body %q: %v", name, mt, resp.body, err)
		return
	}
	if err := media.Schema.Value.VisitJSON(value, openapi3.EnableJSONSchema2020()); err != nil {
		t.Errorf("%s: %d body does not validate against %s: %v\nbody: %s", name, resp.status, openapiPath, err, resp.body)
	}
	if r.code != "" {
		m, _ := value.(map[string]any)
		if m["error"] != r.code || m["limit"] != nilIfEmpty(r.limit) {
			t.Errorf("%s: error %v limit %v, want %s %s", name, m["error"], m["limit"], r.code, r.limit)
		}
	}
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// decodeAs turns a body into the value its schema describes. A MessagePack
// body goes through JSON, so that its bin fields are checked as the base64
// strings the JSON form carries.
func decodeAs(mediaType string, body []byte) (any, error) {
	switch mediaType {
	case "text/plain", contentSSE:
		return string(body), nil
	case wire.ContentMsgpack:
		var v any
		if err := msgpack.Unmarshal(body, &v); err != nil {
			return nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		body = b
	}
	var v any
	err := json.Unmarshal(body, &v)
	return v, err
}
