package relay

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flamenet/relay/internal/parking"
	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/token"
	"github.com/flamenet/relay/wake"
)

// Streams: GET /v1/stream holds one answer per device open and writes
// each batch of envelopes into it as an event, as Server-Sent Events or,
// for Accept: application/x-ndjson, as JSON lines. It is a second writer
// of the poll's delivery (open, deliver, woken in poll.go): the same
// cursor and epoch rules, budget, answer bounds, supersession and removal.
// What differs is only what happens between two batches: a poll answers
// and ends, a stream writes an event and waits again.
//
// A stream over HTTP/1.1 takes its connection from net/http once it
// starts (a poll parks only while it waits; a stream would park between
// every two events): it then keeps one goroutine, blocked in a read of the
// connection as a parked poll's is, and no request buffers. Over HTTP/2 it
// waits in its handler.

// Why a stream ended, in its last event's reason and fn_streams_total.
const (
	streamSuperseded = "superseded" // a newer stream or poll of the device
	streamDrained    = "drained"    // the relay is shutting down: come back
	streamExpired    = "expired"    // its life ran out: come back at once
	streamRemoved    = "removed"    // the device was removed (status 401)
	streamError      = "error"      // refused mid-stream (status, error)
	streamHangup     = "hangup"     // the client went away; nothing written
	streamCut        = "cut"        // the client stopped reading: cut
)

var streamOutcomes = []string{streamSuperseded, streamDrained, streamExpired, streamRemoved, streamError, streamHangup, streamCut}

// Stream life and keep-alive: a comment (SSE) or a ping line (NDJSON)
// 15 to 25 s after the last thing written keeps idle proxies and NATs
// from dropping the connection; a stream ends after at most its life (FN_STREAM_LIFE, less
// up to a tenth, and never past its token's expiry), so that its client
// comes back with a fresh token and a fresh connection.
const (
	streamPingMin  = 15 * time.Second
	streamPingSpan = 10 * time.Second
)

const (
	contentSSE    = "text/event-stream"
	contentNDJSON = "application/x-ndjson"
)

// errHungUp: the stream's client closed its side, or sent bytes after its
// request (a stream reads nothing more).
var errHungUp = errors.New("relay: stream client went away")

// errCut: writing an event failed, past its deadline or to a client gone.
var errCut = errors.New("relay: stream write failed")

// stream is one device's open stream.
type stream struct {
	s      *Server
	c      *token.Claims
	r      *http.Request
	p      *pollState
	ctx    context.Context
	ndjson bool
	ends   time.Time // its life's end

	// Hijacked: the connection, and its account's record.
	conn    net.Conn
	account detached
	early   bool // the client sent more after its request
	one     [1]byte
	// Held in its handler (HTTP/2): the writer.
	w http.ResponseWriter

	bytes  int64
	buf    []byte
	pingAt time.Time // when the next keep-alive is due

	// Delivery by the sender (inline.go). mu is held by whoever writes
	// to the stream: its goroutine, except while it waits in its read,
	// or a sender that found it waiting.
	mu      sync.Mutex
	sctx    context.Context // a sender's delivery's: no store calls
	watcher wake.Watcher
	raw     syscall.RawConn // nil: no sender writes to this stream
	inline  atomic.Bool     // a sender holds mu and takes the news its Signal brings
	sender  bool            // a sender is writing: never block
	back    handBack        // what a sender left to the goroutine
	failed  error           // the refusal a sender met, which ends the stream
	unsent  []byte          // what a sender's write could not hand the kernel
}

// stream is GET /v1/stream.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	q, err := parseStream(r)
	if err != nil {
		return err
	}
	if s.readiness.Draining() {
		return errDraining
	}
	p, err := s.open(r.Context(), c, q, nil)
	if err != nil {
		if p != nil {
			p.release()
		}
		return err
	}
	if p.q.epoch == "" {
		// Pinned: a stream that learns of a new epoch mid-stream ends, so
		// that its client resynchronises, whether or not it named one.
		p.q.epoch = p.pos.Epoch
	}
	st := &stream{s: s, c: c, r: r, p: p, ndjson: acceptsNDJSON(r), ends: s.streamEnds(c)}
	h := w.Header()
	if st.ndjson {
		h.Set("Content-Type", contentNDJSON)
	} else {
		h.Set("Content-Type", contentSSE)
	}
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: pass events on as they come
	if st.hijack(w) {
		go st.run()
		return nil
	}
	st.w, st.ctx = w, r.Context()
	w.WriteHeader(http.StatusOK)
	st.run()
	return nil
}

