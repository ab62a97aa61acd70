package relay

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fillDevice sends the device n envelopes of size bytes each, from
// another device of its household.
func fillDevice(t *testing.T, h *harness, household, device string, n, size int) {
	t.Helper()
	sender := h.register(household, "filler-"+device)
	h.register(household, device)
	for i := range n {
		h.send(sender, fmt.Sprintf("fill-%s-%d", device, i), make([]byte, size), device)
	}
}

// stalledPoll sends a poll with tok and query on a connection whose
// receive buffer is 4 KiB, and never reads the answer: a client that stops
// reading.
func stalledPoll(t *testing.T, h *harness, tok, query string) net.Conn {
	t.Helper()
	return stalledRequest(t, h, tok, "/v1/poll?"+query)
}

// stalledRequest is stalledPoll for any GET of target.
func stalledRequest(t *testing.T, h *harness, tok, target string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "GET "+target+" HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer "+tok+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestNonReadingClientIsCut: an answer the client does not read is cut at
// its deadline, which fits its size: the connection is reset, the answer's
// bytes are released, and the envelopes are still there for the next poll;
// for a poll answered at once and for one that parked and was woken.
// Red three ways: without the answer's own deadline (the one set when its
// request came cut it too early), without any deadline (it waited in Write
// for ever), and without the bound on unsent bytes, TCP_NOTSENT_LOWAT (the
// kernel took the whole answer, the write returned and nothing was cut).
func TestNonReadingClientIsCut(t *testing.T) {
	const base, rate = 200 * time.Millisecond, 7 << 20
	harness := func(t *testing.T) *harness {
		return newHarness(t, func(c *Config) {
			c.AnswerTimeout = base
			c.AnswerMinRate = rate
			c.MaxEnvelopeBytes = 2 << 20
		})
	}
	// 2 MiB waiting: the answer's size adds about 0.4 s to its time.
	timeout := func(n int64) time.Duration {
		return base + time.Duration(float64(answerSize(n, 2<<20))/rate*float64(time.Second))
	}
	t.Run("answered at once", func(t *testing.T) {
		h := harness(t)
		fillDevice(t, h, "home", "phone", 32, 64<<10)
		tok := h.token("home", "phone")
		start := time.Now()
		c := stalledPoll(t, h, tok, "cursor=0&wait=0")
		checkCut(t, h, tok, c, start, timeout(32), 32)
	})
	t.Run("parked, then woken", func(t *testing.T) {
		h := harness(t)
		tok := h.register("home", "phone")
		sender := h.register("home", "laptop")
		c := stalledPoll(t, h, tok, "cursor=0&wait=10")
		eventually(t, "the poll parked", func() bool { return h.srv.parking.Parked.Load() == 1 })
		start := time.Now()
		h.send(sender, "big", make([]byte, 2<<20), "phone")
		checkCut(t, h, tok, c, start, timeout(1), 1)
	})
}

// checkCut waits for the answer on c, which wants envelopes, to be cut,
// and not before timeout after start.
func checkCut(t *testing.T, h *harness, tok string, c net.Conn, start time.Time, timeout time.Duration, envelopes int) {
	t.Helper()
	cut := func() float64 { return testutil.ToFloat64(h.srv.metrics.answersCut) }
	eventually(t, "the unread answer cut", func() bool { return cut() == 1 })
	if d := time.Since(start); d < timeout {
		t.Fatalf("the answer was cut after %v, before its deadline of %v", d, timeout)
	}
	eventually(t, "the cut answer's bytes released", func() bool { return h.srv.limits.answers.total.Load() == 0 })

	// The client finds its connection reset before the answer's end.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := io.Copy(io.Discard, c)
	if err == nil || isTimeout(err) {
		t.Fatalf("the stalled connection read %d bytes and then %v, want a reset", n, err)
	}

	// Nothing was acknowledged and nothing is lost: a client that reads
	// gets all of it.
	var got int
	for cursor := int64(0); ; {
		p := h.poll(tok, fmt.Sprintf("cursor=%d&wait=0", cursor))
		got += len(p.Envelopes)
		cursor = p.Cursor
		if !p.More {
			break
		}
	}
	if got != envelopes {
		t.Fatalf("after the cut the device received %d envelopes, want %d", got, envelopes)
	}
	if cut() != 1 {
		t.Fatalf("%v answers cut, want only the stalled one", cut())
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestAnswersInFlightBound: while a client sits on a large answer, its
// device's next poll is refused 429 answers_in_flight (device_answer_bytes)
// and so is another device's large answer once the relay's bound would be
// passed (relay_answer_bytes); a small answer still fits. When the stalled
// client goes, the bytes are released and both polls are answered. Taking
// every reservation (take always "") turned this red.
func TestAnswersInFlightBound(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.DeviceAnswerBytesInFlight = 1 << 20
		c.AnswerBytesInFlight = 4 << 20
		c.AnswerTimeout = time.Minute // released by the client's hang-up, not the deadline
	})
	fillDevice(t, h, "home", "phone", 32, 64<<10)
	fillDevice(t, h, "other", "tablet", 32, 64<<10)
	fillDevice(t, h, "third", "watch", 1, 100)
	phone, tablet, watch := h.token("home", "phone"), h.token("other", "tablet"), h.token("third", "watch")

	// Alone, the answer is let through whatever its size.
	c := stalledPoll(t, h, phone, "cursor=0&wait=0")
	eventually(t, "the stalled answer in flight", func() bool { return h.srv.limits.answers.total.Load() > 2<<20 })

	refused := func(tok, limit string) {
		t.Helper()
		r, err := h.do(context.Background(), "GET", "/v1/poll?cursor=0&wait=0", tok, nil)
		if err != nil || r.status != http.StatusTooManyRequests {
			t.Fatalf("poll beside a stalled answer: %d %.200s, %v; want 429", r.status, r.body, err)
		}
		var e errorBody
		r.json(t, &e)
		if e.Error != codeAnswersInFlight || e.Limit != limit || r.header.Get("Retry-After") == "" {
			t.Fatalf("refusal = %s %v, want answers_in_flight %s with Retry-After", r.body, r.header, limit)
		}
		if got := testutil.ToFloat64(h.srv.metrics.refusals.WithLabelValues(limit)); got != 1 {
			t.Fatalf("fn_admission_refusals_total{reason=%q} = %v, want 1", limit, got)
		}
	}
	refused(phone, limitDeviceAnswers)
	refused(tablet, limitRelayAnswers)
	if p := h.poll(watch, "cursor=0&wait=0"); len(p.Envelopes) != 1 {
		t.Fatalf("a small answer beside the stalled one: %+v", p)
	}

	// The client hangs up: its answer's bytes go, and the refused polls
	// are answered.
	c.Close()
	eventually(t, "the stalled answer's bytes released", func() bool { return h.srv.limits.answers.total.Load() == 0 })
	for _, tok := range []string{phone, tablet} {
		if p := h.poll(tok, "cursor=0&wait=0"); len(p.Envelopes) != 32 {
			t.Fatalf("after the release a poll got %d envelopes, want 32", len(p.Envelopes))
		}
	}
}
