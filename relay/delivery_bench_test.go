package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/servicetest"
)

// BenchmarkDelivery is the relay's whole path for one envelope, over real
// HTTP on a loopback socket: a send, the answer of the recipient's held
// poll (parked, then woken), and the recipient's next poll, which parks
// again (held: the poll waits in its handler instead, FN_PARK_POLLS=off;
// stream: each recipient holds a stream instead).
// Each send waits for its delivery, so that the figures are work, not
// queueing. The client is in the same process: its share is in every
// figure, so compare runs with each other (allocs/op is the steadiest);
// the load tester measures the relay alone. The postgres case needs the
// Postgres the tests use (FN_TEST_DATABASE_URL). Run:
//
//	go test -run '^$' -bench Delivery -benchtime 5000x ./relay/
func BenchmarkDelivery(b *testing.B) {
	sqlite := func(park bool) func(b *testing.B) *harness {
		return func(b *testing.B) *harness { return newHarness(b, func(c *Config) { c.ParkPolls = park }) }
	}
	pg := func(b *testing.B) *harness {
		h, _ := pgHarness(b, servicetest.PostgresDatabase(b), 8, nil)
		return h
	}
	b.Run("parked", func(b *testing.B) { benchDelivery(b, sqlite(true), pollRecipient) })
	b.Run("held", func(b *testing.B) { benchDelivery(b, sqlite(false), pollRecipient) })
	b.Run("stream", func(b *testing.B) { benchDelivery(b, sqlite(true), streamRecipient) })
	// The store in a process of its own: what is left is the relay's.
	b.Run("postgres", func(b *testing.B) { benchDelivery(b, pg, pollRecipient) })
	b.Run("postgres-stream", func(b *testing.B) { benchDelivery(b, pg, streamRecipient) })
}

// A recipient receives until ctx ends, passing each seq to got.
type recipient func(ctx context.Context, b *testing.B, h *harness, tok string, got chan<- int64)

// pollRecipient long-polls, each poll from the last one's cursor.
func pollRecipient(ctx context.Context, b *testing.B, h *harness, tok string, got chan<- int64) {
	cursor := int64(0)
	for {
		r, err := h.do(ctx, "GET", fmt.Sprintf("/v1/poll?cursor=%d&wait=20", cursor), tok, nil)
		if err != nil {
			return // cancelled
		}
		var p pollResponse
		if r.status != http.StatusOK || json.Unmarshal(r.body, &p) != nil {
			b.Errorf("poll: %d %s", r.status, r.body)
			return
		}
		cursor = p.Cursor
		for _, e := range p.Envelopes {
			got <- e.Seq
		}
	}
}

// streamRecipient holds one stream (an NDJSON one: the client's parsing
// is in the figures too, and is the lighter) and never acknowledges: a
// minute's acks are nothing beside a benchmark's envelopes.
func streamRecipient(ctx context.Context, b *testing.B, h *harness, tok string, got chan<- int64) {
	req, err := http.NewRequestWithContext(ctx, "GET", h.url+"/v1/stream", nil)
	if err != nil {
		b.Error(err)
		return
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", contentNDJSON)
	resp, err := h.client.Do(req)
	if err != nil {
		return // cancelled
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev struct {
			Event string       `json:"event"`
			Data  pollResponse `json:"data"`
		}
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() == nil {
				b.Errorf("stream: %v", err)
			}
			return
		}
		for _, e := range ev.Data.Envelopes {
			got <- e.Seq
		}
	}
}

func benchDelivery(b *testing.B, newH func(*testing.B) *harness, receive recipient) {
	const recipients = 64
	h := newH(b)
	sender := h.register("home", "sender")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan int64, recipients)
	done := make(chan struct{}, recipients)
	for i := range recipients {
		tok := h.register("home", fmt.Sprint("r", i))
		go func() {
			defer func() { done <- struct{}{} }()
			receive(ctx, b, h, tok, got)
		}()
	}
	eventually(b, "every poll held", func() bool { return h.srv.HeldPolls() == recipients })
	payload := make([]byte, 256)
	body := func(n int) []byte {
		j, _ := json.Marshal(map[string]any{"id": fmt.Sprint("m", n), "to": []string{fmt.Sprint("r", n%recipients)}, "payload": payload})
		return j
	}

	b.ReportAllocs()
	var before syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	b.ResetTimer()
	for n := range b.N {
		r, err := h.do(ctx, "POST", "/v1/send", sender, body(n))
		if err != nil || r.status != http.StatusAccepted {
			b.Fatalf("send: %v %d %s", err, r.status, r.body)
		}
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			b.Fatal("no delivery")
		}
	}
	b.StopTimer()
	var after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	cancel()
	for range recipients {
		<-done
	}
}
