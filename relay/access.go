package relay

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
)

// accessEntry is the access log line of one request, filled in as the
// request goes: it counts the answer as the request's writer, authenticate
// names the device, the poll its outcome, writeError the error code. Only
// the request's own goroutine touches it.
type accessEntry struct {
	http.ResponseWriter
	status    int
	bytes     int64
	household string
	device    string
	outcome   string // polls only
	code      string // the protocol's error code, for an error answer
	// detached: the poll parked; its line is written when it answers.
	detached bool
}

func (e *accessEntry) WriteHeader(code int) {
	if e.status == 0 {
		e.status = code
	}
	e.ResponseWriter.WriteHeader(code)
}

func (e *accessEntry) Write(b []byte) (int, error) {
	if e.status == 0 {
		e.status = http.StatusOK
	}
	n, err := e.ResponseWriter.Write(b)
	e.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the connection.
func (e *accessEntry) Unwrap() http.ResponseWriter { return e.ResponseWriter }

type accessKey struct{}

// accessOf is the request's access log entry; nil when nothing is logged.
func accessOf(ctx context.Context) *accessEntry {
	e, _ := ctx.Value(accessKey{}).(*accessEntry)
	return e
}

// noteDevice records whose verified token the request carries.
func noteDevice(ctx context.Context, household, device string) {
	if e := accessOf(ctx); e != nil {
		e.household, e.device = household, device
	}
}

// statusHangup is logged for a request whose client went away before any
// answer was written (nginx's convention).
const statusHangup = 499

// refusalLinesPerSecond bounds the access log lines of refusals that any
// client can provoke, token or not; the rest are counted in a summary.
const refusalLinesPerSecond = 10

// accessLog is chi middleware that logs one line per finished request. It
// is off, and costs nothing, with FN_ACCESS_LOG=off or a log level above
// info. Never logged: tokens, payloads, push addresses, query values other
// than cursor, wait and limit.
func (s *Server) accessLog(next http.Handler) http.Handler {
	if !s.cfg.AccessLog {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.logs.access.Enabled(r.Context(), accessLevel) {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		if rs := resumeOf(r.Context()); rs != nil {
			start = rs.start // a poll read again after it parked
		}
		e := &accessEntry{ResponseWriter: w}
		next.ServeHTTP(e, r.WithContext(context.WithValue(r.Context(), accessKey{}, e)))
		if !e.detached {
			s.logAccess(r, e, time.Since(start))
		}
	})
}

// accessLevel is the access log's level.
const accessLevel = slog.LevelInfo

// accessLine is what one access log line says.
type accessLine struct {
	method, route     string
	status            int
	took              time.Duration
	bytes             int64
	client            string
	household, device string
	outcome, code     string
	query             string // the raw query; only its safe part is logged
}

func (s *Server) logAccess(r *http.Request, e *accessEntry, took time.Duration) {
	status := e.status
	if status == 0 {
		status = http.StatusOK // what net/http sends for a handler that wrote nothing
		if r.Context().Err() != nil {
			status = statusHangup
		}
	}
	route := chi.RouteContext(r.Context()).RoutePattern()
	if route == "" {
		route = "-" // no route matched
	}
	s.writeAccess(r.Context(), accessLine{
		method: r.Method, route: route, status: status, took: took, bytes: e.bytes,
		client:    clientAddr(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), s.cfg.TrustedProxies),
		household: e.household, device: e.device, outcome: e.outcome, code: e.code, query: r.URL.RawQuery,
	})
}

func (s *Server) writeAccess(ctx context.Context, l accessLine) {
	if refusal(l.status) && !s.logs.refusalLines.allow(time.Now()) {
		return
	}
	var buf [16]slog.Attr
	attrs := append(buf[:0],
		slog.String("method", l.method),
		slog.String("route", l.route),
		slog.Int("status", l.status),
		slog.String("duration", l.took.String()),
		slog.Int64("bytes", l.bytes),
		slog.String("client", l.client),
	)
	if l.household != "" {
		attrs = append(attrs, slog.String("household", l.household), slog.String("device", l.device))
	}
	if l.outcome != "" {
		attrs = append(attrs, slog.String("outcome", l.outcome))
	}
	if l.code != "" {
		attrs = append(attrs, slog.String("error", l.code))
	}
	attrs = appendSafeQuery(attrs, l.query)
	s.logs.access.LogAttrs(ctx, accessLevel, "request", attrs...)
}

