package relay

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/flamenet/relay/internal/wire"
)

// decodeBound is the most one decode may allocate: a small multiple of the
// body plus the decoders' fixed costs. Before checkMsgpack, a 29-byte body
// declaring a 4 GiB bin made the decoder allocate 4 GiB.
func decodeBound(body []byte) uint64 { return 64*uint64(len(body)) + 64<<10 }

// decodeWithin is decodeRequest that fails t when the decode allocated more
// than decodeBound.
func decodeWithin(t *testing.T, r *http.Request, body []byte, v any) error {
	t.Helper()
	var err error
	if got := allocated(func() { err = wire.DecodeRequest(r, body, v) }); got > decodeBound(body) {
		t.Fatalf("decoding %d bytes allocated %d, bound %d", len(body), got, decodeBound(body))
	}
	return err
}

// addHostile seeds f with the shapes that once cost the relay more than the
// body: declared lengths and counts the body does not hold, deep nesting and
// trailing bytes, in both codecs. field is a known field of the request,
// tried as the place for each MessagePack shape along with an unknown one.
func addHostile(f *testing.F, valid []byte, field string) {
	u32 := func(code byte) []byte { return []byte{code, 0xff, 0xff, 0xff, 0xff} }
	for _, shape := range [][]byte{
		u32(0xc6), u32(0xdb), u32(0xdd), u32(0xdf), append(u32(0xc9), 1), // bin32, str32, array32, map32, ext32
		{0xc5, 0xff, 0xff}, {0xdc, 0xff, 0xff}, {0xde, 0xff, 0xff}, {0xdf, 0, 0, 0, 1}, // 16-bit ones; a map entry with no value
		nested(33), nested(1000), append(bytes.Repeat([]byte{0x81, 0xa0}, 40), 0xc0),
	} {
		for _, key := range []string{field, "pad"} {
			f.Add(msgpackMap(key, shape), true)
		}
	}
	f.Add(u32(0xdf), true)
	f.Add(append(bytes.Clone(valid), 0xc0), true)
	f.Add(msgpackMap("pad", nested(31)), true)
	f.Add([]byte(`{"pad":`+strings.Repeat("[", 20000)+`]}`), false)
	f.Add([]byte(`{"pad":`+strings.Repeat("[", 9999)+strings.Repeat("]", 9999)+`}`), false)
	f.Add([]byte(`{"`+field+`":"`+strings.Repeat(`\u0000`, 1000)+`"}`), false)
	f.Add([]byte(`{"`+field+`":"`+strings.Repeat("\xff", 1000)+`"}`), false)
	f.Add([]byte(`{"`+field+`":[`+strings.Repeat(`"",`, 1000)+`""]}`), false)
	f.Add([]byte(`{"`+field+`":"eA=="} {}`), false)
}

// FuzzDecodeSend: no JSON or MessagePack body makes decoding or validation
// panic or allocate beyond decodeBound, and whatever validates is within the
// bounds of docs/PROTOCOL.md.
func FuzzDecodeSend(f *testing.F) {
	valid := msgpackBody(f, map[string]any{"id": "a", "to": []string{"phone"}, "payload": []byte("x")})
	f.Add([]byte(`{"id":"a","to":["phone","laptop"],"payload":"aGVsbG8="}`), false)
	f.Add([]byte(`{"id":5}`), false)
	f.Add([]byte(`{"to":[null],"payload":null}`), false)
	f.Add(valid, true)
	f.Add([]byte{0x81, 0xa2, 'i', 'd', 0xc1}, true)
	for _, field := range []string{"payload", "id", "to"} {
		addHostile(f, valid, field)
	}
	s := &Server{cfg: DefaultConfig()}
	f.Fuzz(func(t *testing.T, body []byte, mp bool) {
		r := httptest.NewRequest("POST", "/v1/send", nil)
		if mp {
			r.Header.Set("Content-Type", wire.ContentMsgpack)
		}
		var req sendRequest
		if err := decodeWithin(t, r, body, &req); err != nil {
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
	valid := msgpackBody(f, map[string]any{"push": map[string]string{"kind": "fcm", "endpoint": "tok"}})
	f.Add([]byte(`{"push":{"kind":"unifiedpush","endpoint":"https://push.example/abc"},"identity_key":"AAAA"}`), false)
	f.Add([]byte(`{"push":{"kind":"apns","endpoint":"0a0b"}}`), false)
	f.Add(valid, true)
	for _, field := range []string{"identity_key", "push"} {
		addHostile(f, valid, field)
	}
	f.Add(msgpackMap("push", msgpackMap("kind", []byte{0xdb, 0xff, 0xff, 0xff, 0xff})), true)
	s := &Server{cfg: DefaultConfig()}
	f.Fuzz(func(t *testing.T, body []byte, mp bool) {
		r := httptest.NewRequest("POST", "/v1/register", nil)
		if mp {
			r.Header.Set("Content-Type", wire.ContentMsgpack)
		}
		var req registerRequest
		if err := decodeWithin(t, r, body, &req); err != nil {
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
