package relay

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store/sqlite"
	"github.com/flamenet/relay/token"
	"github.com/flamenet/relay/wake/local"
)

// streamEvent is one event read off a stream, in either form.
type streamEvent struct {
	Name string
	ID   string
	Data json.RawMessage
}

func (e streamEvent) answer(tb testing.TB) pollResponse {
	tb.Helper()
	var p pollResponse
	if err := json.Unmarshal(e.Data, &p); err != nil {
		tb.Fatalf("event %s: %v: %s", e.Name, err, e.Data)
	}
	return p
}

func (e streamEvent) end(tb testing.TB) streamEnd {
	tb.Helper()
	if e.Name != "end" {
		tb.Fatalf("event %q (%s), want end", e.Name, e.Data)
	}
	var b streamEnd
	if err := json.Unmarshal(e.Data, &b); err != nil {
		tb.Fatalf("end event: %v: %s", err, e.Data)
	}
	return b
}

// testStream is an open stream, read on a goroutine of its own.
type testStream struct {
	tb     testing.TB
	resp   *http.Response
	events chan streamEvent
	done   chan error // the read's end: nil for EOF
	cancel context.CancelFunc
}

// openStream opens a stream with query, failing the test unless it starts;
// ndjson asks for JSON lines.
func (h *harness) openStream(tok, query string, ndjson bool, header ...string) *testStream {
	h.t.Helper()
	st, r := h.tryStream(tok, query, ndjson, header...)
	if st == nil {
		h.t.Fatalf("stream?%s: %d %s", query, r.status, r.body)
	}
	return st
}

// tryStream opens a stream; nil and the answer when it is refused.
func (h *harness) tryStream(tok, query string, ndjson bool, header ...string) (*testStream, reply) {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", h.url+"/v1/stream?"+query, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if ndjson {
		req.Header.Set("Accept", contentNDJSON)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := h.client.Do(req)
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		return nil, reply{status: resp.StatusCode, header: resp.Header, body: b}
	}
	st := &testStream{tb: h.t, resp: resp, events: make(chan streamEvent, 1024), done: make(chan error, 1), cancel: cancel}
	go st.read(ndjson)
	h.t.Cleanup(st.close)
	return st, reply{status: resp.StatusCode, header: resp.Header}
}

func (st *testStream) close() {
	st.cancel()
	st.resp.Body.Close()
}

// read parses the body into events until it ends.
func (st *testStream) read(ndjson bool) {
	defer close(st.events)
	sc := bufio.NewScanner(st.resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	var ev streamEvent
	for sc.Scan() {
		line := sc.Text()
		if ndjson {
			var raw struct {
				Event string          `json:"event"`
				ID    string          `json:"id"`
				Data  json.RawMessage `json:"data"`
			}
			if err := json.Unmarshal([]byte(line), &raw); err != nil {
				st.done <- fmt.Errorf("line %q: %w", line, err)
				return
			}
			st.events <- streamEvent{Name: raw.Event, ID: raw.ID, Data: raw.Data}
			continue
		}
		switch {
		case line == "":
			if ev.Name != "" {
				st.events <- ev
			}
			ev = streamEvent{}
		case strings.HasPrefix(line, ":"):
			st.events <- streamEvent{Name: "ping"}
		case strings.HasPrefix(line, "id: "):
			ev.ID = line[len("id: "):]
		case strings.HasPrefix(line, "event: "):
			ev.Name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			ev.Data = json.RawMessage(line[len("data: "):])
		default:
			st.done <- fmt.Errorf("line %q", line)
			return
		}
	}
	st.done <- sc.Err()
}

// next is the next event other than a ping; it fails the test after 10 s.
func (st *testStream) next() streamEvent {
	st.tb.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-st.events:
			if !ok {
				st.tb.Fatalf("stream ended: %v", <-st.done)
			}
			if ev.Name != "ping" {
				return ev
			}
		case <-timeout:
			st.tb.Fatal("no event in 10 s")
		}
	}
}

// closedAfter waits for the stream's body to end after its last event.
func (st *testStream) closedAfter() {
	st.tb.Helper()
	select {
	case ev, ok := <-st.events:
		if ok {
			st.tb.Fatalf("event %s after the end", ev.Name)
		}
	case <-time.After(10 * time.Second):
		st.tb.Fatal("the stream stayed open after its end")
	}
}

