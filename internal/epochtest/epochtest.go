// Package epochtest is a stand-in relay for the clients' tests of store
// epochs: one device's queue over real HTTP, whose store history a test
// rolls back (a failover that lost commits, a restored backup). It speaks
// the wire of register, poll and ack in JSON as docs/PROTOCOL.md gives it,
// epochs included, and records every poll and ack, so that a test can
// check what a client sent. It holds no tokens and checks none.
package epochtest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Envelope is one envelope of the device's queue.
type Envelope struct {
	Seq     int64
	ID      string
	From    string
	Payload []byte
}

// Request is a poll or ack as the relay received it.
type Request struct {
	Op string // "poll" or "ack"
	// Cursor is nil when the request carried none.
	Cursor *int64
	// Epoch is "" when the request carried none.
	Epoch string
	// Status is the relay's answer.
	Status int
}

// Relay is the stand-in. Its zero value is not usable: see Start.
type Relay struct {
	URL string

	mu       sync.Mutex
	epoch    string
	envs     []Envelope // every envelope the store holds, acknowledged or not, by seq
	head     int64
	cursor   int64 // what the device acknowledged
	requests []Request
	changed  chan struct{} // closed and replaced when the queue or epoch changes
}

var epochRule = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// Start serves a relay in epoch on a loopback socket until the test ends.
func Start(t testing.TB, epoch string) *Relay {
	t.Helper()
	r := &Relay{epoch: epoch, changed: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/register", r.register)
	mux.HandleFunc("GET /v1/poll", r.poll)
	mux.HandleFunc("POST /v1/ack", r.ack)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

// Add stores an envelope for the device and returns its seq.
func (r *Relay) Add(from, id string, payload []byte) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addLocked(Envelope{ID: id, From: from, Payload: payload})
	r.wakeLocked()
	return r.head
}

func (r *Relay) addLocked(e Envelope) {
	r.head++
	e.Seq = r.head
	r.envs = append(r.envs, e)
}

// Rollback makes the store's history go back, as a failover to a standby
// that lacked the last commits does: what was stored above head is gone,
// the device's acknowledged cursor is back at cursor (at most head), and
// the store answers in epoch from now on. Seqs above head will be given
// again, to other envelopes: then are stored after it at once (their Seq
// is ignored), so that no poll sees the store between the two.
func (r *Relay) Rollback(head, cursor int64, epoch string, then ...Envelope) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var kept []Envelope
	for _, e := range r.envs {
		if e.Seq <= head {
			kept = append(kept, e)
		}
	}
	r.envs, r.head, r.cursor, r.epoch = kept, head, min(cursor, head), epoch
	for _, e := range then {
		r.addLocked(e)
	}
	r.wakeLocked()
}

// Requests returns the polls and acks received so far.
func (r *Relay) Requests() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Request(nil), r.requests...)
}

// Cursor returns the device's acknowledged cursor.
func (r *Relay) Cursor() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cursor
}

func (r *Relay) wakeLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *Relay) register(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	answer(w, http.StatusOK, map[string]any{"household": "h", "device": "phone", "cursor": r.cursor, "epoch": r.epoch})
}

// check applies the wire's rules for a request's cursor and epoch: a bad
// epoch is 400; another epoch than the current one, or a cursor above the
// head, is 409 cursor_ahead. On success a cursor is acknowledged. The
// caller holds mu.
func (r *Relay) checkLocked(w http.ResponseWriter, op string, cursor *int64, epoch string, hasEpoch bool) bool {
	req := Request{Op: op, Cursor: cursor, Epoch: epoch}
	switch {
	case hasEpoch && !epochRule.MatchString(epoch):
		req.Status = http.StatusBadRequest
		answer(w, req.Status, map[string]any{"error": "bad_request", "message": "epoch: 1 to 32 characters of [A-Za-z0-9_-]"})
	case hasEpoch && epoch != r.epoch || cursor != nil && *cursor > r.head:
		req.Status = http.StatusConflict
		answer(w, req.Status, map[string]any{"error": "cursor_ahead", "message": "the cursor is above the device's head or of another epoch", "head": r.head, "epoch": r.epoch})
	default:
		if cursor != nil && *cursor > r.cursor {
			r.cursor = *cursor
		}
	}
	r.requests = append(r.requests, req)
	return req.Status == 0
}

func (r *Relay) poll(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	var cursor *int64
	if q.Has("cursor") {
		n, err := strconv.ParseInt(q.Get("cursor"), 10, 64)
		if err != nil || n < 0 {
			answer(w, http.StatusBadRequest, map[string]any{"error": "bad_request", "message": "cursor"})
			return
		}
		cursor = &n
	}
	wait, _ := strconv.Atoi(q.Get("wait"))
	limit, _ := strconv.Atoi(q.Get("limit"))
	r.mu.Lock()
	if !r.checkLocked(w, "poll", cursor, q.Get("epoch"), q.Has("epoch")) {
		r.mu.Unlock()
		return
	}
	epoch := r.epoch
	deadline := time.NewTimer(time.Duration(wait) * time.Second)
	defer deadline.Stop()
	for {
		var out []map[string]any
		last := r.cursor
		for _, e := range r.envs {
			if e.Seq <= r.cursor || limit > 0 && len(out) == limit {
				continue
			}
			out = append(out, map[string]any{"seq": e.Seq, "id": e.ID, "from": e.From,
				"sent_at": "2026-11-29T18:02:03.123456Z", "payload": base64.StdEncoding.EncodeToString(e.Payload)})
			last = e.Seq
		}
		if len(out) > 0 || wait == 0 || r.epoch != epoch {
			if r.epoch != epoch {
				// The epoch changed while the poll was held: it answers
				// 409 as a new request of the old epoch would.
				r.requests = append(r.requests, Request{Op: "poll (held)", Status: http.StatusConflict})
				answer(w, http.StatusConflict, map[string]any{"error": "cursor_ahead", "message": "the store's epoch changed", "head": r.head, "epoch": r.epoch})
				r.mu.Unlock()
				return
			}
			more := false
			for _, e := range r.envs {
				more = more || e.Seq > last
			}
			r.mu.Unlock()
			answer(w, http.StatusOK, map[string]any{"cursor": last, "more": more, "envelopes": orEmpty(out), "epoch": epoch})
			return
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			wait = 0
		case <-req.Context().Done():
			return
		}
		r.mu.Lock()
	}
}

func orEmpty(s []map[string]any) []map[string]any {
	if s == nil {
		return []map[string]any{}
	}
	return s
}

func (r *Relay) ack(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Cursor *int64  `json:"cursor"`
		Epoch  *string `json:"epoch"`
	}
	if err := json.NewDecoder(req.Body).Decode(&body); err != nil || body.Cursor == nil || *body.Cursor < 0 {
		answer(w, http.StatusBadRequest, map[string]any{"error": "bad_request", "message": fmt.Sprintf("body: %v", err)})
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	epoch := ""
	if body.Epoch != nil {
		epoch = *body.Epoch
	}
	if r.checkLocked(w, "ack", body.Cursor, epoch, body.Epoch != nil) {
		w.WriteHeader(http.StatusNoContent)
	}
}

func answer(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}
