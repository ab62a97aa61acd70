package relay

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/flamenet/relay/internal/edkey"
	"github.com/flamenet/relay/internal/wire"
	"github.com/flamenet/relay/token"
)

func TestRegisterSendPollAck(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	laptop := h.register("home", "laptop")

	res := h.send(laptop, "m1", []byte("hello"), "phone", "laptop", "phone")
	if len(res.Deliveries) != 2 || res.Deliveries[0].Device != "laptop" || res.Deliveries[1] != (deliveryJSON{"phone", 1}) {
		t.Fatalf("deliveries = %+v", res.Deliveries)
	}
	// A repeat gets the first answer and stores nothing more.
	again := h.send(laptop, "m1", []byte("hello"), "laptop", "phone")
	if fmt.Sprint(again) != fmt.Sprint(res) {
		t.Fatalf("repeat = %+v, want %+v", again, res)
	}
	conflict := h.must("POST", "/v1/send", laptop, map[string]any{"id": "m1", "to": []string{"phone"}, "payload": []byte("other")}, http.StatusConflict)
	if got := conflict.errCode(t); got != codeIDConflict {
		t.Fatalf("code = %s", got)
	}

	p := h.poll(phone, "wait=1")
	if len(p.Envelopes) != 1 || p.Cursor != 1 || p.More {
		t.Fatalf("poll = %+v", p)
	}
	e := p.Envelopes[0]
	if e.Seq != 1 || e.ID != "m1" || e.From != "laptop" || string(e.Payload) != "hello" {
		t.Fatalf("envelope = %+v", e)
	}
	if _, err := time.Parse(time.RFC3339Nano, e.SentAt); err != nil {
		t.Fatalf("sent_at %q: %v", e.SentAt, err)
	}
	// Acknowledged by the next poll's cursor: nothing left, cursor stays.
	p = h.poll(phone, "cursor=1")
	if len(p.Envelopes) != 0 || p.Cursor != 1 {
		t.Fatalf("after ack: %+v", p)
	}
	// cursor below the stored one does not move it down.
	if p = h.poll(phone, "cursor=0"); p.Cursor != 1 {
		t.Fatalf("cursor moved down: %+v", p)
	}
	ahead := h.must("GET", "/v1/poll?cursor=5", phone, nil, http.StatusConflict)
	var body errorBody
	ahead.json(t, &body)
	if body.Error != codeCursorAhead || body.Head == nil || *body.Head != 1 || len(body.Epoch) != 16 {
		t.Fatalf("cursor_ahead body = %s", ahead.body)
	}
	h.must("POST", "/v1/ack", laptop, `{"cursor":1}`, http.StatusNoContent)
	if p = h.poll(laptop, ""); len(p.Envelopes) != 0 || p.Cursor != 1 {
		t.Fatalf("laptop after ack: %+v", p)
	}
	reg := h.must("POST", "/v1/register", phone, `{}`, http.StatusOK)
	var rr registerResponse
	reg.json(t, &rr)
	if rr != (registerResponse{"home", "phone", 1, body.Epoch}) {
		t.Fatalf("register = %+v", rr)
	}
	// Unknown recipient: 404 and nothing stored for anyone.
	r := h.must("POST", "/v1/send", laptop, map[string]any{"id": "m2", "to": []string{"phone", "tablet"}, "payload": []byte("x")}, http.StatusNotFound)
	if got := r.errCode(t); got != codeUnknownDevice {
		t.Fatalf("code = %s", got)
	}
	if p = h.poll(phone, ""); len(p.Envelopes) != 0 {
		t.Fatalf("partial send stored: %+v", p)
	}
}

