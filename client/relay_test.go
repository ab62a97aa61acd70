package client_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/relay"
	"github.com/flamenet/relay/store/sqlite"
	"github.com/flamenet/relay/token"
	"github.com/flamenet/relay/wake/local"
)

// testRelay is a relay on SQLite with the in-process hub, serving real
// HTTP on a loopback socket.
type testRelay struct {
	URL string
	key ed25519.PrivateKey
	srv *relay.Server
	db  *sqlite.DB
	out chan error
}

// startRelay starts a relay keeping its data in dir; mutate may change its
// settings.
func startRelay(dir string, mutate func(*relay.Config)) (*testRelay, error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	var cfg relay.Config
	config.Default().CopyTo(&cfg)
	cfg.IssuerKeys = []ed25519.PublicKey{pub}
	cfg.HouseholdSendRate, cfg.HouseholdSendBurst = cfg.SendRate, cfg.SendBurst
	if mutate != nil {
		mutate(&cfg)
	}
	db, err := sqlite.Open(context.Background(), sqlite.Config{Path: filepath.Join(dir, "relay.db"), Synchronous: "NORMAL"})
	if err != nil {
		return nil, err
	}
	srv, err := relay.New(cfg, relay.Deps{Store: db, Hub: local.New(nil)})
	if err != nil {
		db.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		db.Close()
		return nil, err
	}
	r := &testRelay{URL: "http://" + ln.Addr().String(), key: key, srv: srv, db: db, out: make(chan error, 1)}
	go func() { r.out <- srv.Serve(ln) }()
	return r, nil
}

func (r *testRelay) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	err := r.srv.Shutdown(ctx)
	if serr := <-r.out; err == nil {
		err = serr
	}
	if cerr := r.db.Close(); err == nil {
		err = cerr
	}
	return err
}

// token mints a device token of household.
func (r *testRelay) token(household, device string) string {
	now := time.Now()
	tok, err := token.Mint(r.key, token.Claims{Household: household, Device: device, IssuedAt: now, Expires: now.Add(time.Hour)})
	if err != nil {
		panic(err)
	}
	return tok
}

// newRelay starts a relay for one test.
func newRelay(t *testing.T, mutate func(*relay.Config)) *testRelay {
	t.Helper()
	r, err := startRelay(t.TempDir(), mutate)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("stopping the relay: %v", err)
		}
	})
	return r
}

// shared serves the examples, which cannot start their own.
var shared *testRelay

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "client-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared, err = startRelay(dir, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	relayURL = shared.URL
	code := m.Run()
	if err := shared.stop(); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, "stopping the shared relay:", err)
		code = 1
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// relayURL and tokenFor are what the examples use to reach the test relay.
var relayURL string

func tokenFor(household, device string) string { return shared.token(household, device) }
