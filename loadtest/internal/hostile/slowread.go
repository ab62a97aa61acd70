package hostile

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/flamenet/relay/internal/procstat"
	"github.com/flamenet/relay/loadtest/internal/wait"
	"github.com/flamenet/relay/token"
)

// SlowReaderKind names the slow readers' requests in the report.
const SlowReaderKind = "slow reader: poll with 2 MiB waiting, 4 KiB receive buffer, never read"

// slowReaderWaiting is what the slow readers' device sends itself first.
const slowReaderWaiting = 2 << 20

// slowReaderBuffer is each slow reader's receive buffer.
const slowReaderBuffer = 4 << 10

// slowReaders is a client that asks and never reads: one device token
// sends itself about 2 MiB of envelopes, then opens n connections, each
// with a 4 KiB receive buffer, and polls cursor=0&wait=0 on each. It reads
// nothing until every answer must have been refused or cut: the relay's
// FN_ANSWER_TIMEOUT plus the answer's size at FN_ANSWER_MIN_RATE, plus
// slack (limit). Then it reads what came, and opens the next round of n,
// until the offered duration is over. What fails the run: an answer
// neither refused nor cut by then (still open, or handed whole to the
// kernel while nobody read it), or a 5xx other than 503.
type slowReaders struct {
	h      *Hostile
	n      int
	target string
	relay  int
	local  net.Addr
	// envelope is the payload of each envelope sent, count how many.
	envelope, count int
	limit           time.Duration

	household, tok string

	mu sync.Mutex
	// dueBy is when the last poll sent must have been refused or cut, and
	// judged; filling says the device is still being filled.
	dueBy   time.Time
	filling bool
	// The machine's kernel TCP memory while the attack runs.
	tcpBase, tcpPeak  int64
	rounds, connected int
}

func newSlowReaders(h *Hostile, cfg Config) *slowReaders {
	env := min(slowReaderWaiting, cfg.Relay.MaxEnvelopeBytes)
	count := (slowReaderWaiting + env - 1) / env
	// The answer's size as the relay bounds it: base64, and at most about
	// a kilobyte of fields per envelope.
	answer := float64(slowReaderWaiting)*4/3 + float64(count)*1100 + 1024
	limit := cfg.Relay.AnswerTimeout + time.Duration(answer/float64(cfg.Relay.AnswerMinRate)*float64(time.Second)) + hostileSlack
	s := &slowReaders{h: h, n: cfg.SlowReaders, target: h.targets[0], envelope: env, count: count, limit: limit,
		household: "hostile-" + h.tag + "-slow"}
	if host, _, err := net.SplitHostPort(s.target); err == nil && host == "127.0.0.1" {
		// Source addresses of their own, apart from the pairs' and the
		// other hostile connections'.
		s.local = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 200)}
	}
	now := time.Now()
	s.tok, _ = token.Mint(h.key, token.Claims{Household: s.household, Device: hostileDevice, IssuedAt: now, Expires: now.Add(3 * time.Hour), Scope: token.ScopeDevice})
	return s
}

// run fills the device, then sends rounds of n slow readers until end
// (at least one), or until ctx ends.
func (s *slowReaders) run(ctx context.Context, end time.Time) {
	sampled := make(chan struct{})
	sctx, stopSampling := context.WithCancel(ctx)
	go func() {
		defer close(sampled)
		s.sampleTCP(sctx)
	}()
	defer func() {
		stopSampling()
		<-sampled
	}()
	s.mu.Lock()
	s.filling = true
	s.mu.Unlock()
	if !s.fill(ctx, end) {
		s.mu.Lock()
		s.filling = false
		s.mu.Unlock()
		return
	}
	for round := 0; ctx.Err() == nil && (round == 0 || time.Now().Before(end)); round++ {
		// Judged by then, however long the dials take.
		s.mu.Lock()
		s.dueBy = later(s.dueBy, time.Now().Add(slowDial+s.limit+judgeFor))
		s.filling = false
		s.mu.Unlock()
		var wg sync.WaitGroup
		for range s.n {
			wg.Go(func() { s.one(ctx) })
		}
		wg.Wait()
		s.mu.Lock()
		s.rounds++
		s.mu.Unlock()
	}
}

// due is when the slow readers' polls sent so far are judged; while the
// device is being filled, a poll about to go out.
func (s *slowReaders) due() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.filling {
		return time.Now().Add(s.limit + judgeFor)
	}
	return s.dueBy
}

