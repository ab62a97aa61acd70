// Package failover runs the relay on a highly available Postgres (a
// pg_auto_failover formation of internal/hapg), kills the primary under
// load and checks what clients see while the manager promotes the
// standby.
package failover

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/hapg"
	"github.com/flamenet/relay/internal/hapg/hapgtest"
	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/token"
)

var relayBin string

func TestMain(m *testing.M) { os.Exit(servicetest.RunWithRelay(m, &relayBin)) }

// storeTimeout is the relay's FN_STORE_TIMEOUT here (its default): no
// answer may take longer than this plus answerSlack.
const (
	storeTimeout = 5 * time.Second
	answerSlack  = 2 * time.Second
)

// resumeBound is how soon after the fault deliveries must resume.
const resumeBound = 15 * time.Second

var servingLine = regexp.MustCompile(`msg=serving addr=http://(\S+)`)

// startRelay runs the relay binary on the database URL and returns its
// base URL and issuer key; it is stopped when the test ends.
func startRelay(t *testing.T, dbURL string) (string, ed25519.PrivateKey) {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	return startRelayWithKey(t, dbURL, key)
}

// startRelayWithKey is startRelay trusting key's tokens.
func startRelayWithKey(t *testing.T, dbURL string, key ed25519.PrivateKey) (string, ed25519.PrivateKey) {
	t.Helper()
	pub := key.Public().(ed25519.PublicKey)
	cmd := exec.Command(relayBin)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"FN_LISTEN=127.0.0.1:0",
		"FN_DATABASE_URL=" + dbURL,
		"FN_ISSUER_KEYS=" + base64.StdEncoding.EncodeToString(pub),
		"FN_STORE_TIMEOUT=" + storeTimeout.String(),
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logs := &servicetest.Buffer{}
	addr := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.Write([]byte(sc.Text() + "\n"))
			if m := servingLine.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("relay log:\n%s", logs.String())
		}
	})
	select {
	case a := <-addr:
		return "http://" + a, key
	case <-done:
		t.Fatalf("relay exited before serving:\n%s", logs.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("relay did not start:\n%s", logs.String())
	}
	return "", nil
}

