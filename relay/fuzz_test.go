package relay

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzDecodeSend: no JSON or MessagePack body makes decoding or validation
// panic, and whatever validates is within the SPEC's bounds.
func FuzzDecodeSend(f *testing.F) {
	f.Add([]byte(`{"id":"a","to":["phone","laptop"],"payload":"aGVsbG8="}`), false)
	f.Add([]byte(`{"id":5}`), false)
	f.Add([]byte(`{"to":[null],"payload":null}`), false)
	f.Add(msgpackBody(f, map[string]any{"id": "a", "to": []string{"phone"}, "payload": []byte("x")}), true)
	f.Add([]byte{0x81, 0xa2, 'i', 'd', 0xc1}, true)
	s := &Server{cfg: DefaultConfig()}
	f.Fuzz(func(t *testing.T, body []byte, mp bool) {
		r := httptest.NewRequest("POST", "/v1/send", nil)
		if mp {
			r.Header.Set("Content-Type", contentMsgpack)
		}
		var req sendRequest
		if err := decodeRequest(r, body, &req); err != nil {
			requireClientError(t, err)
			return
		}
		to, err := s.validateSend(&req)
		if err != nil {
			requireClientError(t, err)
			return
		}
		if len(to) < 1 || len(to) > s.cfg.MaxRecipients || len(req.Payload) < 1 || len(req.Payload) > s.cfg.MaxEnvelopeBytes || len(req.ID) > 128 {
			t.Fatalf("accepted out-of-bounds send: %d recipients, %d bytes", len(to), len(req.Payload))
		}
	})
}

// FuzzDecodeRegister covers the register body: keys and push targets.
func FuzzDecodeRegister(f *testing.F) {
	f.Add([]byte(`{"push":{"kind":"unifiedpush","endpoint":"https://push.example/abc"},"identity_key":"AAAA"}`), false)
	f.Add([]byte(`{"push":{"kind":"apns","endpoint":"0a0b"}}`), false)
	f.Add(msgpackBody(f, map[string]any{"push": map[string]string{"kind": "fcm", "endpoint": "tok"}}), true)
	s := &Server{cfg: DefaultConfig()}
	f.Fuzz(func(t *testing.T, body []byte, mp bool) {
		r := httptest.NewRequest("POST", "/v1/register", nil)
		if mp {
			r.Header.Set("Content-Type", contentMsgpack)
		}
		var req registerRequest
		if err := decodeRequest(r, body, &req); err != nil {
			requireClientError(t, err)
			return
		}
		if req.Push != nil {
			if _, err := s.pushTarget(r.Context(), *req.Push); err != nil {
				requireClientError(t, err)
			}
		}
	})
}

// FuzzPollQuery: any query string parses to values inside their bounds or
// to a 400.
func FuzzPollQuery(f *testing.F) {
	for _, q := range []string{"cursor=1&wait=20", "cursor=9223372036854775807", "cursor=-1", "wait=%zz", "limit=1000&limit=1", "cursor=+1", "cursor=0x10"} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		r := httptest.NewRequest("GET", "/v1/poll", nil)
		r.URL.RawQuery = raw
		q, err := parseQuery(r)
		if err != nil {
			requireClientError(t, err)
			return
		}
		for _, p := range []struct {
			name        string
			def, lo, hi int64
		}{{"cursor", -1, 0, 1<<63 - 1}, {"wait", 0, 0, 60}, {"limit", 1000, 1, 1000}} {
			n, err := q.int(p.name, p.def, p.lo, p.hi)
			if err != nil {
				requireClientError(t, err)
				continue
			}
			if n != p.def && (n < p.lo || n > p.hi) {
				t.Fatalf("%s = %d outside [%d, %d]", p.name, n, p.lo, p.hi)
			}
			if v := q.get(p.name); n != p.def && strings.TrimLeft(v, "0123456789") != "" {
				t.Fatalf("%s accepted %q", p.name, v)
			}
		}
	})
}

func requireClientError(t *testing.T, err error) {
	t.Helper()
	he := fromStore(err)
	if he.Status < 400 || he.Status >= 500 || he.Status == http.StatusNotFound {
		t.Fatalf("error %v maps to %d, want a 4xx", err, he.Status)
	}
}