// fill registers the device and sends it envelopes until about 2 MiB wait
// for it, retrying a send the relay turns away after its Retry-After, and
// giving up at end.
func (s *slowReaders) fill(ctx context.Context, end time.Time) bool {
	c, err := dialRaw(ctx, s.target, s.local)
	if err != nil {
		s.h.transport(ctx, SlowReaderKind+" (setup)", s.relay, time.Now(), err)
		return false
	}
	defer c.close()
	auth := []string{"Authorization: Bearer " + s.tok, "Content-Type: application/json"}
	do := func(method, path string, body []byte) (*http.Response, []byte, bool) {
		s.h.count()
		resp, b, err := c.roundTrip(rawRequest(method, path, auth, body), time.Now().Add(s.h.closeLimit))
		if err != nil {
			s.h.transport(ctx, SlowReaderKind+" (setup)", s.relay, time.Now(), err)
			return nil, nil, false
		}
		return resp, b, true
	}
	if resp, b, ok := do(http.MethodPost, "/v1/register", []byte("{}")); !ok || resp.StatusCode != http.StatusOK {
		if ok {
			outcome, _ := answerOutcome(resp, b, false)
			s.h.note(ctx, SlowReaderKind+" (setup)", "register "+outcome, "device not registered")
		}
		return false
	}
	payload := make([]byte, s.envelope)
	for i := 0; i < s.count; {
		body, _ := json.Marshal(sendRequest{ID: "slow-" + s.h.tag + "-" + strconv.Itoa(i), To: []string{hostileDevice}, Payload: payload})
		resp, b, ok := do(http.MethodPost, "/v1/send", body)
		switch {
		case !ok:
			return false
		case resp.StatusCode == http.StatusAccepted:
			i++
		case time.Now().After(end):
			outcome, _ := answerOutcome(resp, b, false)
			s.h.note(ctx, SlowReaderKind+" (setup)", "send "+outcome, "device not filled within the offered duration")
			return false
		case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
			secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			if !wait.For(ctx, time.Duration(max(secs, 1))*time.Second) {
				return false
			}
		default:
			outcome, fail := answerOutcome(resp, b, false)
			s.h.note(ctx, SlowReaderKind+" (setup)", "send "+outcome, joinMsg(fail, "envelopes not stored"))
			return false
		}
	}
	return true
}

// one is one slow reader: it polls, reads nothing for limit, then reads
// what arrived to tell how the relay dealt with it.
func (s *slowReaders) one(ctx context.Context) {
	d := net.Dialer{Timeout: slowDial, LocalAddr: s.local, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, slowReaderBuffer)
		}); err != nil {
			return err
		}
		return serr
	}}
	from := time.Now()
	c, err := d.DialContext(ctx, "tcp", s.target)
	if err != nil {
		s.h.transport(ctx, SlowReaderKind, s.relay, from, err)
		return
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	s.mu.Lock()
	s.connected++
	s.mu.Unlock()
	s.h.count()
	_ = c.SetWriteDeadline(from.Add(s.h.closeLimit))
	if _, err := io.WriteString(c, "GET /v1/poll?cursor=0&wait=0 HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer "+s.tok+"\r\n\r\n"); err != nil {
		s.h.transport(ctx, SlowReaderKind, s.relay, from, err)
		return
	}
	// Not reading is the attack: the relay must do without this client
	// until the limit.
	if !wait.For(ctx, time.Until(from.Add(s.limit))) {
		s.h.note(ctx, SlowReaderKind, "", "")
		return
	}
	outcome, fail := s.judge(c)
	s.h.note(ctx, SlowReaderKind, outcome, fail)
}

// judgeFor bounds how long judge reads, slowDial a slow reader's dial.
const (
	judgeFor = 2 * time.Second
	slowDial = 5 * time.Second
)

// judge reads what the relay left on c: a refusal, an answer cut short
// (the connection reset), or an answer neither refused nor cut.
func (s *slowReaders) judge(c net.Conn) (outcome, fail string) {
	_ = c.SetReadDeadline(time.Now().Add(judgeFor))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	switch {
	case err != nil && isTimeout(err):
		return "no answer, not closed", fmt.Sprintf("neither answered nor closed within %s", s.limit.Round(time.Second))
	case err != nil:
		return "reset before the status line (cut)", ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return answerOutcome(resp, body, false)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	switch {
	case err == nil:
		return "200 read whole", "an answer handed whole to a client that did not read"
	case isTimeout(err):
		return "200 not cut", fmt.Sprintf("answer neither refused nor cut within %s", s.limit.Round(time.Second))
	}
	return "200 cut", ""
}

// sampleTCP records the machine's kernel TCP memory (every socket's, the
// tester's included) every 250 ms until ctx ends.
func (s *slowReaders) sampleTCP(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for first := true; ; first = false {
		if n, err := procstat.TCPMemory(); err == nil {
			s.mu.Lock()
			if first {
				s.tcpBase = n
			}
			s.tcpPeak = max(s.tcpPeak, n)
			s.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *slowReaders) summary() (rounds, connected int, limit float64, tcpBase, tcpPeak int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rounds, s.connected, math.Round(s.limit.Seconds()*10) / 10, s.tcpBase, s.tcpPeak
}
