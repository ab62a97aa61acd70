package relay

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/flamenet/relay/store/sqlite"
	"github.com/flamenet/relay/token"
	"github.com/flamenet/relay/wake"
	"github.com/flamenet/relay/wake/local"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// harness is a relay on SQLite with the in-process hub, serving real HTTP
// on a loopback socket.
type harness struct {
	t      testing.TB
	srv    *Server
	url    string
	key    ed25519.PrivateKey
	db     *sqlite.DB // set by newHarness only
	hub    wake.Hub
	client *http.Client
	served chan error
}

func newHarness(t testing.TB, mutate func(*Config)) *harness {
	t.Helper()
	db, err := sqlite.Open(context.Background(), sqlite.Config{Path: filepath.Join(t.TempDir(), "relay.db"), Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	h := newHarnessWith(t, Deps{Store: db, Hub: local.New(nil)}, mutate)
	h.db = db
	return h
}

// newHarnessWith serves deps (a store and a hub the caller closes) on a
// loopback socket.
func newHarnessWith(t testing.TB, deps Deps, mutate func(*Config)) *harness {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.IssuerKeys = []ed25519.PublicKey{pub}
	cfg.IssuerKey = key // the relay mints too: pairing is on
	// Tests send from one household far faster than one household may;
	// those about fairness set the household's bucket themselves.
	cfg.HouseholdSendRate, cfg.HouseholdSendBurst = cfg.SendRate, cfg.SendBurst
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{
		t: t, srv: srv, url: "http://" + ln.Addr().String(), key: key, hub: deps.Hub,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}},
		served: make(chan error, 1),
	}
	go func() { h.served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		h.shutdown()
		h.client.CloseIdleConnections()
	})
	return h
}

// shutdown drains the server once; later calls do nothing.
func (h *harness) shutdown() {
	if h.served == nil {
		return
	}
	// net/http counts a connection that sent nothing yet as busy for its
	// first 5 s (a client's spare dial), so the bound is above that.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := h.srv.Shutdown(ctx); err != nil {
		h.t.Errorf("shutdown: %v", err)
	}
	if err := <-h.served; err != nil {
		h.t.Errorf("serve: %v", err)
	}
	h.served = nil
}

func (h *harness) token(household, device string) string {
	h.t.Helper()
	return h.mint(token.Claims{Household: household, Device: device, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
}

func (h *harness) mint(c token.Claims) string {
	h.t.Helper()
	tok, err := token.Mint(h.key, c)
	if err != nil {
		h.t.Fatal(err)
	}
	return tok
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(tb testing.TB, v any) {
	tb.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		tb.Fatalf("decoding %q: %v", r.body, err)
	}
}

// errCode is the protocol's error code in a JSON error body.
func (r reply) errCode(tb testing.TB) string {
	tb.Helper()
	var e errorBody
	r.json(tb, &e)
	if e.Message == "" {
		tb.Fatalf("error body without message: %s", r.body)
	}
	return e.Error
}

// do sends a request; body is sent as is when it is a string or []byte,
// and as JSON otherwise.
func (h *harness) do(ctx context.Context, method, path, tok string, body any, header ...string) (reply, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = bytes.NewReader([]byte(b))
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return reply{}, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.url+path, rd)
	if err != nil {
		return reply{}, err
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if rd != nil {
		// As clients do; a test's header may say otherwise.
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// must is do that fails the test on a transport error or an unexpected status.
func (h *harness) must(method, path, tok string, body any, want int, header ...string) reply {
	h.t.Helper()
	r, err := h.do(context.Background(), method, path, tok, body, header...)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	if r.status != want {
		h.t.Fatalf("%s %s: status %d, want %d; body %s", method, path, r.status, want, r.body)
	}
	return r
}

// try is do that fails the test only if there is no answer at all.
func (h *harness) try(method, path, tok string, body any, header ...string) reply {
	h.t.Helper()
	r, err := h.do(context.Background(), method, path, tok, body, header...)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func (h *harness) register(household, device string) string {
	h.t.Helper()
	tok := h.token(household, device)
	h.must("POST", "/v1/register", tok, nil, http.StatusOK)
	return tok
}

func (h *harness) send(tok, id string, payload []byte, to ...string) sendResponse {
	h.t.Helper()
	r := h.must("POST", "/v1/send", tok, map[string]any{"id": id, "to": to, "payload": payload}, http.StatusAccepted)
	var out sendResponse
	r.json(h.t, &out)
	return out
}

func (h *harness) poll(tok, query string) pollResponse {
	h.t.Helper()
	r := h.must("GET", "/v1/poll?"+query, tok, nil, http.StatusOK)
	var out pollResponse
	r.json(h.t, &out)
	return out
}

// eventually polls cond until it holds or a generous bound passes.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func msgpackBody(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
