// Package failover runs the relay on a highly available Postgres (a
// pg_auto_failover formation of internal/hapg), kills the primary under
// load and checks what clients see while the manager promotes the
// standby.
package failover

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
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

var servingLine = regexp.MustCompile(`msg=serving addr=http://(\S+)`)

// startRelay runs the relay binary on the database URL and returns its
// base URL and issuer key; it is stopped when the test ends.
func startRelay(t *testing.T, dbURL string) (string, ed25519.PrivateKey) {
	t.Helper()
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
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

// TestPrimaryLost: the relay on a synchronous two-node formation, twenty
// devices polling and acknowledging explicitly, twenty sends a second;
// the primary's machine is lost mid-run (keeper and Postgres SIGKILLed)
// and the monitor promotes the standby. Every send answered 202 is
// delivered exactly once, in seq order; no seq is given twice to one
// device; sends while no primary takes writes are answered 503 (never
// 500, never later than the store's deadline); deliveries resume within
// 15 s of the kill.
func TestPrimaryLost(t *testing.T) {
	f := hapg.Start(t, hapg.Sync)
	base, key := startRelay(t, f.URL())
	mint := func(dev string) string {
		tok, err := token.Mint(key, token.Claims{Household: "home", Device: dev, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	newClient := func(dev string) *client.Client {
		c, err := client.New(base, mint(dev), client.WithHTTPClient(hc))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	const devices, rate = 20, 20
	recipients := make([]*client.Client, devices)
	for i := range recipients {
		recipients[i] = newClient(fmt.Sprint("d", i))
		if _, err := recipients[i].Register(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sender := newClient("sender")

	var (
		mu       sync.Mutex
		sends    []*sent
		received = make([][]got, devices)
		pollErrs []string
	)
	// Recipients: hold a poll without a cursor, acknowledge what came
	// (POST /v1/ack), again; a 503 is waited out as its Retry-After asks.
	polls, stopPolls := context.WithCancel(ctx)
	var pollers sync.WaitGroup
	for d, c := range recipients {
		pollers.Go(func() {
			for polls.Err() == nil {
				resp, err := c.Poll(polls, client.PollQuery{OmitCursor: true, Wait: 2})
				now := time.Now()
				if err == nil && len(resp.Envelopes) > 0 {
					mu.Lock()
					for _, e := range resp.Envelopes {
						received[d] = append(received[d], got{id: e.ID, seq: e.Seq, at: now})
					}
					mu.Unlock()
					err = c.Ack(polls, resp.Cursor)
				}
				if err == nil || polls.Err() != nil {
					continue
				}
				var se *client.Error
				if errors.As(err, &se) && se.Status == http.StatusServiceUnavailable {
					sleep(polls, max(se.RetryAfter, 100*time.Millisecond))
					continue
				}
				mu.Lock()
				pollErrs = append(pollErrs, fmt.Sprintf("d%d: %v", d, err))
				mu.Unlock()
				sleep(polls, 200*time.Millisecond)
			}
		})
	}
	defer func() {
		stopPolls()
		pollers.Wait()
	}()

	// Sends: rate a second, each to one device in turn, each tried with
	// its id until 202, as a careful client does.
	var senders sync.WaitGroup
	send := func(s *sent) {
		for ctx.Err() == nil {
			a := attempt{at: time.Now()}
			resp, err := sender.SendOnce(ctx, s.id, []string{s.to}, []byte(s.id))
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
			mu.Lock()
			s.attempts = append(s.attempts, a)
			if err == nil {
				s.accepted = a.answered
				for _, d := range resp.Deliveries {
					if d.Device == s.to {
						s.seq = d.Seq
					}
				}
			}
			mu.Unlock()
			if err == nil || a.status != http.StatusServiceUnavailable {
				return
			}
			sleep(ctx, max(se.RetryAfter, 100*time.Millisecond))
		}
	}
	sendFor := func(d time.Duration) {
		tick := time.NewTicker(time.Second / rate)
		defer tick.Stop()
		end := time.Now().Add(d)
		for time.Now().Before(end) && ctx.Err() == nil {
			<-tick.C
			mu.Lock()
			s := &sent{id: fmt.Sprint("m", len(sends)), to: fmt.Sprint("d", len(sends)%devices)}
			sends = append(sends, s)
			mu.Unlock()
			senders.Go(func() { send(s) })
		}
	}

	sendFor(4 * time.Second)
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
	sendFor(20 * time.Second)
	if err := <-promoted; err != nil {
		t.Fatal(err)
	}
	senders.Wait()

	// Drain: every accepted send arrives.
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := 0
		for _, r := range received {
			n += len(r)
		}
		want := 0
		for _, s := range sends {
			if s.seq > 0 {
				want++
			}
		}
		mu.Unlock()
		if n >= want || time.Now().After(deadline) {
			break
		}
		sleep(ctx, 50*time.Millisecond) // bounded poll of the recipients' tallies
	}
	stopPolls()
	pollers.Wait()

	mu.Lock()
	defer mu.Unlock()
	check(t, sends, received, killed)
	for _, e := range pollErrs {
		t.Errorf("poll or ack: %s", e)
	}
}

// check holds the run to the test's claims.
func check(t *testing.T, sends []*sent, received [][]got, killed time.Time) {
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
				t.Errorf("send %s at %s: %v, want 202 or 503", s.id, a.at.Sub(killed).Round(time.Millisecond), a.err)
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
		t.Errorf("no send was refused: the kill did not land mid-run")
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
			// Resumed: a send first tried after the kill arrives.
			if s.attempts[0].at.After(killed) && (resumed < 0 || g.at.Sub(killed) < resumed) {
				resumed = g.at.Sub(killed)
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
	t.Logf("%d sends, %d accepted, %d answers 503 (in %v at the median, %v at most), %d other failures, %d slow; deliveries resumed %v after the kill",
		len(sends), accepted, refused, pct(took503, 50), pct(took503, 100), bad, slow, resumed.Round(time.Millisecond))
	if resumed < 0 || resumed > 15*time.Second {
		t.Errorf("deliveries resumed %v after the kill, want within 15s", resumed.Round(time.Millisecond))
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
