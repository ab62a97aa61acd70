package relay

import (
	"fmt"
	"io"
	"net"
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
	if _, err := io.WriteString(c, "GET /v1/poll?"+query+" HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer "+tok+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestNonReadingClientIsCut: an answer the client does not read is cut at
// its deadline, which fits its size: the connection is reset, and the
// envelopes are still there for the next poll;
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
		eventually(t, "the poll parked", func() bool { return h.srv.parking.now.Load() == 1 })
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
