package relay

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/flamenet/relay/internal/accesslog"
	"github.com/flamenet/relay/internal/parking"
)

// record is one request's account. The outermost middleware (account)
// makes it, and one function (finish) closes it: the access log line and,
// for a poll, fn_polls_total and the poll's duration. The request fills it
// in as it goes: as the request's writer it counts the answer,
// authenticate names the device, the poll its outcome, writeError the
// error code. A poll that parks detaches its record, whose account is then
// closed when the poll, read again, answers (a new request, whose record
// starts when the poll first came), or when its client hangs up while
// parked. Only the request's own goroutine touches a record.
type record struct {
	http.ResponseWriter
	start time.Time
	// resume is how the wait of a poll read again after it parked ended;
	// nil for any other request.
	resume *parking.Resume

	method, route, query, remote string
	forwarded                    []string // X-Forwarded-For, believed only from trusted proxies

	household, device string
	outcome           string // polls only
	code              string // the protocol's error code, for an error answer
	bytes             int64
	// storeDeadline bounds the request's store calls together (storeCtx):
	// kept here rather than in a context of its own, which would copy the
	// request once more.
	storeDeadline time.Time
	status        int32
	poll          bool // a poll: counted in fn_polls_total
	send          bool // a send: counted in fn_sends_total
	detached      bool // the poll parked: its account is closed elsewhere
}

func (rec *record) WriteHeader(code int) {
	if rec.status == 0 {
		rec.status = int32(code)
	}
	rec.ResponseWriter.WriteHeader(code)
}

func (rec *record) Write(b []byte) (int, error) {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	n, err := rec.ResponseWriter.Write(b)
	rec.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the connection.
func (rec *record) Unwrap() http.ResponseWriter { return rec.ResponseWriter }

// detached is what a parked poll keeps of its request's record: what
// closing its account takes if its client hangs up while parked (a poll
// read again starts a record of its own, from start). Not the record
// itself: that would make a parked poll half as large again.
type detached struct {
	start             time.Time
	query, remote     string
	forwarded         []string
	household, device string
}

// detach passes the poll's account to its parked wait. The writer goes:
// whatever still holds the request's context would keep the hijacked
// connection's buffers through it.
func (rec *record) detach() detached {
	rec.detached, rec.ResponseWriter = true, nil
	return detached{start: rec.start, query: rec.query, remote: rec.remote, forwarded: rec.forwarded, household: rec.household, device: rec.device}
}

// hungUp is the record of a parked poll whose client went away.
func (d *detached) hungUp() *record {
	return &record{
		start: d.start, method: http.MethodGet, route: routePoll, query: d.query, remote: d.remote, forwarded: d.forwarded,
		household: d.household, device: d.device, poll: true, outcome: pollHangup, status: statusHangup,
	}
}

// closed is the record of a hijacked stream that ended.
func (d *detached) closed(route, outcome string, status int32, bytes int64) *record {
	return &record{
		start: d.start, method: http.MethodGet, route: route, query: d.query, remote: d.remote, forwarded: d.forwarded,
		household: d.household, device: d.device, outcome: outcome, status: status, bytes: bytes,
	}
}

// statusHangup is logged for a request whose client went away before any
// answer was written (nginx's convention).
const statusHangup = 499

type recordKey struct{}

// recordOf is the record of the request ctx belongs to; nil outside one.
func recordOf(ctx context.Context) *record {
	rec, _ := ctx.Value(recordKey{}).(*record)
	return rec
}

// account is the outermost middleware: every request gets its record here,
// and, unless its poll parked, its account is closed here when it ends.
func (s *Server) account(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &record{
			ResponseWriter: w, start: time.Now(), resume: parking.Take(r.Context()),
			method: r.Method, query: r.URL.RawQuery, remote: r.RemoteAddr, forwarded: r.Header.Values("X-Forwarded-For"),
		}
		if rec.resume != nil {
			rec.start = rec.resume.Start // a poll read again: its whole duration
		}
		next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), recordKey{}, rec)))
		if !rec.detached {
			if rec.status == 0 && r.Context().Err() != nil {
				rec.status = statusHangup // nothing was written, and the client is gone
			}
			s.finish(r.Context(), rec)
		}
	})
}

// noteRoute records the route pattern that matched; chi middleware, first,
// so that the router's own 404 and 405 are recorded too.
func noteRoute(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if rec := recordOf(r.Context()); rec != nil {
			rec.route = chi.RouteContext(r.Context()).RoutePattern()
		}
	})
}

// finish closes a request's account: a poll is counted with its outcome
// and a send with its status, each timed, and the request gets its access
// log line.
func (s *Server) finish(ctx context.Context, rec *record) {
	took := time.Since(rec.start)
	if rec.send {
		s.metrics.sendSeconds.Observe(took.Seconds())
		code := strconv.Itoa(int(rec.status))
		if rec.status >= 500 && ctx.Err() != nil {
			code = sendClientGone
		}
		s.metrics.sends.WithLabelValues(code).Inc()
	}
	if rec.poll {
		if rec.outcome == "" {
			rec.outcome = pollError // every path notes one; a poll without is a bug
		}
		s.metrics.pollSeconds.Observe(took.Seconds())
		s.metrics.polls.WithLabelValues(rec.outcome).Inc()
	}
	if !s.cfg.AccessLog || !s.logs.access.Enabled(ctx) {
		return
	}
	status := rec.status
	if status == 0 {
		status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	route := rec.route
	if route == "" {
		route = "-" // no route matched
	}
	s.logs.access.Write(ctx, accesslog.Line{
		Method: rec.method, Route: route, Status: int(status), Took: took, Bytes: rec.bytes,
		Client:    accesslog.ClientAddr(rec.remote, rec.forwarded, s.cfg.TrustedProxies),
		Household: rec.household, Device: rec.device, Outcome: rec.outcome, Code: rec.code, Query: rec.query,
	})
}

// noteDevice records whose verified token the request carries.
func noteDevice(ctx context.Context, household, device string) {
	if rec := recordOf(ctx); rec != nil {
		rec.household, rec.device = household, device
	}
}

// notePoll records why the poll of ctx ended; the first reason stands (a
// removal answered with 401 stays "removed"). Outside a poll it does
// nothing.
func notePoll(ctx context.Context, outcome string) {
	if rec := recordOf(ctx); rec != nil && rec.poll && rec.outcome == "" {
		rec.outcome = outcome
	}
}

// resumeOf is how the wait of the poll being read again ended; nil for a
// request that did not park.
func resumeOf(ctx context.Context) *parking.Resume {
	if rec := recordOf(ctx); rec != nil {
		return rec.resume
	}
	return nil
}
