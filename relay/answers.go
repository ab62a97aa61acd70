package relay

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/wire"
	"github.com/flamenet/relay/store"
)

// Answers a client does not read.
//
// A poll's answer can be megabytes (FN_POLL_BUDGET_BYTES of payload, as
// base64), and a client that asks and never reads would otherwise keep it
// for as long as it likes: in the relay's memory while the write blocks,
// and in the kernel's send buffer, which takes a whole answer on loopback.
// Three things bound that:
//
//   - every answer is written under a deadline that fits its size
//     (FN_ANSWER_TIMEOUT plus its bytes at FN_ANSWER_MIN_RATE); past it the
//     connection is reset, which frees the kernel's copy too;
//   - the kernel holds at most sendQueueLowWater bytes of an answer not yet
//     sent (TCP_NOTSENT_LOWAT), so a write to a client that does not read
//     blocks, and meets its deadline, instead of vanishing into the kernel;
//   - the bytes of poll answers being fetched, encoded and written are
//     bounded for the relay and for each device (answerBytes); a poll past
//     either bound is refused with 429 answers_in_flight.

// sendQueueLowWater is how much of an answer the kernel may hold unsent
// per connection. Enough to keep a fast link busy between two writes.
const sendQueueLowWater = 128 << 10

// answerTiming is how long the connection's answers have: base, plus their
// size at rate bytes a second.
type answerTiming struct {
	base time.Duration
	rate int64
}

func (t *answerTiming) deadline(now time.Time, size int64) time.Time {
	return now.Add(t.base + time.Duration(float64(size)/float64(t.rate)*float64(time.Second)))
}

type answerTimingKey struct{}

// setAnswerDeadline gives the answer about to be written, of about size
// bytes, its deadline. Requests served without Serve have none.
func setAnswerDeadline(w http.ResponseWriter, r *http.Request, size int64) {
	if t, ok := r.Context().Value(answerTimingKey{}).(*answerTiming); ok {
		_ = http.NewResponseController(w).SetWriteDeadline(t.deadline(time.Now(), size))
	}
}

// answerDeadlines gives every request's answer FN_ANSWER_TIMEOUT from its
// arrival: answers written neither by writeBody nor by writePoll (/live, a
// preflight, net/http's own) then have one, and no deadline of an earlier
// answer on the connection is left to cut a later one. writeBody and
// writePoll set their answer's own as they start writing it.
func (s *Server) answerDeadlines(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setAnswerDeadline(w, r, 0)
		next.ServeHTTP(w, r)
	})
}

