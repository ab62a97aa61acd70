//go:build linux

package clients

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/seal"
)

// peerJob and peerResult are typescript/src/test/peer.ts's PeerJob and
// PeerResult: one device of a sealed round trip.
type peerJob struct {
	Relay     string    `json:"relay"`
	Token     string    `json:"token"`
	Seed      string    `json:"seed"`
	Send      *peerSend `json:"send,omitempty"`
	Receive   int       `json:"receive"`
	TimeoutMs int       `json:"timeoutMs"`
}

type peerSend struct {
	ID        string   `json:"id"`
	To        []string `json:"to"`
	Plaintext string   `json:"plaintext"`
}

type peerResult struct {
	OK        bool   `json:"ok"`
	Error     string `json:"error"`
	Device    string `json:"device"`
	PublicKey string `json:"publicKey"`
	Got       []struct {
		ID        string `json:"id"`
		From      string `json:"from"`
		Plaintext string `json:"plaintext"`
	} `json:"got"`
	Refused []struct {
		ID   string `json:"id"`
		From string `json:"from"`
		Code string `json:"code"`
	} `json:"refused"`
	LocalStorage *bool `json:"localStorage"`
}

// received is what a peer opened, as "from: plaintext", sorted.
func (r peerResult) received() []string {
	var out []string
	for _, g := range r.Got {
		out = append(out, g.From+": "+g.Plaintext)
	}
	sort.Strings(out)
	return out
}

// sealDevice is a device of the round trip with its identity.
type sealDevice struct {
	name  string
	seed  []byte
	token string
}

func newSealDevice(t *testing.T, relay *relayProc, hh, name string) sealDevice {
	t.Helper()
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		t.Fatal(err)
	}
	d := sealDevice{name: name, seed: seed, token: relay.token(t, hh, name)}
	// Registered with its key before anyone seals: a sender seals only to
	// keys the directory lists.
	pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	body, _ := json.Marshal(map[string]string{"identity_key": base64.StdEncoding.EncodeToString(pub)})
	req, err := http.NewRequest("POST", relay.URL+"/v1/register", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("register %s: %s", name, resp.Status)
	}
	return d
}

func (d sealDevice) job(relay *relayProc, send *peerSend, receive int) peerJob {
	return peerJob{Relay: relay.URL, Token: d.token, Seed: hex.EncodeToString(d.seed), Send: send, Receive: receive, TimeoutMs: 30_000}
}

// runNodePeer runs typescript/dist/test/peer-main.js with job.
func runNodePeer(t *testing.T, job peerJob) (peerResult, error) {
	in, err := json.Marshal(job)
	if err != nil {
		return peerResult{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(tsDir, "dist", "test", "peer-main.js"))
	cmd.Env = cleanEnv()
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	dieWithTest(cmd)
	out, err := cmd.Output()
	if err != nil {
		return peerResult{}, fmt.Errorf("node peer: %w\n%s", err, stderr.String())
	}
	var res peerResult
	if err := json.Unmarshal(out, &res); err != nil {
		return peerResult{}, fmt.Errorf("node peer printed %q: %w", out, err)
	}
	t.Logf("node peer: %s", bytes.TrimSpace(out))
	return res, nil
}

// goPeer is the Go client's side of a round trip (client.Sealer): it
// registers its identity key, pins what the directory lists, seals and
// sends, then listens until it has opened or refused n envelopes.
func goPeer(ctx context.Context, relay *relayProc, me sealDevice, send peerSend, n int) (peerResult, error) {
	var res peerResult
	id, err := seal.IdentityFromSeed(me.seed)
	if err != nil {
		return res, err
	}
	ring, err := seal.OpenKeyring(ctx, &seal.MemoryStore{})
	if err != nil {
		return res, err
	}
	c, err := client.New(relay.URL, me.token, client.WithWait(5))
	if err != nil {
		return res, err
	}
	s, err := c.NewSealer(ctx, id, ring)
	if err != nil {
		return res, err
	}
	if _, err := s.SendSealed(ctx, send.ID, send.To, []byte(send.Plaintext)); err != nil {
		return res, fmt.Errorf("send: %w", err)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	err = s.ListenSealed(ctx, &client.MemoryCursor{}, &client.MemoryHeld{}, func(_ context.Context, e client.Envelope, plaintext []byte, openErr error) error {
		if openErr != nil {
			res.Refused = append(res.Refused, struct {
				ID   string `json:"id"`
				From string `json:"from"`
				Code string `json:"code"`
			}{e.ID, e.From, seal.Code(openErr)})
		} else {
			res.Got = append(res.Got, struct {
				ID        string `json:"id"`
				From      string `json:"from"`
				Plaintext string `json:"plaintext"`
			}{e.ID, e.From, string(plaintext)})
		}
		if len(res.Got)+len(res.Refused) >= n {
			stop()
		}
		return nil
	})
	if err != nil && len(res.Got)+len(res.Refused) < n {
		return res, fmt.Errorf("listen: %w", err)
	}
	res.OK = len(res.Got)+len(res.Refused) == n
	return res, nil
}

// TestSealedRoundTrips seals and opens across implementations through a
// real relay: a device in Go (client.Sealer), one in Node and one in
// headless Chromium (the browser's WebCrypto) each seal one envelope to
// all three, so that each opens one sealed by each: Go to Node and to
// Chromium, Node and Chromium to Go, Node to Chromium and back, and each
// to itself. The page also keeps pins in localStorage and reads them back.
func TestSealedRoundTrips(t *testing.T) {
	chromium := need(t, "chromium", "/usr/bin/chromium", "chromium-browser")
	need(t, "node")
	buildTypeScript(t)

	results := make(chan []byte, 1)
	var job atomic.Pointer[[]byte]
	mux := pageMux(results)
	mux.HandleFunc("GET /job.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(*job.Load())
	})
	page := httptest.NewServer(mux)
	t.Cleanup(page.Close)
	relay := startRelay(t, "FN_CORS_ORIGINS="+page.URL)

	const hh = "home"
	goDev := newSealDevice(t, relay, hh, "go")
	node := newSealDevice(t, relay, hh, "node")
	browser := newSealDevice(t, relay, hh, "browser")
	all := []string{"browser", "go", "node"}

	bj, err := json.Marshal(browser.job(relay, &peerSend{ID: "from-browser", To: all, Plaintext: "sealed in Chromium"}, 3))
	if err != nil {
		t.Fatal(err)
	}
	job.Store(&bj)

	var (
		wg             sync.WaitGroup
		nodeRes, goRes peerResult
		nodeErr, goErr error
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		nodeRes, nodeErr = runNodePeer(t, node.job(relay, &peerSend{ID: "from-node", To: all, Plaintext: "sealed in Node"}, 3))
	}()
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		goRes, goErr = goPeer(ctx, relay, goDev, peerSend{ID: "from-go", To: all, Plaintext: "sealed in Go"}, 3)
	}()
	b := openPage(t, chromium, page.URL+"/?run=/seal.js", results)
	wg.Wait()
	t.Logf("the page reported %s", b)
	var browserRes peerResult
	if err := json.Unmarshal(b, &browserRes); err != nil {
		t.Fatalf("the page reported %q: %v", b, err)
	}
	if nodeErr != nil {
		t.Fatal(nodeErr)
	}
	if goErr != nil {
		t.Fatal(goErr)
	}

	want := []string{"browser: sealed in Chromium", "go: sealed in Go", "node: sealed in Node"}
	for name, r := range map[string]peerResult{"go": goRes, "node": nodeRes, "browser": browserRes} {
		if !r.OK || len(r.Refused) > 0 {
			t.Errorf("%s: %+v", name, r)
			continue
		}
		if got := r.received(); !slices.Equal(got, want) {
			t.Errorf("%s opened %q, want %q", name, got, want)
		}
	}
	if want := hex.EncodeToString(ed25519.NewKeyFromSeed(browser.seed).Public().(ed25519.PublicKey)); browserRes.PublicKey != want {
		t.Errorf("the browser's public key from its seed is %s, want %s", browserRes.PublicKey, want)
	}
	if browserRes.LocalStorage == nil || !*browserRes.LocalStorage {
		t.Errorf("pins kept in localStorage did not read back: %v", browserRes.LocalStorage)
	}
}