// mintToken is an hour's token of the household "home" for dev.
func mintToken(t *testing.T, key ed25519.PrivateKey, dev, scope string) string {
	t.Helper()
	tok, err := token.Mint(key, token.Claims{Household: "home", Device: dev, Scope: scope, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// apiRequest is a request to the relay at base with tok, and body, when
// not nil, in JSON.
func apiRequest(ctx context.Context, base, method, path, tok string, body any) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// attempt is one send request and how it was answered.
type attempt struct {
	at, answered time.Time
	status       int // 0: no answer
	err          error
}

// sent is one send (one id), tried until the relay answered 202.
type sent struct {
	id, to   string
	seq      int64 // from the 202; 0 without one
	accepted time.Time
	attempts []attempt
}

// got is one envelope as a recipient's poll returned it.
type got struct {
	id  string
	seq int64
	at  time.Time
}

// load is twenty devices polling and acknowledging explicitly and a
// sender sending to them in turn, on one relay, for a failover test.
type load struct {
	t      *testing.T
	ctx    context.Context
	sender *client.Client

	mu       sync.Mutex
	sends    []*sent
	received [][]got
	pollErrs []string

	stopPolls         context.CancelFunc
	pollers, inflight sync.WaitGroup
}

const devices, rate = 20, 20

// startLoad registers the devices and starts their polls.
func startLoad(t *testing.T, base string, key ed25519.PrivateKey) *load {
	t.Helper()
	mint := func(dev string) string { return mintToken(t, key, dev, token.ScopeDevice) }
	hc := &http.Client{Timeout: 30 * time.Second}
	newClient := func(dev string) *client.Client {
		c, err := client.New(base, mint(dev), client.WithHTTPClient(hc))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	l := &load{t: t, ctx: t.Context(), sender: newClient("sender"), received: make([][]got, devices)}
	recipients := make([]*client.Client, devices)
	for i := range recipients {
		recipients[i] = newClient(fmt.Sprint("d", i))
		if _, err := recipients[i].Register(l.ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Recipients: hold a poll without a cursor, acknowledge what came
	// (POST /v1/ack), again; a 503 is waited out as its Retry-After asks.
	polls, stop := context.WithCancel(l.ctx)
	l.stopPolls = stop
	for d, c := range recipients {
		l.pollers.Go(func() {
			for polls.Err() == nil {
				resp, err := c.Poll(polls, client.PollQuery{OmitCursor: true, Wait: 2})
				now := time.Now()
				if err == nil && len(resp.Envelopes) > 0 {
					l.mu.Lock()
					for _, e := range resp.Envelopes {
						l.received[d] = append(l.received[d], got{id: e.ID, seq: e.Seq, at: now})
					}
					l.mu.Unlock()
					err = c.Ack(polls, client.Position{Cursor: resp.Cursor, Epoch: resp.Epoch})
				}
				if err == nil || polls.Err() != nil {
					continue
				}
				var se *client.Error
				if errors.As(err, &se) && se.Status == http.StatusServiceUnavailable {
					sleep(polls, max(se.RetryAfter, 100*time.Millisecond))
					continue
				}
				l.mu.Lock()
				l.pollErrs = append(l.pollErrs, fmt.Sprintf("d%d: %v", d, err))
				l.mu.Unlock()
				sleep(polls, 200*time.Millisecond)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		l.pollers.Wait()
		l.inflight.Wait()
	})
	return l
}

// send tries s with its id until 202, as a careful client does: again
// after a 503's Retry-After, never after another answer.
func (l *load) send(s *sent) {
	for l.ctx.Err() == nil {
		a := attempt{at: time.Now()}
		resp, err := l.sender.SendOnce(l.ctx, s.id, []string{s.to}, []byte(s.id))
		a.answered = time.Now()
		var se *client.Error
		switch {
		case err == nil:
			a.status = http.StatusAccepted
		case errors.As(err, &se):
			a.status, a.err = se.Status, err
		default:
			a.err = err
		}
		l.mu.Lock()
		s.attempts = append(s.attempts, a)
		if err == nil {
			s.accepted = a.answered
			for _, d := range resp.Deliveries {
				if d.Device == s.to {
					s.seq = d.Seq
				}
			}
		}
		l.mu.Unlock()
		if err == nil || a.status != http.StatusServiceUnavailable {
			return
		}
		sleep(l.ctx, max(se.RetryAfter, 100*time.Millisecond))
	}
}

// sendFor starts rate sends a second, each to one device in turn, for d.
func (l *load) sendFor(d time.Duration) {
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	end := time.Now().Add(d)
	for time.Now().Before(end) && l.ctx.Err() == nil {
		<-tick.C
		l.mu.Lock()
		s := &sent{id: fmt.Sprint("m", len(l.sends)), to: fmt.Sprint("d", len(l.sends)%devices)}
		l.sends = append(l.sends, s)
		l.mu.Unlock()
		l.inflight.Go(func() { l.send(s) })
	}
}

// finish waits for the sends' answers, then for every accepted send to
// arrive (at most 20 s), stops the polls and checks the run against the
// fault at event (see check).
func (l *load) finish(event time.Time) {
	t := l.t
	t.Helper()
	l.inflight.Wait()
	deadline := time.Now().Add(20 * time.Second)
	for {
		l.mu.Lock()
		n, want := 0, 0
		for _, r := range l.received {
			n += len(r)
		}
		for _, s := range l.sends {
			if s.seq > 0 {
				want++
			}
		}
		l.mu.Unlock()
		if n >= want || time.Now().After(deadline) {
			break
		}
		sleep(l.ctx, 50*time.Millisecond) // bounded poll of the recipients' tallies
	}
	l.stopPolls()
	l.pollers.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	check(t, l.sends, l.received, event)
	for _, e := range l.pollErrs {
		t.Errorf("poll or ack: %s", e)
	}
}

// TestPrimaryLost: the relay on a synchronous two-node formation, twenty
// devices polling and acknowledging explicitly, twenty sends a second;
// the primary's machine is lost mid-run (keeper and Postgres SIGKILLed)
// and the monitor promotes the standby. Every send answered 202 is
// delivered exactly once, in seq order; no seq is given twice to one
// device; sends while no primary takes writes are answered 503 (never
// 500, never later than the store's deadline); deliveries resume within
// 15 s of the kill.
func TestPrimaryLost(t *testing.T) {
	f := hapgtest.Start(t, hapg.Sync)
	base, key := startRelay(t, f.URL())
	l := startLoad(t, base, key)
	ctx := t.Context()

	l.sendFor(4 * time.Second)
	old, err := f.KillPrimary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Every process of the primary was stopped, then killed, by now.
	killed := time.Now()
	promoted := make(chan error, 1)
	go func() {
		p, err := f.WaitPrimary(ctx, old)
		if err == nil {
			t.Logf("%s promoted %v after the kill", p.Name, time.Since(killed).Round(time.Millisecond))
		}
		promoted <- err
	}()
	// Sends go on through the outage and for a while after it.
	l.sendFor(20 * time.Second)
	if err := <-promoted; err != nil {
		t.Fatal(err)
	}
	l.finish(killed)
}

// TestNetworkSplit: the primary is cut off from the monitor, the standby
// and the relay (a network split between them, the relay on the
// standby's side). The monitor decides: it promotes the standby once the
// primary has been unhealthy for primary_demote_timeout, and the relay
// goes on there. The same claims as TestPrimaryLost hold, from the split.
//
// The old primary goes on running, cut off: pg_autoctl 2.0's keeper
// fences a primary only when it has seen its standby while the monitor
// was away (see docs/OPERATIONS.md, "High availability, plainly"). The
// test logs whether it still takes writes.
func TestNetworkSplit(t *testing.T) {
	ctx := t.Context()
	if err := hapg.Missing(); err != nil {
		servicetest.Unavailable(t, "pg_autoctl and the pgautofailover extension", err)
	}
	f, err := hapg.Launch(ctx, hapg.Config{Mode: hapg.Sync, Partitionable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("hapg: close: %v", err)
		}
	})
	base, key := startRelay(t, f.URL())
	l := startLoad(t, base, key)

	l.sendFor(4 * time.Second)
	old, err := f.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Split(old); err != nil {
		t.Fatal(err)
	}
	split := time.Now()
	promoted := make(chan error, 1)
	go func() {
		p, err := f.WaitPrimary(ctx, old)
		if err == nil {
			t.Logf("%s promoted %v after the split", p.Name, time.Since(split).Round(time.Millisecond))
			if f.WaitNotWritable(ctx, old, time.Second) != nil {
				t.Logf("%s, cut off, still takes writes", old.Name)
			}
		}
		promoted <- err
	}()
	l.sendFor(20 * time.Second)
	if err := <-promoted; err != nil {
		t.Fatal(err)
	}
	l.finish(split)
}

// check holds a run to the tests' claims; event is the fault.
func check(t *testing.T, sends []*sent, received [][]got, event time.Time) {
	t.Helper()
	bySeq := map[string]map[int64]string{} // device -> seq -> id
	accepted, refused, bad, slow := 0, 0, 0, 0
	var took503 []time.Duration
	for _, s := range sends {
		for _, a := range s.attempts {
			switch {
			case a.status == http.StatusServiceUnavailable:
				refused++
				took503 = append(took503, a.answered.Sub(a.at))
			case a.status != http.StatusAccepted:
				bad++
				t.Errorf("send %s at %s: %v, want 202 or 503", s.id, a.at.Sub(event).Round(time.Millisecond), a.err)
			}
			if took := a.answered.Sub(a.at); took > storeTimeout+answerSlack {
				slow++
				t.Errorf("send %s answered after %v, past the store deadline (%v)", s.id, took.Round(time.Millisecond), storeTimeout)
			}
		}
		if s.seq == 0 {
			t.Errorf("send %s never answered 202 (%d attempts)", s.id, len(s.attempts))
			continue
		}
		accepted++
		if bySeq[s.to] == nil {
			bySeq[s.to] = map[int64]string{}
		}
		if other, ok := bySeq[s.to][s.seq]; ok {
			t.Errorf("seq %d of %s given to both %s and %s", s.seq, s.to, other, s.id)
		}
		bySeq[s.to][s.seq] = s.id
	}
	if refused == 0 {
		t.Errorf("no send was refused: the fault did not land mid-run")
	}

	// Deliveries: each accepted send once, to its device, in seq order.
	idOf := map[string]*sent{}
	for _, s := range sends {
		idOf[s.id] = s
	}
	var resumed time.Duration = -1
	for d, list := range received {
		dev := fmt.Sprint("d", d)
		seen := map[string]int{}
		for i, g := range list {
			seen[g.id]++
			if i > 0 && g.seq <= list[i-1].seq {
				t.Errorf("%s: seq %d (%s) after seq %d (%s): out of order or repeated", dev, g.seq, g.id, list[i-1].seq, list[i-1].id)
			}
			s := idOf[g.id]
			if s == nil || s.to != dev {
				t.Errorf("%s got %s, not sent to it", dev, g.id)
				continue
			}
			if s.seq != 0 && s.seq != g.seq {
				t.Errorf("%s got %s as seq %d, its 202 said %d", dev, g.id, g.seq, s.seq)
			}
			// Resumed: a send first tried after the fault arrives.
			if s.attempts[0].at.After(event) && (resumed < 0 || g.at.Sub(event) < resumed) {
				resumed = g.at.Sub(event)
			}
		}
		for _, s := range sends {
			if s.to != dev || s.seq == 0 {
				continue
			}
			switch seen[s.id] {
			case 1:
			case 0:
				t.Errorf("%s: send %s (seq %d) answered 202 and never delivered", dev, s.id, s.seq)
			default:
				t.Errorf("%s: send %s delivered %d times", dev, s.id, seen[s.id])
			}
		}
	}
	slices.Sort(took503)
	t.Logf("%d sends, %d accepted, %d answers 503 (in %v at the median, %v at most), %d other failures, %d slow; deliveries resumed %v after the fault",
		len(sends), accepted, refused, pct(took503, 50), pct(took503, 100), bad, slow, resumed.Round(time.Millisecond))
	if resumed < 0 || resumed > resumeBound {
		t.Errorf("deliveries resumed %v after the fault, want within %v", resumed.Round(time.Millisecond), resumeBound)
	}
}

// pct is the p-th percentile of sorted, rounded to milliseconds.
func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)].Round(time.Millisecond)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