func TestMessagePack(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	payload := []byte{0, 1, 2, 0xff}
	body := msgpackBody(t, map[string]any{"id": "mp", "to": []string{"phone"}, "payload": payload})
	r := h.must("POST", "/v1/send", phone, body, http.StatusAccepted, "Content-Type", wire.ContentMsgpack, "Accept", wire.ContentMsgpack)
	if ct := r.header.Get("Content-Type"); ct != wire.ContentMsgpack {
		t.Fatalf("content type %q", ct)
	}
	var sr sendResponse
	if err := msgpack.Unmarshal(r.body, &sr); err != nil || sr.ID != "mp" || len(sr.Deliveries) != 1 {
		t.Fatalf("send reply %+v, %v", sr, err)
	}
	r = h.must("GET", "/v1/poll", phone, nil, http.StatusOK, "Accept", wire.ContentMsgpack)
	// Decode generically to check payload travels as bin, not as a string.
	var raw map[string]any
	if err := msgpack.Unmarshal(r.body, &raw); err != nil {
		t.Fatal(err)
	}
	envs := raw["envelopes"].([]any)
	got, ok := envs[0].(map[string]any)["payload"].([]byte)
	if !ok || !bytes.Equal(got, payload) {
		t.Fatalf("payload = %#v", envs[0].(map[string]any)["payload"])
	}
	// Errors are MessagePack too when asked for.
	r = h.must("POST", "/v1/send", phone, []byte{0xc1}, http.StatusBadRequest, "Content-Type", wire.ContentMsgpack, "Accept", wire.ContentMsgpack)
	var eb errorBody
	if err := msgpack.Unmarshal(r.body, &eb); err != nil || eb.Error != codeBadRequest {
		t.Fatalf("error body %+v, %v", eb, err)
	}
}

func TestDirectory(t *testing.T) {
	h := newHarness(t, nil)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	tok := h.token("home", "b-phone")
	h.must("POST", "/v1/register", tok, map[string]any{"identity_key": []byte(pub)}, http.StatusOK)
	for _, d := range []string{"a-laptop", "c-tablet"} {
		h.register("home", d)
	}
	h.register("other", "z-stranger")

	var page devicesResponse
	h.must("GET", "/v1/devices?limit=2", tok, nil, http.StatusOK).json(t, &page)
	if len(page.Devices) != 2 || page.Devices[0].Device != "a-laptop" || page.Devices[1].Device != "b-phone" || page.Next != "b-phone" {
		t.Fatalf("page 1 = %+v", page)
	}
	wantX, _ := edkey.Montgomery(pub)
	if !bytes.Equal(page.Devices[1].IdentityKey, pub) || !bytes.Equal(page.Devices[1].X25519Key, wantX) {
		t.Fatalf("keys = %+v", page.Devices[1])
	}
	var page2 devicesResponse
	h.must("GET", "/v1/devices?limit=2&after=b-phone", tok, nil, http.StatusOK).json(t, &page2)
	if len(page2.Devices) != 1 || page2.Devices[0].Device != "c-tablet" || page2.Next != "" {
		t.Fatalf("page 2 = %+v", page2)
	}
}

func TestDeleteDevice(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	admin := h.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	noIat := h.mint(token.Claims{Household: "home", Device: "phone", Expires: time.Now().Add(time.Hour)})
	h.send(phone, "m1", []byte("x"), "phone")

	if got := h.must("DELETE", "/v1/devices/phone", phone, nil, http.StatusForbidden).errCode(t); got != codeForbidden {
		t.Fatalf("code = %s", got)
	}
	h.must("DELETE", "/v1/devices/phone", admin, nil, http.StatusNoContent)
	h.must("DELETE", "/v1/devices/phone", admin, nil, http.StatusNotFound)
	h.must("DELETE", "/v1/devices/bad%20name", admin, nil, http.StatusBadRequest)

	// Tokens issued before the removal, or without iat, are refused.
	for _, tok := range []string{phone, noIat} {
		r := h.must("GET", "/v1/poll", tok, nil, http.StatusUnauthorized)
		if r.header.Get("WWW-Authenticate") == "" || r.errCode(t) != codeUnauthorized {
			t.Fatalf("refusal = %v %s", r.header, r.body)
		}
	}
	// A token issued after the removal (iat is whole seconds) works, and
	// the device starts again empty.
	fresh := h.mint(token.Claims{Household: "home", Device: "phone", IssuedAt: time.Now().Add(2 * time.Second), Expires: time.Now().Add(time.Hour)})
	if p := h.poll(fresh, ""); len(p.Envelopes) != 0 {
		t.Fatalf("envelopes survived removal: %+v", p)
	}
}