// parseStream reads a stream's query: a poll's cursor and epoch (its wait
// and limit do not apply), and a Last-Event-ID above the cursor in the
// cursor's place, which is how a reconnecting EventSource names what it
// has.
func parseStream(r *http.Request) (pollQuery, error) {
	q, err := parseQuery(r)
	if err != nil {
		return pollQuery{}, err
	}
	cursor, err := q.int("cursor", -1, 0, math.MaxInt64)
	if err != nil {
		return pollQuery{}, err
	}
	epoch, err := q.epoch()
	if err != nil {
		return pollQuery{}, err
	}
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil || n < 0 {
			return pollQuery{}, badRequest("Last-Event-ID must be a seq, as the stream's events name them.")
		}
		cursor = max(cursor, n)
	}
	// wait only needs to be above zero: it registers the waiter.
	return pollQuery{cursor: cursor, epoch: epoch, limit: maxPollLimit, wait: time.Hour}, nil
}

func acceptsNDJSON(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(v, contentNDJSON) {
			return true
		}
	}
	return false
}

// streamEnds is when a stream starting now ends: its life, less up to a
// tenth (streams that started together end apart), and not past its
// token's expiry.
func (s *Server) streamEnds(c *token.Claims) time.Time {
	life := s.cfg.StreamLife
	if life <= 0 {
		life = DefaultStreamLife
	}
	life -= time.Duration(rand.Int64N(int64(life/10) + 1))
	if !c.Expires.IsZero() {
		// The token's expiry is judged on the relay's clock, as its
		// checks are.
		life = min(life, c.Expires.Sub(s.now()))
	}
	return time.Now().Add(life)
}

// DefaultStreamLife is FN_STREAM_LIFE's default.
const DefaultStreamLife = 10 * time.Minute

// hijack takes the stream's connection from net/http and writes the
// answer's head; false when it cannot (HTTP/2, a server without Serve, a
// relay closing), and the stream is held in its handler.
func (st *stream) hijack(w http.ResponseWriter) bool {
	s, r := st.s, st.r
	pk := s.parking
	if pk == nil || r.ProtoMajor != 1 || !pk.Enter() {
		return false
	}
	header := w.Header() // before the record lets its writer go
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		pk.Left()
		return false
	}
	// Anything the client sent after its request is not read: a stream
	// takes nothing more from its client, and ends when it sends more.
	conn, left := parking.Unwrap(conn)
	st.conn, st.early = conn, rw.Reader.Buffered() > 0 || len(left) > 0
	st.watcher = st.p.waiter.(wake.Watcher) // every hub's waiters are
	st.watcher.Watch(st.news)
	if sc, ok := conn.(syscall.Conn); ok && sendersWrite {
		st.raw, _ = sc.SyscallConn()
	}
	// The request is let go: for its whole life the stream keeps only what
	// its events need, the record (its store deadline) in a context of its
	// own and the route in a request of its own, not the parsed request,
	// its headers and its contexts (about 1.5 KiB a stream).
	ctx := context.Background()
	if rec := recordOf(r.Context()); rec != nil {
		st.account = rec.detach()
		ctx = context.WithValue(ctx, recordKey{}, rec)
	}
	st.ctx = ctx
	st.r = (&http.Request{Method: http.MethodGet, URL: streamURL}).WithContext(ctx)
	// The head is written by hand, with the headers the middleware set
	// (CORS, the type): the body runs to the connection's close, which
	// every HTTP/1.1 client and proxy reads, and which a stream's end
	// needs anyway.
	b := append(st.buf[:0], "HTTP/1.1 200 OK\r\n"...)
	hw := bytesWriter{&b}
	_ = header.Write(hw)
	b = append(b, "Connection: close\r\n\r\n"...)
	st.buf = b
	return true
}

// bytesWriter appends to a byte slice.
type bytesWriter struct{ b *[]byte }

func (w bytesWriter) Write(p []byte) (int, error) {
	*w.b = append(*w.b, p...)
	return len(p), nil
}