// TestStreamDelivers: a stream starts with its position, carries each
// send as an event with the seq as its id, in both forms, and a poll's
// cursor rules hold before it starts.
func TestStreamDelivers(t *testing.T) {
	for _, ndjson := range []bool{false, true} {
		t.Run(fmt.Sprintf("ndjson=%v", ndjson), func(t *testing.T) {
			h := newHarness(t, nil)
			phone := h.register("home", "phone")
			laptop := h.register("home", "laptop")
			st := h.openStream(phone, "", ndjson)
			want := contentSSE
			if ndjson {
				want = contentNDJSON
			}
			if ct := st.resp.Header.Get("Content-Type"); ct != want {
				t.Errorf("Content-Type %q, want %q", ct, want)
			}
			for _, k := range []string{"Cache-Control", "X-Accel-Buffering"} {
				if st.resp.Header.Get(k) == "" {
					t.Errorf("no %s header", k)
				}
			}
			ready := st.next()
			if ready.Name != "ready" || ready.ID != "0" || ready.answer(t).Epoch == "" {
				t.Fatalf("first event %+v, want ready at 0 with the epoch", ready)
			}
			for i := 1; i <= 3; i++ {
				h.send(laptop, fmt.Sprint("m", i), []byte(fmt.Sprint("payload ", i)), "phone")
				ev := st.next()
				a := ev.answer(t)
				if ev.Name != "envelopes" || ev.ID != strconv.Itoa(i) || len(a.Envelopes) != 1 || a.Envelopes[0].Seq != int64(i) || a.Cursor != int64(i) ||
					string(a.Envelopes[0].Payload) != fmt.Sprint("payload ", i) {
					t.Fatalf("event %d: %+v %s", i, ev, ev.Data)
				}
			}
			// Not acknowledged: a poll from the stored cursor gets all three.
			st.close()
			if p := h.poll(phone, "wait=0"); len(p.Envelopes) != 3 {
				t.Fatalf("after the stream, a poll got %d envelopes, want the 3 unacknowledged", len(p.Envelopes))
			}
			// The cursor of the next stream acknowledges; one above the head
			// is refused before the stream starts, as a poll's is.
			if _, r := h.tryStream(phone, "cursor=9", ndjson); r.status != http.StatusConflict || r.errCode(t) != codeCursorAhead {
				t.Fatalf("stream above the head: %d %s", r.status, r.body)
			}
			st = h.openStream(phone, "cursor=2", ndjson)
			if ev := st.next(); ev.Name != "ready" || ev.ID != "2" {
				t.Fatalf("ready %+v, want at 2", ev)
			}
			if ev := st.next(); ev.ID != "3" {
				t.Fatalf("resumed at %+v, want seq 3", ev)
			}
		})
	}
}

// TestStreamLastEventID: a reconnecting EventSource's Last-Event-ID takes
// the cursor's place when it is higher.
func TestStreamLastEventID(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	laptop := h.register("home", "laptop")
	for i := 1; i <= 3; i++ {
		h.send(laptop, fmt.Sprint("m", i), []byte("x"), "phone")
	}
	st := h.openStream(phone, "cursor=1", false, "Last-Event-ID", "2")
	if ev := st.next(); ev.Name != "ready" || ev.ID != "2" {
		t.Fatalf("ready %+v, want at 2", ev)
	}
	if a := st.next().answer(t); len(a.Envelopes) != 1 || a.Envelopes[0].Seq != 3 {
		t.Fatalf("resumed with %+v, want seq 3 alone", a)
	}
	if _, r := h.tryStream(phone, "", false, "Last-Event-ID", "x"); r.status != http.StatusBadRequest || r.errCode(t) != codeBadRequest {
		t.Fatalf("Last-Event-ID x: %d %s", r.status, r.body)
	}
}

