package relay

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/wire"
)

// allocated is the number of bytes the whole process (test and relay alike)
// allocated on the heap while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// msgpackMap is a MessagePack map of the given keys and raw (already encoded)
// values.
func msgpackMap(kv ...any) []byte {
	b := []byte{0x80 | byte(len(kv)/2)}
	for i := 0; i < len(kv); i += 2 {
		k := kv[i].(string)
		b = append(b, 0xa0|byte(len(k)))
		b = append(b, k...)
		b = append(b, kv[i+1].([]byte)...)
	}
	return b
}

// mpSend is a valid MessagePack send to phone whose ignored field "pad"
// holds the raw value pad.
func mpSend(tb testing.TB, id string, pad []byte) []byte {
	tb.Helper()
	return msgpackMap("pad", pad, "id", msgpackBody(tb, id), "to", msgpackBody(tb, []string{"phone"}), "payload", msgpackBody(tb, []byte("x")))
}

// bin32 is the header of a MessagePack bin32 that declares n bytes and is
// followed by none of them.
func bin32(n uint32) []byte { return binary.BigEndian.AppendUint32([]byte{0xc6}, n) }

// nested is depth one-element arrays around nil.
func nested(depth int) []byte { return append(bytes.Repeat([]byte{0x91}, depth), 0xc0) }

// postMsgpack sends body as MessagePack and fails t, not the harness's
// test, on a transport error, another status, or a 400 that is not
// bad_request.
func postMsgpack(t testing.TB, h *harness, path, tok string, body []byte, want int) {
	t.Helper()
	r, err := h.do(context.Background(), "POST", path, tok, body, "Content-Type", wire.ContentMsgpack)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	if r.status != want {
		t.Fatalf("POST %s: status %d, want %d; body %s", path, r.status, want, r.body)
	}
	if want == http.StatusBadRequest && r.errCode(t) != codeBadRequest {
		t.Fatalf("POST %s: %s, want bad_request", path, r.body)
	}
}

// TestMsgpackDeclaredLength: a tiny body that declares a huge bin is a 400
// at once, and the relay does not allocate what it declares. The send with
// 256 MiB declared goes first and stops the test if the heap jumps, so that
// a broken check never gets to try 4 GiB on the machine running the tests.
// Before the check existed, the 256 MiB case failed with "allocated
// 268435456+ bytes".
func TestMsgpackDeclaredLength(t *testing.T) {
	h := newHarness(t, nil)
	tok := h.register("home", "phone")
	const bound = 16 << 20
	for _, n := range []uint32{1 << 28, 0xffffffff} {
		for _, tt := range []struct {
			name, path string
			body       []byte
		}{
			{"send payload", "/v1/send", msgpackMap("id", msgpackBody(t, "a"), "to", msgpackBody(t, []string{"phone"}), "payload", bin32(n))},
			{"register identity_key", "/v1/register", msgpackMap("identity_key", bin32(n))},
			{"ignored field", "/v1/send", msgpackMap("id", msgpackBody(t, "a"), "pad", bin32(n))},
		} {
			ok := t.Run(fmt.Sprintf("%s %#x", tt.name, n), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				var r reply
				var err error
				got := allocated(func() { r, err = h.do(ctx, "POST", tt.path, tok, tt.body, "Content-Type", wire.ContentMsgpack) })
				if got > bound {
					t.Fatalf("a %d-byte body allocated %d bytes, bound %d", len(tt.body), got, bound)
				}
				if err != nil {
					t.Fatal(err)
				}
				if r.status != http.StatusBadRequest || r.errCode(t) != codeBadRequest {
					t.Fatalf("status %d, body %s; want 400 bad_request", r.status, r.body)
				}
			})
			if !ok {
				t.Fatal("stopping before a larger declared length is tried")
			}
		}
	}
}