// run writes the stream's events until it ends, then closes it. Its
// goroutine holds mu but while it waits, and keeps it once the loop is
// over: no sender writes to a stream that ended.
func (st *stream) run() {
	st.mu.Lock()
	outcome := st.loop()
	s := st.s
	s.senderMayWrite(st, false)
	st.p.release()
	s.endStream(outcome)
	if st.conn == nil {
		if rec := recordOf(st.r.Context()); rec != nil {
			rec.outcome = outcome
		}
		return
	}
	_ = st.conn.Close()
	status := int32(http.StatusOK)
	s.finish(context.Background(), st.account.closed(routeStream, outcome, status, st.bytes))
	s.parking.Left()
}

// endStream counts a stream that ended.
func (s *Server) endStream(outcome string) {
	s.metrics.streams.WithLabelValues(outcome).Inc()
}

// routeStream is the stream's route.
const routeStream = "/v1/stream"

// streamURL is a hijacked stream's request's URL: its route, for logs.
var streamURL = &url.URL{Path: routeStream}

// loop is the stream's delivery: a poll's hold that writes each batch as
// an event and waits again. It returns the stream's outcome.
func (st *stream) loop() string {
	s, p := st.s, st.p
	if err := st.event("ready", p.after, store.Batch{Epoch: p.pos.Epoch}); err != nil {
		return streamCut
	}
	if st.early {
		return streamHangup // it is pipelining, or confused: nobody reads this
	}
	s.senderMayWrite(st, true)
	for {
		if p.pos.Pending(p.after) {
			startStoreBudget(st.ctx, s.cfg.StoreTimeout)
			done, err := s.deliver(st.ctx, st.r, st.c, p, st.batch)
			if err != nil {
				return st.fail(err)
			}
			if done {
				continue
			}
		}
		now := time.Now()
		if !now.Before(st.ends) {
			return st.end(streamExpired, nil)
		}
		if !now.Before(st.pingAt) {
			if err := st.ping(); err != nil {
				return streamCut
			}
		}
		until := st.pingAt
		if st.ends.Before(until) {
			until = st.ends
		}
		err := st.wait(until)
		if errors.Is(err, errHandedBack) {
			// A sender delivered, or began to: the rest is the goroutine's.
			back, failed := st.takeBack()
			if len(st.unsent) > 0 && st.writeUnsent() != nil {
				return streamCut
			}
			switch {
			case failed != nil:
				return st.fail(failed)
			case back == backDeliver:
				continue // the news was read: deliver it, above
			}
			err = nil // back == backWoken: the news is yet to be read
		}
		switch {
		case err == nil:
			startStoreBudget(st.ctx, s.cfg.StoreTimeout)
			if err := s.woken(st.ctx, st.r, st.c, p); err != nil {
				return st.fail(err)
			}
		case errors.Is(err, context.DeadlineExceeded):
			// A ping is due, or the stream's life is over: both above.
		case errors.Is(err, wake.ErrSuperseded):
			return st.end(streamSuperseded, nil)
		case errors.Is(err, wake.ErrClosed):
			return st.end(streamDrained, nil)
		case errors.Is(err, wake.ErrRemoved):
			return st.fail(s.refuseToken(st.r, refusedRemoved, nil))
		default: // the client went away
			return streamHangup
		}
	}
}

// streamPing is when the next keep-alive is due.
func (s *Server) streamPing() time.Time {
	if d := s.hooks.streamPing; d > 0 {
		return time.Now().Add(d)
	}
	return time.Now().Add(streamPingMin + rand.N(streamPingSpan))
}

// wait waits for news until deadline: nil for news, else a waiter's end,
// context.DeadlineExceeded, errHungUp, or errHandedBack when a sender
// delivered in the meantime and left the stream something to do.
func (st *stream) wait(deadline time.Time) error {
	if st.conn == nil {
		return st.s.wait(st.ctx, st.p.waiter, deadline)
	}
	watcher := st.watcher
	for {
		// The deadline is set before news is looked for: news that comes
		// after the look moves the deadline back to the past, so the read
		// returns at once; news that came before it, the look takes.
		// TestStreamNoLostWakeup goes red with the two swapped.
		_ = st.conn.SetReadDeadline(deadline)
		if st.s.hooks.streamLook != nil {
			st.s.hooks.streamLook()
		}
		if ready, err := watcher.Ready(); ready {
			return err
		}
		// While it reads, a sender may deliver to it (inline.go).
		st.mu.Unlock()
		n, err := st.conn.Read(st.one[:])
		st.mu.Lock()
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return errHungUp
		}
		if st.back != backNone || st.failed != nil {
			return errHandedBack
		}
		if ready, err := watcher.Ready(); ready {
			return err
		}
		if !time.Now().Before(deadline) {
			return context.DeadlineExceeded
		}
		// Woken for a signal Ready took already: wait on.
	}
}