// TestStreamNoLostWakeup: a send committed between the stream's first read
// and its wait, or between two waits, wakes it. It goes red with the
// waiter registered after the first read (open), and with the read's
// deadline set after the look for news (stream.wait).
func TestStreamNoLostWakeup(t *testing.T) {
	for _, ndjson := range []bool{false, true} {
		t.Run(fmt.Sprintf("ndjson=%v", ndjson), func(t *testing.T) {
			h := newHarness(t, nil)
			phone := h.register("home", "phone")
			laptop := h.token("home", "laptop")
			var seq atomic.Int64
			sendOne := func() {
				n := seq.Add(1)
				r, err := h.do(context.Background(), "POST", "/v1/send", laptop, map[string]any{"id": fmt.Sprint(n), "to": []string{"phone"}, "payload": []byte("x")})
				if err != nil || r.status != http.StatusAccepted {
					t.Errorf("send in the window: %v %d %s", err, r.status, r.body)
				}
			}
			rounds := int64(200)
			if testing.Short() {
				rounds = 40
			}
			// The first look takes the send between the first read and the
			// wait; each later look sends one. They are the stream's own:
			// a send from outside would be delivered by its sender, with
			// the stream's goroutine asleep (inline.go).
			var looks atomic.Int64
			h.srv.hooks.afterFirstRead = func(device.Key) { sendOne() }
			h.srv.hooks.streamLook = func() {
				if looks.Add(1) > 1 && seq.Load() < rounds {
					sendOne()
				}
			}
			st := h.openStream(phone, "", ndjson)
			if ev := st.next(); ev.Name != "ready" {
				t.Fatalf("first event %+v", ev)
			}
			// The send between the first read and the wait.
			if a := st.next().answer(t); len(a.Envelopes) != 1 || a.Envelopes[0].Seq != 1 {
				t.Fatalf("first batch %+v, want seq 1", a)
			}
			// Then one in every wait.
			got := int64(1)
			for got < rounds {
				for _, e := range st.next().answer(t).Envelopes {
					if e.Seq != got+1 {
						t.Fatalf("got seq %d after %d", e.Seq, got)
					}
					got = e.Seq
				}
			}
		})
	}
}