// writeBody encodes v as the client asked and answers with it under the
// answer's deadline.
func writeBody(w http.ResponseWriter, r *http.Request, status int, v any) {
	b, ct, err := wire.Marshal(r, v)
	if err != nil {
		status, ct = http.StatusInternalServerError, wire.ContentJSON
		b = []byte(`{"error":"internal","message":"Internal error."}` + "\n")
	}
	h := w.Header()
	h.Set("Content-Type", ct)
	h.Set("Cache-Control", "no-store")
	setAnswerDeadline(w, r, int64(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// writeNoContent answers 204 under the answer's deadline.
func writeNoContent(w http.ResponseWriter, r *http.Request) {
	setAnswerDeadline(w, r, 0)
	w.WriteHeader(http.StatusNoContent)
}

// answerListener readies accepted connections for answers with deadlines.
type answerListener struct {
	net.Listener
	log *slog.Logger
	cut func() // counts a connection cut for an answer past its deadline
}

func (l answerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	if err := setSendLowWater(tc, sendQueueLowWater); err != nil {
		l.log.Debug("cannot bound the unsent bytes of a connection", "err", err)
	}
	return &answerConn{TCPConn: tc, cut: l.cut}, nil
}

// answerConn is an accepted connection. A write past its deadline (only
// answers set write deadlines) resets the connection when it is closed, so
// that the kernel drops what it still held of the answer at once instead
// of trying to deliver it for minutes. net/http closes a connection whose
// write failed as soon as its handler returns.
type answerConn struct {
	*net.TCPConn
	cut  func()
	done atomic.Bool
}

func (c *answerConn) Write(b []byte) (int, error) {
	n, err := c.TCPConn.Write(b)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && c.done.CompareAndSwap(false, true) {
		_ = c.TCPConn.SetLinger(0)
		c.cut()
	}
	return n, err
}

// withAnswerTiming is part of Serve's ConnContext: every request on a
// connection it accepted finds the answer timing.
func (s *Server) withAnswerTiming(ctx context.Context) context.Context {
	return context.WithValue(ctx, answerTimingKey{}, &s.limits.timing)
}

// Bounds of an answer's encoded size, JSON's (MessagePack's is smaller).
const (
	// answerOverhead: the answer's own fields.
	answerOverhead = 64
	// envelopeOverhead: an envelope's besides its payload: field names,
	// seq, the time, the sender's name, and a 128-character id that JSON
	// may escape six bytes a character; plus base64's padding.
	envelopeOverhead = 1028
)

// answerSize bounds the encoded size of an answer with n envelopes and
// payload bytes of payload in all.
func answerSize(n, payload int64) int64 {
	return answerOverhead + n*envelopeOverhead + (payload*4+2)/3
}

// batchAnswerSize bounds the encoded size of the answer carrying b.
func batchAnswerSize(b store.Batch) int64 {
	var payload int64
	for _, e := range b.Envelopes {
		payload += int64(len(e.Payload))
	}
	return answerSize(int64(len(b.Envelopes)), payload)
}

// Which limit refused a poll's answer, in the error body's "limit" field
// and in fn_admission_refusals_total's reason.
const (
	limitDeviceAnswers = "device_answer_bytes"
	limitRelayAnswers  = "relay_answer_bytes"
)

// answerBytes counts the bytes of poll answers in flight: reserved before a
// poll fetches what it will answer, released once the answer is written
// (or cut). An answer is let through whenever nothing else is in flight
// for its device (or the relay), however large, so that no answer is
// refused for ever.
type answerBytes struct {
	relayMax, deviceMax int64

	total atomic.Int64 // for the gauge; written under mu
	mu    sync.Mutex
	per   map[device.Key]int64
}

func newAnswerBytes(relayMax, deviceMax int64) *answerBytes {
	return &answerBytes{relayMax: relayMax, deviceMax: deviceMax, per: make(map[device.Key]int64)}
}

// take reserves n bytes for k's answer; it returns the limit that refused
// them, or "".
func (a *answerBytes) take(k device.Key, n int64) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, total := a.per[k], a.total.Load()
	switch {
	case d > 0 && d+n > a.deviceMax:
		return limitDeviceAnswers
	case total > 0 && total+n > a.relayMax:
		return limitRelayAnswers
	}
	a.per[k] = d + n
	a.total.Store(total + n)
	return ""
}

// add changes k's reservation by n, which may be negative; a growth is not
// refused (the answer is already read).
func (a *answerBytes) add(k device.Key, n int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if d := a.per[k] + n; d > 0 {
		a.per[k] = d
	} else {
		delete(a.per, k)
	}
	a.total.Add(n)
}

// answerHold is one answer's reservation.
type answerHold struct {
	a   *answerBytes
	key device.Key
	n   int64
}

// resize makes the reservation n bytes: what the answer turned out to be.
func (h *answerHold) resize(n int64) {
	if n != h.n {
		h.a.add(h.key, n-h.n)
		h.n = n
	}
}

func (h *answerHold) release() { h.resize(0) }

// holdAnswer reserves n bytes for an answer to k, or refuses the poll.
func (s *Server) holdAnswer(k device.Key, n int64) (answerHold, error) {
	if limit := s.limits.answers.take(k, n); limit != "" {
		s.metrics.refusals.WithLabelValues(limit).Inc()
		msg := "This device's answers already in flight are too large; read them, then poll again."
		if limit == limitRelayAnswers {
			msg = "The relay is writing as many answers as it may; try again."
		}
		return answerHold{}, &httpError{Status: http.StatusTooManyRequests, Code: codeAnswersInFlight, Limit: limit, Message: msg}
	}
	return answerHold{a: s.limits.answers, key: k, n: n}, nil
}

// maxPollLimit is the most envelopes a poll may ask for (parsePoll).
const maxPollLimit = 1000

// pendingAnswerSize bounds the answer to a poll for which pending
// envelopes wait, before they are read: at most limit of them, and at most
// the budget of payload, or one envelope if that is more.
func (cfg Config) pendingAnswerSize(pending int64, limit int) int64 {
	n := min(max(pending, 1), int64(limit))
	maxEnv := int64(cfg.MaxEnvelopeBytes)
	return answerSize(n, min(n*maxEnv, max(cfg.PollBudgetBytes, maxEnv)))
}

// defaultAnswerBytes is FN_ANSWER_BYTES_IN_FLIGHT when it is not set: a
// quarter of the runtime's memory target (GOMEMLIMIT, or what the binary
// set from the container's limit), leaving the rest to held polls,
// buffers and the collector's slack; 256 MiB without a target.
func defaultAnswerBytes() int64 {
	if target := debug.SetMemoryLimit(-1); target > 0 && target < math.MaxInt64 {
		return target / 4
	}
	return 256 << 20
}
