package relay

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flamenet/relay/wake"
)

// Parking: a held poll with nothing to answer gives its connection up
// while it waits.
//
// Held by net/http, a poll keeps its connection's goroutine (with the
// stack its request needed), a goroutine watching for a hang-up, 10 KiB of
// read, write and response buffers, and the parsed request: most of a
// relay's memory with thousands held. Parked, it keeps the connection, its
// request's bytes, its registration with the hub and one goroutine,
// blocked in a read of the connection (a hang-up ends it) whose deadline
// is the poll's; the hub's news moves that deadline to the past.
//
// When the wait ends, the connection goes back to the same http.Server
// through a listener of its own, with the request's bytes in front of
// whatever the client sends next. The server reads the poll again, and the
// poll, finding how its wait ended (resumeOf), answers at once through the
// same middleware as any request: the access log, metrics, CORS and errors
// have one path. A poll that parks is logged and counted once, when it
// answers, with its whole duration. A client that hangs up while parked is
// logged and counted here, as a held poll's hang-up is.
//
// Only plain HTTP/1.1 polls without a body park, and only when their
// request, rebuilt, fits the server's header bound; anything else (HTTP/2,
// Connection: close, a handler served without Serve) waits as before, as
// every poll does with FN_PARK_POLLS=off: parking trades CPU (each answer
// reads its request again) for memory.
type parking struct {
	ln *parkListener
	// maxHead is the server's MaxHeaderBytes: a poll whose head, rebuilt,
	// is longer does not park.
	maxHead int
	// now is how many polls are parked.
	now atomic.Int64

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // parked polls not yet handed back
}

func newParking(addr net.Addr, maxHead int) *parking {
	if maxHead <= 0 {
		maxHead = http.DefaultMaxHeaderBytes // net/http's own when unset
	}
	return &parking{maxHead: maxHead, ln: &parkListener{conns: make(chan net.Conn), closed: make(chan struct{}), addr: addr}}
}

// add counts a poll in; false once closing began.
func (pk *parking) add() bool {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.closed {
		return false
	}
	pk.wg.Add(1)
	return true
}

// close stops new parking and waits, until ctx ends, for every parked poll
// to come back: its request read again and in its handler (the hub,
// closing, ends their waits).
func (pk *parking) close(ctx context.Context) error {
	pk.mu.Lock()
	pk.closed = true
	pk.mu.Unlock()
	done := make(chan struct{})
	go func() {
		pk.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// parkListener hands connections back to the server.
type parkListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
	addr   net.Addr
}

func (l *parkListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *parkListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *parkListener) Addr() net.Addr { return l.addr }

// give hands c to the server; false once the listener is closed.
func (l *parkListener) give(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.closed:
		return false
	}
}

// replayConn is a connection given back: prefix is read first.
type replayConn struct {
	net.Conn
	prefix []byte
	resume *resume
}

// Close counts a poll whose request the server dropped unread (a
// connection handed back as the server shut down) as come back.
func (c *replayConn) Close() error {
	if c.resume != nil {
		c.resume.release()
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

// resume is how a parked poll's wait ended, for the poll read again.
type resume struct {
	start time.Time // when the poll first arrived
	// checked is when its token was first found good (the relay's
	// clock): a poll read again is judged as of then, so that a token
	// expiring while its poll is held does not refuse the answer, as it
	// would not for a poll held in its handler.
	checked  time.Time
	deadline time.Time // its wait's end
	err      error     // nil: woken; else the wait's error
	taken    atomic.Bool
	// release counts the poll as come back once its request reached the
	// handler: the server, shutting down, drops requests it reads after
	// Shutdown began, so Shutdown waits until then.
	release func()
}

type connResumeKey struct{}
type resumeKey struct{}

// connContext gives a connection handed back its resume, for the first
// request read from it.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if rc, ok := c.(*replayConn); ok && rc.resume != nil {
		return context.WithValue(ctx, connResumeKey{}, rc.resume)
	}
	return ctx
}

// takeResume moves a connection's resume to its first request only; it
// wraps the whole API.
func takeResume(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rs, ok := r.Context().Value(connResumeKey{}).(*resume); ok && rs.taken.CompareAndSwap(false, true) {
			rs.release()
			r = r.WithContext(context.WithValue(r.Context(), resumeKey{}, rs))
		}
		next.ServeHTTP(w, r)
	})
}

// resumeOf is how the wait of the poll being read again ended; nil for a
// request that did not park.
func resumeOf(ctx context.Context) *resume {
	rs, _ := ctx.Value(resumeKey{}).(*resume)
	return rs
}

// errParked: the poll parked; its answer comes when it is read again.
var errParked = errors.New("relay: poll parked")

// aLongTimeAgo ends a pending read at once.
var aLongTimeAgo = time.Unix(1, 0)

// parked is a poll waiting without its request's goroutine.
type parked struct {
	conn     net.Conn
	replay   []byte // the request, and anything the client sent after it
	poll     *pollState
	start    time.Time
	checked  time.Time
	deadline time.Time
	early    bool // the client sent more after the poll: answer now
	// For the access log line of a hang-up, which is rare: the client's
	// address is worked out only then.
	remote, query, household, device string
	forwarded                        []string
}