// batch writes b as the stream's next event.
func (st *stream) batch(b store.Batch) error {
	return st.event("envelopes", b.Envelopes[len(b.Envelopes)-1].Seq, b)
}

// event writes one event carrying an answer as a poll's would be, with id
// the cursor it brings the device to.
func (st *stream) event(name string, id int64, b store.Batch) error {
	var prefix, suffix string
	seq := strconv.FormatInt(id, 10)
	if st.ndjson {
		prefix, suffix = `{"event":"`+name+`","id":"`+seq+`","data":`, "}\n"
	} else {
		prefix, suffix = "id: "+seq+"\nevent: "+name+"\ndata: ", "\n\n"
	}
	if !st.sender {
		st.deadline(batchAnswerSize(b))
	}
	if err := encodeAnswer(st, false, id, b, prefix, suffix); err != nil {
		return errCut
	}
	return st.flush()
}

// flush sends what the handler's writer holds (a hijacked connection
// holds nothing), and puts the next keep-alive a ping's interval after
// it: a stream whose events come more often than that needs none, and a
// sleeping phone's radio wakes for none.
func (st *stream) flush() error {
	st.pingAt = st.s.streamPing()
	if st.conn != nil {
		return nil
	}
	return http.NewResponseController(st.w).Flush()
}

// ping writes a keep-alive.
func (st *stream) ping() error {
	st.deadline(0)
	line := ": ping\n\n"
	if st.ndjson {
		line = `{"event":"ping"}` + "\n"
	}
	if _, err := io.WriteString(st, line); err != nil {
		return errCut
	}
	return st.flush()
}

// streamEnd is the data of a stream's last event.
type streamEnd struct {
	Reason string `json:"reason"`
	// A refusal mid-stream: what the request would have been answered.
	Status  int    `json:"status,omitempty"`
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`
	Head    *int64 `json:"head,omitempty"`
	Epoch   string `json:"epoch,omitempty"`
	Limit   string `json:"limit,omitempty"`
}

// fail ends the stream with the refusal err.
func (st *stream) fail(err error) string {
	if errors.Is(err, errCut) {
		return streamCut
	}
	if errors.Is(err, store.ErrRemoved) {
		err = st.s.refuseToken(st.r, refusedRemoved, nil)
	}
	st.s.storeFailed(err)
	he := fromStore(err)
	reason := streamError
	if he == errUnauthorized {
		reason = streamRemoved
	}
	if he.Status >= 500 {
		st.s.log.LogAttrs(st.ctx, slog.LevelError, "stream failed", slog.String("path", routeStream), slog.Int("status", he.Status), slog.Any("err", he))
	}
	return st.end(reason, &streamEnd{Status: he.Status, Error: he.Code, Message: he.Message, Head: he.Head, Epoch: he.Epoch, Limit: he.Limit})
}

// end writes the stream's last event, and returns its outcome.
func (st *stream) end(reason string, body *streamEnd) string {
	if body == nil {
		body = &streamEnd{}
	}
	body.Reason = reason
	data, _ := json.Marshal(body) // strings and numbers: cannot fail
	var line string
	if st.ndjson {
		line = `{"event":"end","data":` + string(data) + "}\n"
	} else {
		line = "event: end\ndata: " + string(data) + "\n\n"
	}
	st.deadline(int64(len(line)))
	if _, err := io.WriteString(st, line); err != nil {
		return streamCut
	}
	if st.flush() != nil {
		return streamCut
	}
	return reason
}

// deadline gives the event about to be written, of about size bytes, its
// write deadline, as an answer of that size has.
func (st *stream) deadline(size int64) {
	if st.conn != nil {
		_ = st.conn.SetWriteDeadline(st.s.limits.timing.deadline(time.Now(), size))
		return
	}
	setAnswerDeadline(st.w, st.r, size)
}

// Write writes to the stream's connection or handler's writer.
func (st *stream) Write(b []byte) (int, error) {
	var n int
	var err error
	if st.conn != nil {
		if len(st.buf) > 0 {
			// The answer's head goes out with the first event.
			b = append(st.buf, b...)
			st.buf = nil
		}
		if st.sender {
			return st.writeNow(b)
		}
		n, err = st.conn.Write(b)
	} else {
		n, err = st.w.Write(b)
	}
	st.bytes += int64(n)
	return n, err
}
