package failover

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/hapg"
	"github.com/flamenet/relay/internal/hapg/hapgtest"
	"github.com/flamenet/relay/token"
)

// TestStandbySilent: the primary of a synchronous formation goes on
// running while its standby hears nothing from it (its WAL sender
// stopped: what a relay sees of a primary cut off from its standby and
// the monitor, with the connection left open). A send's commit then
// waits for the standby until the store's deadline, and Postgres keeps
// it, answered as committed, once the wait is cancelled. The relay must
// answer 503 to it, and to every retry of the same id, for as long as
// the standby has not got it: a 202 would promise a send that the standby,
// promoted, would not hold. Once replication resumes the retry is
// answered 202 with the first attempt's seq, and the envelope is
// delivered. A removal in the cut is refused with 503 in the same way,
// and polls read nothing of what the standby lacks: a relay started in
// the cut answers them 503.
func TestStandbySilent(t *testing.T) {
	f := hapgtest.Start(t, hapg.Sync)
	base, key := startRelay(t, f.URL())
	ctx := t.Context()
	hc := &http.Client{Timeout: storeTimeout + answerSlack + 10*time.Second}
	type answer struct {
		status int
		took   time.Duration
		body   []byte
	}
	var doAt func(base, method, path, tok string, body any) answer
	do := func(method, path, tok string, body any) answer {
		t.Helper()
		return doAt(base, method, path, tok, body)
	}
	doAt = func(base, method, path, tok string, body any) answer {
		t.Helper()
		req, err := apiRequest(ctx, base, method, path, tok, body)
		if err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{resp.StatusCode, time.Since(at), b}
	}
	sender := mintToken(t, key, "s", token.ScopeAdmin)
	recipient, doomed := mintToken(t, key, "r", token.ScopeDevice), mintToken(t, key, "x", token.ScopeDevice)
	for _, tok := range []string{sender, recipient, doomed} {
		if a := do("POST", "/v1/register", tok, nil); a.status != http.StatusOK {
			t.Fatalf("register: %d %s", a.status, a.body)
		}
	}
	send := func(id string) answer {
		return do("POST", "/v1/send", sender, map[string]any{"id": id, "to": []string{"r"}, "payload": []byte(id)})
	}
	if a := send("before"); a.status != http.StatusAccepted {
		t.Fatalf("send before the cut: %d %s", a.status, a.body)
	}

	resume, err := f.CutReplication(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = resume()
		}
	}()
	// A removal is refused alike: answered 204, it could come back. It
	// comes first, before the relay's check has found the standby silent
	// (which then refuses the reads a request begins with), so that its
	// own commit is what waits out the deadline.
	if a := do("DELETE", "/v1/devices/x", sender, nil); a.status != http.StatusServiceUnavailable {
		t.Errorf("removal the standby does not have: %d %s, want 503", a.status, a.body)
	}
	// The first attempt of a send, and two retries of it: each waits out
	// the store's deadline and is refused.
	for try := range 3 {
		a := send("cut")
		if a.status != http.StatusServiceUnavailable {
			t.Fatalf("attempt %d of a send the standby does not have: %d %s, want 503", try+1, a.status, a.body)
		}
		if a.took > storeTimeout+answerSlack {
			t.Errorf("attempt %d answered after %v, past the store's deadline", try+1, a.took.Round(time.Millisecond))
		}
	}
	// The first attempt is on the primary now, visible there, and the
	// standby lacks it: no poll may hand it out. A relay started now has
	// nothing in memory, so its poll reads the store.
	base2, _ := startRelayWithKey(t, f.URL(), key)
	for _, b := range []string{base, base2} {
		a := doAt(b, "GET", "/v1/poll?cursor=0&wait=0", recipient, nil)
		if bytes.Contains(a.body, []byte(`"cut"`)) {
			t.Errorf("a poll handed out a send the standby does not have: %d %s", a.status, a.body)
		}
		if b == base2 && a.status != http.StatusServiceUnavailable {
			t.Errorf("poll on a relay started meanwhile: %d %s, want 503", a.status, a.body)
		}
	}

	if err := resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	var seq int64
	// The relay refuses (503) until its next check, once a second, has
	// the standby's word again; a client retries after a pause, as
	// Retry-After asks.
	for try := 0; seq == 0; try++ {
		if try > 0 {
			sleep(ctx, time.Second)
		}
		a := send("cut")
		switch {
		case a.status == http.StatusAccepted:
			var r struct {
				Deliveries []struct{ Seq int64 } `json:"deliveries"`
			}
			if err := json.Unmarshal(a.body, &r); err != nil || len(r.Deliveries) != 1 {
				t.Fatalf("202 %s: %v", a.body, err)
			}
			seq = r.Deliveries[0].Seq
		case a.status != http.StatusServiceUnavailable || try == 15:
			t.Fatalf("retry after replication resumed: %d %s", a.status, a.body)
		}
	}
	// The new relay serves polls again once its next check has a
	// standby's word: within a few of its one-second checks.
	var a answer
	for try := 0; ; try++ {
		if a = doAt(base2, "GET", "/v1/poll?cursor=0&wait=0", recipient, nil); a.status != http.StatusServiceUnavailable || try == 10 {
			break
		}
		sleep(ctx, time.Second)
	}
	var poll pollAnswer
	if err := json.Unmarshal(a.body, &poll); a.status != http.StatusOK || err != nil {
		t.Fatalf("poll: %d %s", a.status, a.body)
	}
	var got []string
	for _, e := range poll.Envelopes {
		got = append(got, fmt.Sprintf("%s@%d", e.ID, e.Seq))
	}
	if want := []string{"before@1", fmt.Sprintf("cut@%d", seq)}; fmt.Sprint(got) != fmt.Sprint(want) || seq != 2 {
		t.Errorf("delivered %v, want %v (seq 2: the first attempt's)", got, want)
	}
}