// park gives the poll's connection up until its wait ends; false when it
// cannot, and the poll waits as before.
func (s *Server) park(w http.ResponseWriter, r *http.Request, p *pollState, deadline time.Time) bool {
	pk := s.parking
	if pk == nil || !s.cfg.ParkPolls || r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.Close ||
		r.ContentLength != 0 || len(r.TransferEncoding) != 0 || s.draining.Load() {
		return false
	}
	watcher, ok := p.waiter.(wake.Watcher)
	if !ok {
		return false
	}
	var req bytes.Buffer
	req.Grow(256 + len(r.RequestURI))
	req.WriteString(r.Method)
	req.WriteByte(' ')
	req.WriteString(r.RequestURI)
	req.WriteString(" HTTP/1.1\r\nHost: ")
	req.WriteString(r.Host)
	req.WriteString("\r\n")
	if err := r.Header.Write(&req); err != nil {
		return false
	}
	req.WriteString("\r\n")
	// Rebuilt, the head can be longer than as sent (Header.Write puts a
	// space after each colon): past the server's bound it would be refused
	// 431 when read again, after the whole wait. Such a poll waits here.
	// The bound is below net/http's own (it adds 4 KiB of slack), so a
	// head that passes it is always read again.
	if req.Len() > pk.maxHead {
		return false
	}

	if !pk.add() {
		return false
	}
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		pk.wg.Done()
		return false
	}
	// Bytes the client sent after the poll (it should not have: it is
	// pipelining, or confused) are kept for the server to read after it,
	// and the poll answers at once, as it does when they come later.
	early := false
	if n := rw.Reader.Buffered(); n > 0 {
		b, _ := rw.Reader.Peek(n)
		req.Write(b)
		early = true
	}
	if rc, ok := conn.(*replayConn); ok {
		early = early || len(rc.prefix) > 0
		req.Write(rc.prefix)
		conn = rc.Conn
	}
	start, checked := time.Now(), s.now()
	if rs := resumeOf(r.Context()); rs != nil {
		start, checked = rs.start, rs.checked
	}
	it := &parked{
		conn: conn, replay: req.Bytes(), poll: p, start: start, checked: checked, deadline: deadline, early: early,
		remote: r.RemoteAddr, forwarded: r.Header.Values("X-Forwarded-For"), query: r.URL.RawQuery,
	}
	if e := accessOf(r.Context()); e != nil {
		e.detached = true
		it.household, it.device = e.household, e.device
	}
	if o, ok := r.Context().Value(pollOutcomeKey{}).(*pollOutcome); ok {
		o.detached = true
	}
	p.parked = true // the wait, not the handler, ends the poll now
	pk.now.Add(1)
	go s.waitParked(it, watcher)
	return true
}

// waitParked holds the parked poll on one goroutine, blocked in a read of
// its connection: the read ends with a hang-up, with bytes from the client,
// at the poll's deadline (the read's own), or when the waiter's news sets
// the deadline in the past. Then the connection is handed back (or closed,
// after a hang-up).
func (s *Server) waitParked(it *parked, w wake.Watcher) {
	pk := s.parking
	conn := it.conn
	_ = conn.SetReadDeadline(it.deadline)
	// News sets the read's deadline in the past. The waiter is closed
	// (release) before the connection is handed back: after that no news
	// can reach it, so the callback never touches a connection that is the
	// server's again.
	w.Watch(func() { _ = conn.SetReadDeadline(aLongTimeAgo) })
	if it.early {
		_ = conn.SetReadDeadline(aLongTimeAgo)
	}
	var b [1]byte
	n, err := conn.Read(b[:])
	ready, werr := w.Ready() // before release, which ends the waiter
	it.poll.release()
	pk.now.Add(-1)
	_ = conn.SetReadDeadline(time.Time{})

	// Not errors.As: it is a reflection walk, on every parked poll.
	if n == 0 && !errors.Is(err, os.ErrDeadlineExceeded) {
		_ = conn.Close()
		s.hungUpParked(it)
		pk.wg.Done()
		return
	}
	rs := &resume{start: it.start, checked: it.checked, deadline: it.deadline, err: werr, release: sync.OnceFunc(pk.wg.Done)}
	switch {
	case n == 1 || it.early:
		// The client sent more while its poll was held: the poll answers
		// now, and what was sent is read after it.
		if n == 1 {
			it.replay = append(it.replay, b[0])
		}
		rs.err = context.DeadlineExceeded
	case !ready:
		rs.err = context.DeadlineExceeded // the read's deadline is the poll's
	case werr == nil:
		// Woken: the poll reads its position again.
	case !errors.Is(werr, wake.ErrSuperseded) && !errors.Is(werr, wake.ErrRemoved) && !errors.Is(werr, wake.ErrClosed):
		rs.err = context.DeadlineExceeded
	}
	if !pk.ln.give(&replayConn{Conn: conn, prefix: it.replay, resume: rs}) {
		_ = conn.Close()
		s.hungUpParked(it)
		rs.release()
	}
}

// hungUpParked logs and counts a parked poll whose client went away.
func (s *Server) hungUpParked(it *parked) {
	took := time.Since(it.start)
	s.metrics.pollSeconds.Observe(took.Seconds())
	s.metrics.polls.WithLabelValues(pollHangup).Inc()
	if s.cfg.AccessLog && s.logs.access.Enabled(context.Background(), accessLevel) {
		s.writeAccess(context.Background(), accessLine{
			method: http.MethodGet, route: "/v1/poll", status: statusHangup, took: took,
			client:    clientAddr(it.remote, it.forwarded, s.cfg.TrustedProxies),
			household: it.household, device: it.device, outcome: pollHangup, query: it.query,
		})
	}
}