// TestStreamSupersededEnds: a newer stream or poll of the device ends the
// older stream with an event that says so, and a stream supersedes a held
// poll as a poll does.
func TestStreamSupersededEnds(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	a := h.openStream(phone, "", false)
	a.next()
	b := h.openStream(phone, "", true)
	if e := a.next().end(t); e.Reason != streamSuperseded {
		t.Fatalf("older stream ended with %+v", e)
	}
	a.closedAfter()
	b.next()
	answered := make(chan pollResponse, 1)
	go func() { answered <- h.poll(phone, "wait=20") }()
	if e := b.next().end(t); e.Reason != streamSuperseded {
		t.Fatalf("stream ended by a poll with %+v", e)
	}
	eventually(t, "the poll held", func() bool { return h.srv.HeldPolls() == 1 })
	c := h.openStream(phone, "", false)
	c.next()
	select {
	case p := <-answered:
		if len(p.Envelopes) != 0 {
			t.Fatalf("superseded poll answered %+v", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the held poll was not superseded by a stream")
	}
	if n := testutil.ToFloat64(h.srv.metrics.streams.WithLabelValues(streamSuperseded)); n != 2 {
		t.Errorf("fn_streams_total{superseded} = %v, want 2", n)
	}
}

// TestStreamRemovedEnds: removing the device ends its stream with a 401
// in the last event, and the token's next stream is refused.
func TestStreamRemovedEnds(t *testing.T) {
	h := newHarness(t, nil)
	tablet := h.register("home", "tablet")
	st := h.openStream(tablet, "", false)
	st.next()
	admin := h.mint(token.Claims{Household: "home", Device: "admin", Scope: token.ScopeAdmin, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	h.must("DELETE", "/v1/devices/tablet", admin, nil, http.StatusNoContent)
	e := st.next().end(t)
	if e.Reason != streamRemoved || e.Status != http.StatusUnauthorized || e.Error != codeUnauthorized {
		t.Fatalf("stream of a removed device ended with %+v", e)
	}
	st.closedAfter()
	if _, r := h.tryStream(tablet, "", false); r.status != http.StatusUnauthorized {
		t.Fatalf("removed device's stream: %d %s", r.status, r.body)
	}
}

// TestStreamBudget: what waits is carried in batches within the poll
// budget, the first saying more follows.
func TestStreamBudget(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.PollBudgetBytes = 10 << 10 })
	phone := h.register("home", "phone")
	laptop := h.register("home", "laptop")
	for i := 1; i <= 6; i++ {
		h.send(laptop, fmt.Sprint("m", i), make([]byte, 4<<10), "phone")
	}
	st := h.openStream(phone, "", false)
	st.next()
	var seqs []int64
	for len(seqs) < 6 {
		a := st.next().answer(t)
		var payload int
		for _, e := range a.Envelopes {
			seqs = append(seqs, e.Seq)
			payload += len(e.Payload)
		}
		if payload > 10<<10 && len(a.Envelopes) > 1 {
			t.Fatalf("a batch of %d payload bytes, over the 10 KiB budget", payload)
		}
		if a.More != (len(seqs) < 6) {
			t.Fatalf("more=%v after seq %d", a.More, seqs[len(seqs)-1])
		}
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("seqs %v", seqs)
		}
	}
}

// TestStreamEpochEnds: a new epoch of the store mid-stream ends the stream
// with cursor_ahead and the store's epoch, as a held poll's answer is.
func TestStreamEpochEnds(t *testing.T) {
	db, err := sqlite.Open(context.Background(), sqlite.Config{Path: filepath.Join(t.TempDir(), "relay.db"), Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f := &flippedStore{Store: db}
	h := newHarnessWith(t, Deps{Store: f, Hub: local.New(nil)}, nil)
	phone := h.register("home", "phone")
	st := h.openStream(phone, "", false) // no epoch named: the stream's own is pinned
	st.next()
	const next = "BBBBBBBBBBBBBBBB"
	f.flip(next)
	e := st.next().end(t)
	if e.Reason != streamError || e.Status != http.StatusConflict || e.Error != codeCursorAhead || e.Epoch != next || e.Head == nil {
		t.Fatalf("stream after the epoch changed ended with %+v", e)
	}
}

// TestStreamLifeAndPings: a stream sends keep-alives while idle and ends
// with "expired" when its life is over.
func TestStreamLifeAndPings(t *testing.T) {
	for _, ndjson := range []bool{false, true} {
		t.Run(fmt.Sprintf("ndjson=%v", ndjson), func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.StreamLife = 2 * time.Second })
			h.srv.hooks.streamPing = 50 * time.Millisecond
			phone := h.register("home", "phone")
			st := h.openStream(phone, "", ndjson)
			pings := 0
			for ev := range st.events {
				switch ev.Name {
				case "ping":
					pings++
				case "end":
					if e := ev.end(t); e.Reason != streamExpired {
						t.Fatalf("ended with %+v", e)
					}
					if pings < 3 {
						t.Fatalf("%d pings in a 2 s life at one per 50 ms", pings)
					}
					st.closedAfter()
					return
				}
			}
			t.Fatalf("the stream ended without an end event: %v", <-st.done)
		})
	}
}

// TestStreamPingsOnlyWhenIdle: a keep-alive is due a ping's interval
// after the last thing written, so a stream whose envelopes come more
// often carries none; once they stop, pings come again.
func TestStreamPingsOnlyWhenIdle(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.hooks.streamPing = time.Second
	phone := h.register("home", "phone")
	laptop := h.register("home", "laptop")
	st := h.openStream(phone, "", true)
	st.next()
	const n = 15 // one every 200 ms: 3 s, three pings' worth
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for i := range n {
			<-tick.C
			h.send(laptop, fmt.Sprint("m", i), []byte("x"), "phone")
		}
	}()
	got, pings := 0, 0
	for got < n {
		ev := <-st.events
		switch ev.Name {
		case "ping":
			pings++
		case "envelopes":
			got += len(ev.answer(t).Envelopes)
		default:
			t.Fatalf("event %q (%s) while envelopes came", ev.Name, ev.Data)
		}
	}
	<-sent
	if pings != 0 {
		t.Fatalf("%d pings while an envelope came every 200 ms, with a ping due 1 s after the last event", pings)
	}
	select {
	case ev := <-st.events:
		if ev.Name != "ping" {
			t.Fatalf("event %q (%s) on an idle stream, want a ping", ev.Name, ev.Data)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no ping on a stream idle for 10 s, with one due after 1 s")
	}
}

