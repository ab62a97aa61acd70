package relay

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/flamenet/relay/internal/parking"
	"github.com/flamenet/relay/wake"
)

// Parking: a held poll with nothing to answer gives its connection up
// while it waits. This file is what parks and when; the connection's side
// (the lot, the listener that hands connections back, the replay, how the
// wait ended) is internal/parking.
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
// poll, finding how its wait ended (its record's resume), answers at once
// through the same middleware as any request: the access log, metrics,
// CORS and errors have one path. A poll that parks is logged and counted once, when it
// answers, with its whole duration. A client that hangs up while parked is
// logged and counted here, as a held poll's hang-up is.
//
// Only plain HTTP/1.1 polls without a body park, and only when their
// request, rebuilt, fits the server's header bound; anything else (HTTP/2,
// Connection: close, a handler served without Serve) waits as before, as
// every poll does with FN_PARK_POLLS=off: parking trades CPU (each answer
// reads its request again) for memory.

// errParked: the poll parked; its answer comes when it is read again.
var errParked = errors.New("relay: poll parked")

// aLongTimeAgo ends a pending read at once.
var aLongTimeAgo = time.Unix(1, 0)

// parked is a poll waiting without its request's goroutine.
type parked struct {
	conn     net.Conn
	replay   []byte // the request, and anything the client sent after it
	poll     *pollState
	account  detached // the request's record's; closed here only if the client hangs up
	checked  time.Time
	deadline time.Time
	early    bool // the client sent more after the poll: answer now
}

// park gives the poll's connection up until its wait ends; false when it
// cannot, and the poll waits as before.
func (s *Server) park(w http.ResponseWriter, r *http.Request, p *pollState, deadline time.Time) bool {
	pk := s.parking
	if pk == nil || !s.cfg.ParkPolls || r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.Close ||
		r.ContentLength != 0 || len(r.TransferEncoding) != 0 || s.readiness.Draining() {
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
	if req.Len() > pk.MaxHead {
		return false
	}

	if !pk.Enter() {
		return false
	}
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		pk.Left()
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
	conn, left := parking.Unwrap(conn)
	if len(left) > 0 {
		early = true
		req.Write(left)
	}
	checked := s.now()
	if p.resume != nil {
		checked = p.resume.Checked
	}
	// The request's record is detached: its account is closed when the
	// poll, read again, answers, or by the parked goroutine if the client
	// hangs up meanwhile.
	it := &parked{conn: conn, replay: req.Bytes(), poll: p, account: recordOf(r.Context()).detach(), checked: checked, deadline: deadline, early: early}
	p.parked = true // the wait, not the handler, ends the poll now
	pk.Parked.Add(1)
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
	pk.Parked.Add(-1)
	_ = conn.SetReadDeadline(time.Time{})

	// Not errors.As: it is a reflection walk, on every parked poll.
	if n == 0 && !errors.Is(err, os.ErrDeadlineExceeded) {
		_ = conn.Close()
		s.hungUpParked(it)
		pk.Left()
		return
	}
	rs := &parking.Resume{Start: it.account.start, Checked: it.checked, Deadline: it.deadline, Err: werr}
	switch {
	case n == 1 || it.early:
		// The client sent more while its poll was held: the poll answers
		// now, and what was sent is read after it.
		if n == 1 {
			it.replay = append(it.replay, b[0])
		}
		rs.Err = context.DeadlineExceeded
	case !ready:
		rs.Err = context.DeadlineExceeded // the read's deadline is the poll's
	case werr == nil:
		// Woken: the poll reads its position again.
	case !errors.Is(werr, wake.ErrSuperseded) && !errors.Is(werr, wake.ErrRemoved) && !errors.Is(werr, wake.ErrClosed):
		rs.Err = context.DeadlineExceeded
	}
	if !pk.Back(conn, it.replay, rs) {
		_ = conn.Close()
		s.hungUpParked(it)
		rs.Release()
	}
}

// hungUpParked closes the account of a parked poll whose client went away,
// as a held poll's hang-up is.
func (s *Server) hungUpParked(it *parked) {
	s.finish(context.Background(), it.account.hungUp())
}