// refusal reports whether an answer is one that a client can provoke in a
// loop: any 4xx but a hangup. A token can ask for a cursor_ahead 409 or a
// 429 as fast as it likes: the bucket that refuses a request bounds what
// it costs, not the lines it would write.
func refusal(status int) bool {
	return status >= 400 && status <= 499 && status != statusHangup
}

// appendSafeQuery logs the query parameters that say nothing about anyone:
// cursor, wait and limit, each only when it is a plain number.
func appendSafeQuery(attrs []slog.Attr, raw string) []slog.Attr {
	for raw != "" {
		var kv string
		kv, raw, _ = strings.Cut(raw, "&")
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "cursor", "wait", "limit":
		default:
			continue
		}
		if v == "" || len(v) > 19 || strings.Trim(v, "0123456789") != "" {
			v = "invalid"
		}
		attrs = append(attrs, slog.String(k, v))
	}
	return attrs
}

// clientAddr is the client's address: the peer's, unless the peer is a
// trusted proxy. Then X-Forwarded-For is walked from its right end (the
// entry the nearest proxy appended) past trusted proxies; the first
// address that is not one is the client. A malformed entry stops the walk
// at the last good address: what lies left of it cannot be told apart
// from what a client wrote itself.
func clientAddr(remote string, xff []string, trusted []netip.Prefix) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote
	}
	if len(trusted) == 0 || len(xff) == 0 {
		return host
	}
	peer, err := netip.ParseAddr(host)
	if err != nil || !trustedAddr(peer, trusted) {
		return host
	}
	client := peer
	for i := len(xff) - 1; i >= 0; i-- {
		list := xff[i]
		for list != "" {
			var entry string
			if j := strings.LastIndexByte(list, ','); j >= 0 {
				entry, list = list[j+1:], list[:j]
			} else {
				entry, list = list, ""
			}
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue // "a,,b" or a trailing comma: no hop
			}
			a, ok := parseForwarded(entry)
			if !ok {
				return client.String()
			}
			client = a
			if !trustedAddr(a, trusted) {
				return a.String()
			}
		}
	}
	return client.String()
}

// parseForwarded reads one X-Forwarded-For entry: an address, or an
// address with a port as some proxies write it.
func parseForwarded(entry string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(entry); err == nil && a.Zone() == "" {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(entry); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

func trustedAddr(a netip.Addr, trusted []netip.Prefix) bool {
	a = a.Unmap()
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// refusalLines lets at most perSecond lines through in each second; the
// first refusal past that arms a summary of how many were dropped, logged
// when the second ends (or at once when the next second's first refusal
// comes earlier, or at shutdown).
type refusalLines struct {
	perSecond int
	report    func(dropped int)

	mu      sync.Mutex
	start   time.Time
	n       int
	dropped int
	timer   *time.Timer
}

func (l *refusalLines) allow(now time.Time) bool {
	l.mu.Lock()
	if now.Sub(l.start) >= time.Second || now.Before(l.start) {
		dropped := l.take()
		l.start, l.n = now, 1
		l.mu.Unlock()
		if dropped > 0 {
			l.report(dropped)
		}
		return true
	}
	if l.n < l.perSecond {
		l.n++
		l.mu.Unlock()
		return true
	}
	l.dropped++
	if l.timer == nil {
		l.timer = time.AfterFunc(l.start.Add(time.Second).Sub(now), l.flush)
	}
	l.mu.Unlock()
	return false
}

// take returns and clears the dropped count; l.mu is held.
func (l *refusalLines) take() int {
	d := l.dropped
	l.dropped = 0
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	return d
}

// flush logs the summary of what was dropped, if anything was.
func (l *refusalLines) flush() {
	l.mu.Lock()
	d := l.take()
	l.mu.Unlock()
	if d > 0 {
		l.report(d)
	}
}
