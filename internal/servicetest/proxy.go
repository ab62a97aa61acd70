package servicetest

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP to a target, and can be cut (every connection closed,
// new ones refused), restored, or made to lose one answer.
type Proxy struct {
	tb     testing.TB
	target string
	// Addr is where clients connect: host:port on loopback.
	Addr string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	lose  bool // see LoseNextAnswer
	lost  int  // answers lost so far
	// accepted counts client connections, for tests of connection reuse.
	accepted int
	wg       sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target
// (host:port). It is cut when the test ends.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p := &Proxy{tb: tb, target: target, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p.Addr = ln.Addr().String()
	p.serve(ln)
	tb.Cleanup(func() { p.Cut(); p.wg.Wait() })
	return p
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = true, true
			p.accepted++
			p.mu.Unlock()
			p.wg.Go(func() { p.copy(up, c, false) })
			p.wg.Go(func() { p.copy(c, up, true) })
		}
	})
}

// copy forwards src to dst; answers (data from the target) may be lost.
func (p *Proxy) copy(dst, src net.Conn, answers bool) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if answers && p.takeLose() {
				src.Close()
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

func (p *Proxy) takeLose() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	lose := p.lose
	p.lose = false
	if lose {
		p.lost++
	}
	return lose
}

// AnswersLost is how many answers LoseNextAnswer has cost so far.
func (p *Proxy) AnswersLost() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

// Accepted is how many connections the proxy has forwarded.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// LoseNextAnswer makes the proxy cut the connection that next brings data
// back from the target, without passing it on: the request reached the
// target and its answer is lost, as when a commit reaches the database and
// the network fails before its answer.
func (p *Proxy) LoseNextAnswer() {
	p.mu.Lock()
	p.lose = true
	p.mu.Unlock()
}

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Restore listens again on the same address.
func (p *Proxy) Restore() {
	ln, err := net.Listen("tcp", p.Addr)
	if err != nil {
		p.tb.Fatal(err)
	}
	p.serve(ln)
}