func TestPollBudget(t *testing.T) {
	const size = 700 << 10
	h := newHarness(t, func(c *Config) { c.MaxEnvelopeBytes = 1 << 20 })
	phone := h.register("home", "phone")
	for i := range 5 {
		h.send(phone, fmt.Sprint("big", i), bytes.Repeat([]byte{byte(i)}, size), "phone")
	}
	// 2 MiB holds two 700 KiB payloads and not three.
	p := h.poll(phone, "")
	if len(p.Envelopes) != 2 || !p.More || p.Cursor != 2 {
		t.Fatalf("poll = %d envelopes, more %v, cursor %d", len(p.Envelopes), p.More, p.Cursor)
	}
	p = h.poll(phone, "cursor=2&limit=1")
	if len(p.Envelopes) != 1 || p.Envelopes[0].Seq != 3 || !p.More {
		t.Fatalf("limit=1: %d envelopes, more %v", len(p.Envelopes), p.More)
	}
	p = h.poll(phone, "cursor=3")
	if len(p.Envelopes) != 2 || p.More {
		t.Fatalf("last poll: %d envelopes, more %v", len(p.Envelopes), p.More)
	}
}

func TestPendingLimit(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxPendingEnvelopes = 2 })
	phone := h.register("home", "phone")
	h.send(phone, "1", []byte("x"), "phone")
	h.send(phone, "2", []byte("x"), "phone")
	r := h.must("POST", "/v1/send", phone, map[string]any{"id": "3", "to": []string{"phone"}, "payload": []byte("x")}, http.StatusTooManyRequests)
	if r.errCode(t) != codeQueueFull || r.header.Get("Retry-After") == "" {
		t.Fatalf("queue full reply: %v %s", r.header, r.body)
	}
	h.must("POST", "/v1/ack", phone, `{"cursor":2}`, http.StatusNoContent)
	h.send(phone, "3", []byte("x"), "phone")
}

// TestConcurrentSenders: 50 senders fan out to overlapping recipients in
// different orders, over HTTP; every envelope arrives exactly once and each
// device's seqs are consecutive.
func TestConcurrentSenders(t *testing.T) {
	h := newHarness(t, nil)
	devices := []string{"d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7"}
	toks := map[string]string{}
	for _, d := range devices {
		toks[d] = h.register("home", d)
	}
	const senders, each = 50, 10
	var wg sync.WaitGroup
	errs := make(chan error, senders*each)
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := h.token("home", fmt.Sprint("sender", s))
			for i := range each {
				// A rotating, reversed window of four recipients.
				var to []string
				for j := range 4 {
					to = append(to, devices[(s+i+3-j)%len(devices)])
				}
				body := map[string]any{"id": fmt.Sprint(i), "to": to, "payload": []byte(fmt.Sprintf("%d/%d", s, i))}
				r, err := h.do(context.Background(), "POST", "/v1/send", tok, body)
				if err == nil && r.status != http.StatusAccepted {
					err = fmt.Errorf("status %d: %s", r.status, r.body)
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for _, d := range devices {
		seen := map[string]bool{}
		var cursor int64
		for {
			p := h.poll(toks[d], fmt.Sprintf("cursor=%d", cursor))
			if len(p.Envelopes) == 0 {
				break
			}
			for _, e := range p.Envelopes {
				if e.Seq != cursor+1 {
					t.Fatalf("%s: seq %d after %d", d, e.Seq, cursor)
				}
				cursor = e.Seq
				key := e.From + "/" + e.ID
				if seen[key] {
					t.Fatalf("%s: %s delivered twice", d, key)
				}
				seen[key] = true
			}
		}
		total += len(seen)
	}
	if want := senders * each * 4; total != want {
		t.Fatalf("delivered %d envelopes, want %d", total, want)
	}
}

func TestLiveAndReady(t *testing.T) {
	h := newHarness(t, nil)
	for path, want := range map[string]string{"/live": "ok\n", "/ready": "ready\n"} {
		r := h.must("GET", path, "", nil, http.StatusOK)
		if string(r.body) != want {
			t.Fatalf("%s = %q", path, r.body)
		}
		for k := range r.header {
			if k == "Server" || strings.HasPrefix(k, "X-") {
				t.Fatalf("%s discloses header %s", path, k)
			}
		}
	}
	h.shutdown()
}