// TestStreamEndsWithItsToken: a stream ends, "expired", when its token
// does, so that its client comes back with a fresh one.
func TestStreamEndsWithItsToken(t *testing.T) {
	h := newHarness(t, nil)
	h.register("home", "phone")
	tok := h.mint(token.Claims{Household: "home", Device: "phone", IssuedAt: time.Now(), Expires: time.Now().Add(1500 * time.Millisecond)})
	st := h.openStream(tok, "", false)
	st.next()
	opened := time.Now()
	if e := st.next().end(t); e.Reason != streamExpired {
		t.Fatalf("ended with %+v", e)
	}
	if took := time.Since(opened); took > 5*time.Second {
		t.Fatalf("a stream of a token with 1.5 s left ended after %v", took)
	}
}

// TestStreamDrainEnds: a relay shutting down ends its streams with
// "drained", and shutdown waits for them.
func TestStreamDrainEnds(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	st := h.openStream(phone, "", false)
	st.next()
	done := make(chan struct{})
	go func() { h.shutdown(); close(done) }()
	if e := st.next().end(t); e.Reason != streamDrained {
		t.Fatalf("ended with %+v", e)
	}
	st.closedAfter()
	<-done
}

// TestStreamHangupFreesWaiter: a client that goes away ends its stream and
// its registration.
func TestStreamHangupFreesWaiter(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.register("home", "phone")
	st := h.openStream(phone, "", false)
	st.next()
	if h.srv.HeldPolls() != 1 || !h.hub.Held(device.Key{Household: "home", Device: "phone"}) {
		t.Fatal("an open stream holds no waiter")
	}
	st.close()
	eventually(t, "the waiter freed", func() bool {
		return h.srv.HeldPolls() == 0 && !h.hub.Held(device.Key{Household: "home", Device: "phone"})
	})
	eventually(t, "the hang-up counted", func() bool {
		return testutil.ToFloat64(h.srv.metrics.streams.WithLabelValues(streamHangup)) == 1
	})
}

// TestStreamSlowReaderCut: a stream whose reader stops is cut once an
// event's deadline passes, and a stream from its cursor gets the rest:
// nothing lost, repeated or reordered.
func TestStreamSlowReaderCut(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.AnswerTimeout = 200 * time.Millisecond
		// Slow enough that the stream read after the cut, under the race
		// detector on a busy machine, keeps up: 2 MiB in 2.2 s.
		c.AnswerMinRate = 1 << 20
		c.MaxEnvelopeBytes = 1 << 20
	})
	phone := h.register("home", "phone")
	laptop := h.register("home", "laptop")
	conn := stalledRequest(t, h, phone, "/v1/stream")
	// Never read: the kernel's buffers fill, then the relay's write blocks.
	const n = 20
	for i := 1; i <= n; i++ {
		h.send(laptop, fmt.Sprint("m", i), make([]byte, 500<<10), "phone")
	}
	eventually(t, "the stream cut", func() bool {
		return testutil.ToFloat64(h.srv.metrics.streams.WithLabelValues(streamCut)) == 1
	})
	if got := testutil.ToFloat64(h.srv.metrics.answersCut); got < 1 {
		t.Errorf("fn_answers_cut_total = %v, want the stream's cut counted", got)
	}
	conn.Close()
	st := h.openStream(phone, "", true)
	st.next()
	var want int64 = 1
	for want <= n {
		for _, e := range st.next().answer(t).Envelopes {
			if e.Seq != want {
				t.Fatalf("after the cut, seq %d where %d was due", e.Seq, want)
			}
			want++
		}
	}
}

// TestStreamRefusedBeforeStart: a stream is admitted as a poll is.
func TestStreamRefusedBeforeStart(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxHeldPolls = 1 })
	phone := h.register("home", "phone")
	laptop := h.register("home", "laptop")
	st := h.openStream(phone, "", false)
	st.next()
	if _, r := h.tryStream(laptop, "", false); r.status != http.StatusServiceUnavailable || r.errCode(t) != codeOverloaded {
		t.Fatalf("stream past FN_MAX_HELD_POLLS: %d %s", r.status, r.body)
	}
	if r := h.try("GET", "/v1/stream", "", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("stream without a token: %d %s", r.status, r.body)
	}
	if r := h.try("GET", "/v1/stream?cursor=x", laptop, nil); r.status != http.StatusBadRequest {
		t.Fatalf("stream with a bad cursor: %d %s", r.status, r.body)
	}
}
