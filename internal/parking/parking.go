// Package parking is the connection side of a parked poll: the lot that
// counts parked polls and waits for them at shutdown, the listener through
// which a parked connection goes back to its http.Server, the connection
// that replays the poll's request in front of whatever the client sends
// next, and the record (Resume) of how the parked wait ended, which the
// poll, read again, finds in its request's context.
//
// What parks and when is the relay's (relay/park.go); this package knows
// nothing of polls.
package parking

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Lot counts the parked polls and hands their connections back.
type Lot struct {
	// MaxHead is the server's MaxHeaderBytes: a poll whose head, rebuilt,
	// is longer must not park (it would be refused 431 when read again).
	MaxHead int
	// Parked is how many polls are parked now.
	Parked atomic.Int64

	ln *listener

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // parked polls not yet back in a handler
}

// New returns a lot whose listener has the address addr; maxHead is the
// server's MaxHeaderBytes (0: net/http's default).
func New(addr net.Addr, maxHead int) *Lot {
	if maxHead <= 0 {
		maxHead = http.DefaultMaxHeaderBytes // net/http's own when unset
	}
	return &Lot{MaxHead: maxHead, ln: &listener{conns: make(chan net.Conn), closed: make(chan struct{}), addr: addr}}
}

// Listener returns what the server serves to read parked polls again.
func (l *Lot) Listener() net.Listener { return l.ln }

// Enter counts a poll in before it parks; false once closing began. A poll
// counted in must be let out: by Back, or by Left if it never comes back.
func (l *Lot) Enter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Add(1)
	return true
}

// Left lets out a poll that will not be read again (its client hung up,
// or it never parked after all).
func (l *Lot) Left() { l.wg.Done() }

// Back hands conn back to the server, with replay read first and rs in
// the first request's context (see Take); false once the listener is
// closed, and the caller closes conn and calls rs.Release.
func (l *Lot) Back(conn net.Conn, replay []byte, rs *Resume) bool {
	rs.release = sync.OnceFunc(l.wg.Done)
	select {
	case l.ln.conns <- &replayConn{Conn: conn, prefix: replay, resume: rs}:
		return true
	case <-l.ln.closed:
		return false
	}
}

// Close stops new parking and waits, until ctx ends, for every parked poll
// to come back: its request read again and in its handler.
func (l *Lot) Close(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	done := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// CloseListener stops handing connections back.
func (l *Lot) CloseListener() { l.ln.Close() }

// Unwrap returns the connection under one handed back, and the bytes it still
// had to replay; for a connection not handed back, conn itself.
func Unwrap(conn net.Conn) (net.Conn, []byte) {
	if rc, ok := conn.(*replayConn); ok {
		return rc.Conn, rc.prefix
	}
	return conn, nil
}

// listener hands connections back to the server.
type listener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
	addr   net.Addr
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *listener) Addr() net.Addr { return l.addr }

// replayConn is a connection given back: prefix is read first.
type replayConn struct {
	net.Conn
	prefix []byte
	resume *Resume
}

// Close counts a poll whose request the server dropped unread (a
// connection handed back as the server shut down) as come back.
func (c *replayConn) Close() error {
	if c.resume != nil {
		c.resume.Release()
	}
	return c.Conn.Close()
}

func (c *replayConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// Resume is how a parked poll's wait ended, for the poll read again.
type Resume struct {
	Start time.Time // when the poll first arrived
	// Checked is when its token was first found good (the relay's
	// clock): a poll read again is judged as of then, so that a token
	// expiring while its poll is held does not refuse the answer, as it
	// would not for a poll held in its handler.
	Checked  time.Time
	Deadline time.Time // its wait's end
	Err      error     // nil: woken; else the wait's error

	taken   atomic.Bool
	release func()
}

// Release counts the poll as come back once its request reached the
// handler: the server, shutting down, drops requests it reads after
// Shutdown began, so Lot.Close waits until then. Safe to call more than
// once.
func (r *Resume) Release() {
	if r.release != nil {
		r.release()
	}
}

type connKey struct{}

// ConnContext gives a connection handed back its Resume, for the first
// request read from it (http.Server.ConnContext).
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if rc, ok := c.(*replayConn); ok && rc.resume != nil {
		return context.WithValue(ctx, connKey{}, rc.resume)
	}
	return ctx
}

// Take returns the Resume of the connection ctx belongs to, once: to its
// first request only, which is the poll read again; it counts the poll as
// come back. Nil for any other request.
func Take(ctx context.Context) *Resume {
	rs, ok := ctx.Value(connKey{}).(*Resume)
	if !ok || !rs.taken.CompareAndSwap(false, true) {
		return nil
	}
	rs.Release()
	return rs
}