// TestSealedDifferential opens in Go every variant of a TypeScript-sealed
// envelope that the TypeScript client opened (each bit flipped in turn,
// each prefix) and holds Go to the same result for each: the plaintext,
// or the same one of the format's errors. The test vectors check the other
// direction (Go seals, TypeScript opens) case by case.
func TestSealedDifferential(t *testing.T) {
	need(t, "node")
	buildTypeScript(t)
	cmd := exec.Command("node", filepath.Join(tsDir, "dist", "test", "differential.js"))
	cmd.Env = cleanEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	dieWithTest(cmd)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var d struct {
		Seeds    map[string]string `json:"seeds"`
		Sealed   string            `json:"sealed"`
		Flipped  []string          `json:"flipped"`
		Prefixes []string          `json:"prefixes"`
	}
	if err := json.Unmarshal(out, &d); err != nil {
		t.Fatal(err)
	}
	pins := map[string]ed25519.PublicKey{}
	var phone *seal.Identity
	for name, s := range d.Seeds {
		seed, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		id, err := seal.IdentityFromSeed(seed)
		if err != nil {
			t.Fatal(err)
		}
		pins[name] = id.Public()
		if name == "phone" {
			phone = id
		}
	}
	sealed, err := hex.DecodeString(d.Sealed)
	if err != nil || phone == nil {
		t.Fatalf("sealed %q, phone %v: %v", d.Sealed, phone, err)
	}
	open := func(b []byte) string {
		pt, err := seal.Open(seal.OpenParams{Household: "home", Device: "phone", Identity: phone, ID: "diff-1", From: "laptop", SenderKey: pins["laptop"], Sealed: b})
		if err != nil {
			return seal.Code(err)
		}
		if string(pt) != "the same answer in Go and TypeScript" {
			return "wrong plaintext " + string(pt)
		}
		return "ok"
	}
	if len(d.Flipped) != 8*len(sealed) || len(d.Prefixes) != len(sealed)+1 {
		t.Fatalf("%d flips and %d prefixes of %d bytes", len(d.Flipped), len(d.Prefixes), len(sealed))
	}
	if got := open(sealed); got != "ok" || d.Prefixes[len(sealed)] != "ok" {
		t.Fatalf("the envelope itself: Go %s, TypeScript %s", got, d.Prefixes[len(sealed)])
	}
	codes := map[string]int{}
	for i, want := range d.Flipped {
		b := bytes.Clone(sealed)
		b[i/8] ^= 1 << (i % 8)
		if got := open(b); got != want {
			t.Errorf("bit %d of byte %d flipped: Go %s, TypeScript %s", i%8, i/8, got, want)
		}
		codes[want]++
	}
	for n, want := range d.Prefixes[:len(sealed)] {
		if got := open(sealed[:n]); got != want {
			t.Errorf("the first %d bytes: Go %s, TypeScript %s", n, got, want)
		}
	}
	t.Logf("%d bytes: %d flips agree (%v), %d prefixes agree", len(sealed), len(d.Flipped), codes, len(sealed))
}
