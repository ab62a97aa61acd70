// Package bodyguard is the HTTP middleware that keeps request bodies from
// holding connections: a deadline for every body, and a bounded close for
// a request answered before its body was read.
package bodyguard

import (
	"io"
	"net/http"
	"time"
)

// Handler gives every request that declares a body timeout to send it,
// authenticated or not, and closes the connection of a request answered
// without reading its body to the end.
//
// net/http discards an unread body after the handler returns, so that the
// connection can carry the next request, and it waits for that body with no
// deadline of its own: a client that declares a body and never sends it
// would hold its connection for ever on any path that answers without
// reading (401, 404, /live, /ready). The relay's
// TestUnreadBodyClosesConnection and TestSlowBodyHasDeadline guard this,
// and TestOversizedBodyGets413 (here and there) the answer's reaching a
// client that is still sending.
func Handler(timeout time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 { // no body (-1 is a chunked one)
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(timeout))
		b := &watchedBody{ReadCloser: r.Body}
		r.Body = b
		next.ServeHTTP(&closeUnread{ResponseWriter: w, body: b}, r)
		if !b.done {
			// The body was not read to its end: what follows on the wire
			// is not a request, and the connection closes. Closed with
			// bytes unread, it is reset, and a reset can destroy the
			// answer before the client reads it (a 413 to a client still
			// sending). So what the client is still sending is read and
			// dropped first, within a bound (net/http's own lingering
			// close does not see the wrapped body); then the discard
			// fails at once. The answer waits for this: sent before it,
			// it goes out chunked while the request is still coming,
			// which a client behind Go's reverse proxy read cut short
			// (client TestRemovedDeviceUnauthorized, 1 in 30).
			_ = rc.SetReadDeadline(time.Now().Add(lingerFor))
			_, _ = io.CopyN(io.Discard, b.ReadCloser, lingerBytes)
			_ = rc.SetReadDeadline(time.Now())
		}
	})
}

// The bound on reading an unread body before the connection closes: a
// client still sending gets time to read its answer; one that sends
// slowly, or nothing, costs the relay, and delays its own answer, no more
// than this.
const (
	lingerFor   = 250 * time.Millisecond
	lingerBytes = 256 << 10
)

// watchedBody notes whether its reader reached the end.
type watchedBody struct {
	io.ReadCloser
	done bool
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.done = true
	}
	return n, err
}

// closeUnread asks for "Connection: close" when the answer starts before
// the body was read to its end, so that net/http does not wait to discard
// it before answering.
type closeUnread struct {
	http.ResponseWriter
	body        *watchedBody
	wroteHeader bool
}

func (w *closeUnread) WriteHeader(status int) {
	if !w.wroteHeader {
		w.wroteHeader = true
		if !w.body.done {
			w.Header().Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *closeUnread) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *closeUnread) Unwrap() http.ResponseWriter { return w.ResponseWriter }
