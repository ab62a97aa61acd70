package relay

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/flamenet/relay/store"
)

// Answers a client does not read.
//
// A poll's answer can be megabytes (FN_POLL_BUDGET_BYTES of payload, as
// base64), and a client that asks and never reads would otherwise keep it
// for as long as it likes: in the relay's memory while the write blocks,
// and in the kernel's send buffer, which takes a whole answer on loopback.
// Two things bound that:
//
//   - every answer is written under a deadline that fits its size
//     (FN_ANSWER_TIMEOUT plus its bytes at FN_ANSWER_MIN_RATE); past it the
//     connection is reset, which frees the kernel's copy too;
//   - the kernel holds at most sendQueueLowWater bytes of an answer not yet
//     sent (TCP_NOTSENT_LOWAT), so a write to a client that does not read
//     blocks, and meets its deadline, instead of vanishing into the kernel.

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
	return context.WithValue(ctx, answerTimingKey{}, &s.timing)
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