// TestMsgpackDeepNesting: 95,000 nested arrays in an ignored field (a 95 KB
// body, once 202 with 14 MB of decoder stack) are a 400, one at a time and
// 64 at once, and the relay keeps serving. Before the depth check it failed
// with "status 202, want 400" on the first request.
func TestMsgpackDeepNesting(t *testing.T) {
	h := newHarness(t, nil)
	tok := h.register("home", "phone")
	body := mpSend(t, "deep", nested(95000))
	if len(body) > int(h.srv.sendBodyLimit()) {
		t.Fatalf("body of %d bytes is over the send limit; the test would prove nothing", len(body))
	}
	postMsgpack(t, h, "/v1/send", tok, body, http.StatusBadRequest)

	// One connection per request: with keep-alives the burst leaves a spare
	// dial that never sends, and Shutdown waits 5 s for it.
	burst := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer burst.CloseIdleConnections()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			req, err := http.NewRequest("POST", h.url+"/v1/send", bytes.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", wire.ContentMsgpack)
			resp, err := burst.Do(req)
			if err != nil {
				errs <- err
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}

	h.send(tok, "after", []byte("still here"), "phone")
	if p := h.poll(tok, ""); len(p.Envelopes) != 1 || string(p.Envelopes[0].Payload) != "still here" {
		t.Fatalf("poll after the deep bodies: %+v", p)
	}
}

// TestMsgpackDepthBoundary: the request's own map is level 1, and each
// array or map inside adds one; 32 levels are accepted, 33 are not. Before
// the depth check the 33-level bodies failed with "status 202, want 400",
// and so they did with maxMsgpackDepth raised to 33.
func TestMsgpackDepthBoundary(t *testing.T) {
	h := newHarness(t, nil)
	tok := h.register("home", "phone")
	nestedMaps := func(depth int) []byte {
		b := []byte{0xc0}
		for range depth {
			b = msgpackMap("k", b)
		}
		return b
	}
	for _, tt := range []struct {
		name   string
		pad    []byte
		status int
	}{
		{"32 levels of arrays", nested(31), http.StatusAccepted},
		{"33 levels of arrays", nested(32), http.StatusBadRequest},
		{"32 levels of maps", nestedMaps(31), http.StatusAccepted},
		{"33 levels of maps", nestedMaps(32), http.StatusBadRequest},
		{"32 levels, the innermost empty", append(bytes.Repeat([]byte{0x91}, 30), 0x90), http.StatusAccepted},
		{"33 levels, the innermost empty", append(bytes.Repeat([]byte{0x91}, 31), 0x90), http.StatusBadRequest},
	} {
		t.Run(tt.name, func(t *testing.T) {
			postMsgpack(t, h, "/v1/send", tok, mpSend(t, strings.ReplaceAll(tt.name, " ", "-"), tt.pad), tt.status)
		})
	}
}

// TestMsgpackTrailingBytes: anything after the one MessagePack value is a
// 400, as it is in JSON. Before the check, and with the walk's trailing
// bytes test removed, these failed with "status 202, want 400" (200 for
// register).
func TestMsgpackTrailingBytes(t *testing.T) {
	h := newHarness(t, nil)
	tok := h.register("home", "phone")
	send := mpSend(t, "t", []byte{0xc0})
	postMsgpack(t, h, "/v1/send", tok, send, http.StatusAccepted)
	for _, tt := range []struct {
		name, path string
		body       []byte
	}{
		{"send and nil", "/v1/send", append(send, 0xc0)},
		{"send twice", "/v1/send", append(send, send...)},
		{"send and a zero byte", "/v1/send", append(send, 0)},
		{"register and nil", "/v1/register", append(msgpackMap(), 0xc0)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			postMsgpack(t, h, tt.path, tok, tt.body, http.StatusBadRequest)
		})
	}
}

// TestJSONDeepNesting: JSON is not held to MessagePack's 32 levels: the
// standard decoder skips unknown fields without recursing and stops at
// 10,000 levels, so 100 levels are accepted and 95,000 refused.
func TestJSONDeepNesting(t *testing.T) {
	h := newHarness(t, nil)
	tok := h.register("home", "phone")
	body := func(id string, depth int) string {
		return `{"pad":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `,"id":"` + id + `","to":["phone"],"payload":"eA=="}`
	}
	h.must("POST", "/v1/send", tok, body("a", 100), http.StatusAccepted)
	var r reply
	got := allocated(func() { r = h.must("POST", "/v1/send", tok, body("b", 45000), http.StatusBadRequest) })
	if r.errCode(t) != codeBadRequest {
		t.Fatalf("code %s", r.body)
	}
	if got > 16<<20 {
		t.Fatalf("a 90 KB body allocated %d bytes", got)
	}
}

// BenchmarkDecodeSendMsgpack: what a MessagePack send costs to decode, the
// walk included, for a small and the largest default payload.
func BenchmarkDecodeSendMsgpack(b *testing.B) {
	for _, size := range []int{100, 64 << 10} {
		body := msgpackBody(b, map[string]any{"id": "bench", "to": []string{"phone", "laptop", "tablet"}, "payload": make([]byte, size)})
		r, _ := http.NewRequest("POST", "/v1/send", nil)
		r.Header.Set("Content-Type", wire.ContentMsgpack)
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var req sendRequest
				if err := wire.DecodeRequest(r, body, &req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
