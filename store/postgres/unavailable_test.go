package postgres

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

// TestUnreachable opens a store on a port where nothing listens: the error
// is ErrUnavailable, at once.
func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	start := time.Now()
	_, err = Open(testCtx(t), Config{URL: "postgres://postgres@" + addr + "/postgres?sslmode=disable&connect_timeout=5"})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Open on a closed port = %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Open took %v to fail on a closed port", d)
	}
}

// TestBadURL: a URL that does not parse is refused without quoting it,
// since it may hold a password.
func TestBadURL(t *testing.T) {
	_, err := Open(testCtx(t), Config{URL: "postgres://relay:s3cret@127.0.0.1:notaport/db"})
	if err == nil {
		t.Fatal("Open with a bad URL succeeded")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %q quotes the password", err)
	}
}

// TestSilentServer opens a store on a server that accepts connections and
// never answers: Open gives up with ErrUnavailable when its ctx ends.
func TestSilentServer(t *testing.T) {
	p := startProxy(t, "")
	p.freeze()
	ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Open(ctx, Config{URL: "postgres://postgres@" + p.addr() + "/postgres?sslmode=disable"})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Open on a silent server = %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Open took %v to give up, want about its 300ms deadline", d)
	}
}

// TestHungDatabase opens a store through a proxy, then makes the database
// go silent mid-life, connections open: every call returns ErrUnavailable
// by its deadline instead of hanging, and Ping answers on its own
// connection within PingTimeout even with no deadline of its own.
func TestHungDatabase(t *testing.T) {
	raw, schema := newSchema(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, u.Host)
	u.Host = p.addr()
	db, err := Open(testCtx(t), Config{URL: u.String(), Schema: schema, MaxConns: 2})
	if err != nil {
		t.Fatalf("Open through proxy: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	// Close the proxy first: pgx sends a cancel request for each connection
	// that died mid-query and Close waits (up to 15 s) for the answer.
	t.Cleanup(p.close)
	register(t, db, "home", "a")
	if err := db.Ping(testCtx(t)); err != nil {
		t.Fatalf("Ping before the hang: %v", err)
	}

	p.freeze()
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"send", func(ctx context.Context) error {
			_, err := db.Send(ctx, store.SendParams{Household: "home", Sender: "a", ID: "1", To: []string{"a"}, Payload: []byte("x"), Now: t0})
			return err
		}},
		{"fetch", func(ctx context.Context) error {
			_, err := db.Fetch(ctx, store.FetchParams{Household: "home", Device: "a", Limit: 10})
			return err
		}},
		{"ack", func(ctx context.Context) error {
			_, err := db.Ack(ctx, store.AckParams{Household: "home", Device: "a", Cursor: 0, Now: t0})
			return err
		}},
		{"register", func(ctx context.Context) error {
			_, err := db.Register(ctx, store.RegisterParams{Household: "home", Device: "b", Now: t0})
			return err
		}},
		{"state", func(ctx context.Context) error {
			_, err := db.State(ctx, "home", "a")
			return err
		}},
		{"ack many", func(ctx context.Context) error {
			_, err := db.AckMany(ctx, []store.Ack{{Household: "home", Device: "a", Cursor: 0, Seen: t0}})
			return err
		}},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := c.call(ctx)
			if !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("%s on a hung database = %v, want ErrUnavailable", c.name, err)
			}
			// The deadline, plus the grace a cancel request gets.
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("%s returned after %v, want about its 300ms deadline", c.name, d)
			}
		})
	}

	start := time.Now()
	if err := db.Ping(context.Background()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Ping on a hung database = %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > PingTimeout+2*time.Second {
		t.Errorf("Ping returned after %v, want about PingTimeout (%v)", d, PingTimeout)
	}
}

// proxy forwards TCP connections to a target until frozen; frozen, it
// still accepts and reads but forwards nothing, like a database that hangs
// with its sockets open. An empty target never forwards.
type proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
	closed bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startProxy(tb testing.TB, target string) *proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	if target == "" {
		p.frozen = true
	}
	p.wg.Add(1)
	go p.serve()
	tb.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// close stops the proxy and its connections; it may be called again.
func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// track registers c to be closed with the proxy; false if it is closing.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

// thawed blocks while the proxy is frozen; false once it is closing.
func (p *proxy) thawed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.frozen && !p.closed {
		p.cond.Wait()
	}
	return !p.closed
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *proxy) handle(client net.Conn) {
	defer p.wg.Done()
	if !p.thawed() {
		return
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(server) {
		client.Close()
		return
	}
	p.wg.Add(2)
	go p.pipe(server, client)
	go p.pipe(client, server)
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.thawed() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
