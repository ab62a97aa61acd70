package failover

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/hapg"
	"github.com/flamenet/relay/internal/hapg/hapgtest"
	"github.com/flamenet/relay/token"
)

// epochDevice is a recipient that keeps its epoch with its cursor and
// resynchronises on 409 cursor_ahead, as PROTOCOL.md says a client does
// (raw HTTP: the wire is what is under test).
type epochDevice struct {
	name, tok string
	cursor    int64
	epoch     string
	resync    bool // the next poll goes without cursor and epoch
	ahead     int  // 409 cursor_ahead answers
	newEpochs []string
	got       []epochGot
}

// epochGot is one envelope as a device received it, with its epoch.
type epochGot struct {
	id, epoch string
	seq       int64
	at        time.Time
}

// pollAnswer is a register's or poll's 200, or an error's body
// (relay/errors.go).
type pollAnswer struct {
	Cursor    int64  `json:"cursor"`
	Epoch     string `json:"epoch"`
	Envelopes []struct {
		Seq int64  `json:"seq"`
		ID  string `json:"id"`
	} `json:"envelopes"`
	// A 409's error code; its epoch is Epoch.
	Error string `json:"error"`
}

// TestAsyncPrimaryLost: with asynchronous replication and the primary's
// WAL sender stopped, the relay answers 202 for sends that only the
// primary holds; the primary's machine is lost and the monitor promotes
// the standby without them. The store's epoch changes (the promoted
// server's timeline differs and the old primary did not commit
// synchronously), every device holding the old epoch is told 409
// cursor_ahead with the new one, resynchronises, and nothing the promoted
// store holds is skipped: every send in its sends table reaches its
// recipient. Within one epoch no envelope comes twice and seqs rise.
func TestAsyncPrimaryLost(t *testing.T) {
	f := hapgtest.Start(t, hapg.Async)
	base, key := startRelay(t, f.URL())
	ctx := t.Context()
	mint := func(dev string) string { return mintToken(t, key, dev, token.ScopeDevice) }
	hc := &http.Client{Timeout: 30 * time.Second}
	do := func(ctx context.Context, method, path, tok string, body any) (int, pollAnswer, error) {
		req, err := apiRequest(ctx, base, method, path, tok, body)
		if err != nil {
			return 0, pollAnswer{}, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, pollAnswer{}, err
		}
		defer resp.Body.Close()
		var a pollAnswer
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &a)
		return resp.StatusCode, a, nil
	}

	devs := make([]*epochDevice, devices)
	for i := range devs {
		d := &epochDevice{name: fmt.Sprint("d", i), tok: mint(fmt.Sprint("d", i))}
		code, a, err := do(ctx, "POST", "/v1/register", d.tok, nil)
		if err != nil || code != http.StatusOK || a.Epoch == "" {
			t.Fatalf("register %s: %d %v (epoch %q)", d.name, code, err, a.Epoch)
		}
		d.cursor, d.epoch = a.Cursor, a.Epoch
		devs[i] = d
	}
	oldEpoch := devs[0].epoch
	byName := map[string]*epochDevice{}
	for _, d := range devs {
		byName[d.name] = d
	}

	var mu sync.Mutex
	var pollErrs []string
	polls, stopPolls := context.WithCancel(ctx)
	var pollers sync.WaitGroup
	for _, d := range devs {
		pollers.Go(func() {
			for polls.Err() == nil {
				path := "/v1/poll?wait=2&cursor=" + strconv.FormatInt(d.cursor, 10) + "&epoch=" + d.epoch
				if d.resync {
					path = "/v1/poll?wait=0"
				}
				code, a, err := do(polls, "GET", path, d.tok, nil)
				now := time.Now()
				switch {
				case polls.Err() != nil:
				case err == nil && code == http.StatusOK:
					mu.Lock()
					for _, e := range a.Envelopes {
						d.got = append(d.got, epochGot{id: e.ID, seq: e.Seq, epoch: a.Epoch, at: now})
					}
					mu.Unlock()
					d.cursor, d.epoch, d.resync = a.Cursor, a.Epoch, false
				case err == nil && code == http.StatusConflict && a.Error == "cursor_ahead":
					mu.Lock()
					d.ahead++
					d.newEpochs = append(d.newEpochs, a.Epoch)
					mu.Unlock()
					d.resync = true
				case err == nil && code == http.StatusServiceUnavailable:
					sleep(polls, 500*time.Millisecond)
				default:
					mu.Lock()
					pollErrs = append(pollErrs, fmt.Sprintf("%s: %d %v", d.name, code, err))
					mu.Unlock()
					sleep(polls, 200*time.Millisecond)
				}
			}
		})
	}
	defer func() {
		stopPolls()
		pollers.Wait()
	}()

	sender, err := client.New(base, mint("sender"), client.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	type send struct {
		id, to            string
		accepted, started time.Time
	}
	var sends []*send
	var senders sync.WaitGroup
	sendFor := func(dur time.Duration) {
		tick := time.NewTicker(time.Second / rate)
		defer tick.Stop()
		for end := time.Now().Add(dur); time.Now().Before(end); {
			<-tick.C
			mu.Lock()
			s := &send{id: fmt.Sprint("m", len(sends)), to: fmt.Sprint("d", len(sends)%devices), started: time.Now()}
			sends = append(sends, s)
			mu.Unlock()
			senders.Go(func() {
				for ctx.Err() == nil {
					_, err := sender.SendOnce(ctx, s.id, []string{s.to}, []byte(s.id))
					if err == nil {
						mu.Lock()
						s.accepted = time.Now()
						mu.Unlock()
						return
					}
					sleep(ctx, 200*time.Millisecond) // 503 while no primary; the same id again
				}
			})
		}
	}

	sendFor(3 * time.Second)
	if _, err := f.CutReplication(ctx); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	sendFor(2 * time.Second)
	old, err := f.KillPrimary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	promoted := make(chan *hapg.Node, 1)
	go func() {
		p, err := f.WaitPrimary(ctx, old)
		if err != nil {
			t.Error(err)
		}
		promoted <- p
	}()
	sendFor(15 * time.Second)
	p := <-promoted
	if p == nil {
		t.FailNow()
	}
	senders.Wait()

	// What the promoted store holds: the sends it knows.
	held := map[string]bool{}
	conn, err := pgx.Connect(ctx, f.NodeURL(p))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, "SELECT send_id FROM sends WHERE sender = 'sender'")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		held[id] = true
	}

	// Every held send reaches its recipient (bounded wait).
	want := func() (missing []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range sends {
			if !held[s.id] {
				continue
			}
			found := false
			for _, g := range byName[s.to].got {
				found = found || g.id == s.id
			}
			if !found {
				missing = append(missing, s.id)
			}
		}
		return missing
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(want()) > 0 && time.Now().Before(deadline) {
		sleep(ctx, 100*time.Millisecond) // bounded poll of the devices' tallies
	}
	stopPolls()
	pollers.Wait()

	for _, id := range want() {
		t.Errorf("send %s is in the promoted store and never reached its recipient: skipped", id)
	}
	mu.Lock()
	defer mu.Unlock()
	lost, lostBeforeCut := 0, 0
	for _, s := range sends {
		if !s.accepted.IsZero() && !held[s.id] {
			lost++
			if s.accepted.Before(cut.Add(-time.Second)) {
				lostBeforeCut++
			}
		}
		if s.accepted.IsZero() {
			t.Errorf("send %s never answered 202", s.id)
		}
	}
	if lost == 0 {
		t.Errorf("no answered send was lost: the cut did not hold back any commit")
	}
	if lostBeforeCut > 0 {
		t.Errorf("%d sends answered over a second before the cut were lost", lostBeforeCut)
	}
	told := 0
	for _, d := range devs {
		if d.ahead > 0 {
			told++
		}
		for _, e := range d.newEpochs {
			if e == oldEpoch || e == "" {
				t.Errorf("%s told cursor_ahead with epoch %q, the old one was %q", d.name, e, oldEpoch)
			}
		}
		if d.epoch == oldEpoch {
			t.Errorf("%s still holds the old epoch %q", d.name, oldEpoch)
		}
		// Within one epoch: no envelope twice, seqs rising.
		seen := map[string]bool{}
		for i, g := range d.got {
			k := g.epoch + "/" + g.id
			if seen[k] {
				t.Errorf("%s got %s twice in epoch %s", d.name, g.id, g.epoch)
			}
			seen[k] = true
			if i > 0 && d.got[i-1].epoch == g.epoch && g.seq <= d.got[i-1].seq {
				t.Errorf("%s: seq %d after %d in epoch %s", d.name, g.seq, d.got[i-1].seq, g.epoch)
			}
		}
	}
	if told == 0 {
		t.Errorf("no device was told cursor_ahead after the epoch changed")
	}
	for _, e := range pollErrs {
		t.Errorf("poll: %s", e)
	}
	t.Logf("%d sends, %d answered and lost with the old primary (cut %v before the kill), %d devices told cursor_ahead",
		len(sends), lost, killed.Sub(cut).Round(time.Millisecond), told)
}
