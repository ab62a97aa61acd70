// Package accesslog writes a relay's access log: one line per finished
// request, which names no token, payload or push address, and logs of the
// query only cursor, wait and limit as plain numbers; the lines of
// refusals a client can provoke in a loop are bounded, and a summary says
// how many were left out.
package accesslog

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// LinesPerSecond bounds the lines of refusals that a client can provoke in
// a loop; the rest are counted in a summary.
const LinesPerSecond = 10

// Level is the access log's level.
const Level = slog.LevelInfo

// hangup is the status of a request whose client went away before any
// answer was written (nginx's convention): not a refusal.
const hangup = 499

// Line is what one access log line says.
type Line struct {
	Method, Route     string
	Status            int
	Took              time.Duration
	Bytes             int64
	Client            string
	Household, Device string
	Outcome, Code     string
	Query             string // the raw query; only its safe part is logged
}

// Log writes the access log: one line per finished request, with the
// lines of refusals bounded.
type Log struct {
	out     *slog.Logger
	refused refusalLines
}

// New writes the access log to out; summaries of the refusals left out go
// to summary.
func New(out, summary *slog.Logger) *Log {
	return &Log{out: out, refused: refusalLines{perSecond: LinesPerSecond, report: func(dropped int) {
		summary.Info("requests refused and not logged", "dropped", dropped, "lines_per_second", LinesPerSecond)
	}}}
}

// Enabled reports whether a line would be written at all.
func (a *Log) Enabled(ctx context.Context) bool { return a.out.Enabled(ctx, Level) }

// Flush says now what the last second left out.
func (a *Log) Flush() { a.refused.flush() }

// Write writes l's line, unless it is a refusal past this second's bound.
func (a *Log) Write(ctx context.Context, l Line) {
	if refusal(l.Status) && !a.refused.allow(time.Now()) {
		return
	}
	var buf [16]slog.Attr
	attrs := append(buf[:0],
		slog.String("method", l.Method),
		slog.String("route", l.Route),
		slog.Int("status", l.Status),
		slog.String("duration", l.Took.String()),
		slog.Int64("bytes", l.Bytes),
		slog.String("client", l.Client),
	)
	if l.Household != "" {
		attrs = append(attrs, slog.String("household", l.Household), slog.String("device", l.Device))
	}
	if l.Outcome != "" {
		attrs = append(attrs, slog.String("outcome", l.Outcome))
	}
	if l.Code != "" {
		attrs = append(attrs, slog.String("error", l.Code))
	}
	attrs = appendSafeQuery(attrs, l.Query)
	a.out.LogAttrs(ctx, Level, "request", attrs...)
}

// refusal reports whether an answer is one that a client can provoke in a
// loop: any 4xx but a hangup. A token can ask for a cursor_ahead 409 or a
// 429 as fast as it likes: the bucket that refuses a request bounds what
// it costs, not the lines it would write.
func refusal(status int) bool {
	return status >= 400 && status <= 499 && status != hangup
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

// ClientAddr returns the client's address: the peer's, unless the peer is a
// trusted proxy. Then X-Forwarded-For is walked from its right end (the
// entry the nearest proxy appended) past trusted proxies; the first
// address that is not one is the client. A malformed entry stops the walk
// at the last good address: what lies left of it cannot be told apart
// from what a client wrote itself.
func ClientAddr(remote string, xff []string, trusted []netip.Prefix) string {
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
