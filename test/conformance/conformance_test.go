package conformance

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/servicetest"
)

// TestContract: the flags and output of the contract, and the exit codes
// of mistakes and refusals.
func TestContract(t *testing.T) {
	forEach(t, func(t *testing.T, im impl) {
		r := startRelay(t)
		r.register("phone")
		cursor := filepath.Join(t.TempDir(), "cursor")
		l := im.listen(t, r, "phone", cursor)

		sent := map[string]string{"arg": "from an argument", "file": "from a file\x00\xff", "stdin": "from stdin\n"}
		im.mustSend(t, r, "laptop", "phone", "arg", sent["arg"])
		file := filepath.Join(t.TempDir(), "payload")
		os.WriteFile(file, []byte(sent["file"]), 0o600)
		im.send(t, r, "laptop", "-to", "phone", "-id", "file", "-file", file).answer(t, "file")
		res := im.stdinSend(t, r, sent["stdin"], "-to", "phone", "-id", "stdin", "-")
		res.answer(t, "stdin")
		if im.msgpack {
			sent["msgpack"] = "through MessagePack"
			im.mustSend(t, r, "laptop", "phone", "msgpack", sent["msgpack"], "-codec", "msgpack")
		}
		// A fresh id each time when none is given.
		a := im.send(t, r, "laptop", "-to", "phone", "one")
		b := im.send(t, r, "laptop", "-to", "phone", "two")
		var ida, idb string
		for _, x := range []struct {
			res sendResult
			id  *string
		}{{a, &ida}, {b, &idb}} {
			if x.res.code != 0 {
				t.Fatalf("send without -id: exit %d: %s", x.res.code, x.res.stderr)
			}
			_, rest, _ := strings.Cut(x.res.stdout, `"id":"`)
			*x.id, _, _ = strings.Cut(rest, `"`)
		}
		if ida == "" || ida == idb {
			t.Fatalf("ids without -id: %q and %q", ida, idb)
		}
		if raw, err := base64.RawURLEncoding.DecodeString(ida); err != nil || len(raw) != 16 {
			t.Fatalf("default id %q is not 16 bytes in base64url", ida)
		}
		sent[ida], sent[idb] = "one", "two"

		l.waitPrinted(len(sent), 20*time.Second)
		l.stop()
		lines := l.printed()
		exactlyOnce(t, lines, sent, "laptop")
		if got := readCursor(cursor); got != lines[len(lines)-1].Seq {
			t.Fatalf("cursor file holds %d after the last line, seq %d", got, lines[len(lines)-1].Seq)
		}

		// -count: exits 0 once the envelopes are printed and saved.
		im.mustSend(t, r, "laptop", "phone", "counted", "x")
		l = im.listen(t, r, "phone", cursor, "-count", "1")
		l.wait(0)
		if p := l.printed(); len(p) != 1 || p[0].ID != "counted" || readCursor(cursor) != p[0].Seq {
			t.Fatalf("-count 1 printed %+v, cursor %d", p, readCursor(cursor))
		}

		// Refusals for good: exit 1, at once, nothing on stdout.
		for _, args := range [][]string{
			{"-to", "nobody", "x"},              // 404 unknown_device
			{"-to", "phone", "-id", "arg", "y"}, // 409 id_conflict
		} {
			begin := time.Now()
			res := im.send(t, r, "laptop", args...)
			if res.code != 1 || res.stdout != "" || res.stderr == "" {
				t.Fatalf("send %q: exit %d, stdout %q, stderr %q; want exit 1 and a message", args, res.code, res.stdout, res.stderr)
			}
			if d := time.Since(begin); d > 5*time.Second {
				t.Fatalf("send %q took %v: retried a refusal", args, d)
			}
		}
		if res := im.sendTo(t, r.url(), "not-a-token", "-to", "phone", "x"); res.code != 1 {
			t.Fatalf("send with a bad token: exit %d", res.code)
		}
		l = im.listenTok(t, r.url(), "not-a-token")
		l.wait(1)
		// No token at all: exit 2.
		if res := im.sendTo(t, r.url(), "", "-to", "phone", "x"); res.code != 2 {
			t.Fatalf("send without a token: exit %d, want 2", res.code)
		}
	})
}

// TestRelayRestart (a): the relay is stopped with SIGTERM while the
// listener holds a poll and sends are flowing, and started again on the
// same data and port; the listener and the senders carry on.
func TestRelayRestart(t *testing.T) {
	forEach(t, func(t *testing.T, im impl) {
		r := startRelay(t)
		r.register("phone")
		l := im.listen(t, r, "phone", filepath.Join(t.TempDir(), "cursor"))
		waitFor(t, 10*time.Second, "the listener's held poll", func() bool { return r.metric("fn_held_polls") == 1 })

		const n = 30
		sent := map[string]string{}
		for i := range n {
			sent[fmt.Sprintf("restart-%d", i)] = fmt.Sprintf("payload %d", i)
		}
		var wg sync.WaitGroup
		var finished atomic.Int32
		results := make([]sendResult, n)
		wg.Go(func() {
			for i := range n {
				results[i] = im.send(t, r, "laptop", "-to", "phone", "-id", fmt.Sprintf("restart-%d", i), fmt.Sprintf("payload %d", i))
				finished.Add(1)
			}
		})
		l.waitPrinted(n/3, 30*time.Second)
		waitFor(t, 10*time.Second, "the listener's held poll", func() bool { return r.metric("fn_held_polls") == 1 })
		r.stop()
		if finished.Load() == n {
			t.Fatal("every send finished before the relay stopped: nothing was in flight")
		}
		r.start()
		wg.Wait()
		for i, res := range results {
			res.answer(t, fmt.Sprintf("restart-%d", i))
		}
		l.waitPrinted(n, 60*time.Second)
		l.stop()
		exactlyOnce(t, l.printed(), sent, "laptop")
	})
}

// Test429Storm (b): many sends at once to a relay that admits two a
// second; every one is refused at first and retried until accepted.
func Test429Storm(t *testing.T) {
	forEach(t, func(t *testing.T, im impl) {
		r := startRelay(t, "FN_SEND_RATE=3", "FN_SEND_BURST=1")
		r.register("phone")
		l := im.listen(t, r, "phone", filepath.Join(t.TempDir(), "cursor"))

		const n = 16
		sent := map[string]string{}
		results := make([]sendResult, n)
		var wg sync.WaitGroup
		for i := range n {
			id := fmt.Sprintf("storm-%d", i)
			payload := "storm " + strconv.Itoa(i)
			sent[id] = payload
			wg.Go(func() {
				results[i] = im.send(t, r, "laptop", "-to", "phone", "-id", id, "-timeout", "4m", payload)
			})
		}
		wg.Wait()
		for i, res := range results {
			res.answer(t, fmt.Sprintf("storm-%d", i))
		}
		if refused := r.metric(`fn_sends_total{code="429"}`); refused == 0 {
			t.Fatal("no send was refused with 429: the storm tested nothing")
		}
		l.waitPrinted(n, 30*time.Second)
		l.stop()
		exactlyOnce(t, l.printed(), sent, "laptop")
	})
}

// TestCursorAhead (c): the listener is stopped, envelopes arrive meanwhile,
// and its cursor file is rewritten far above the device's head (as when the
// relay's data was restored from an older backup). Started again, it
// recovers without losing those envelopes and without repeating any.
func TestCursorAhead(t *testing.T) {
	forEach(t, func(t *testing.T, im impl) {
		r := startRelay(t)
		r.register("phone")
		cursor := filepath.Join(t.TempDir(), "cursor")
		l := im.listen(t, r, "phone", cursor)
		sent := map[string]string{}
		send := func(id string) {
			sent[id] = "payload of " + id
			im.mustSend(t, r, "laptop", "phone", id, sent[id])
		}
		for i := range 5 {
			send(fmt.Sprintf("before-%d", i))
		}
		l.waitPrinted(5, 20*time.Second)
		l.stop()
		// The relay took the listener's cursor: a stream acknowledges
		// lazily, and a listener that stops acknowledges what it printed.
		if got := r.register("phone"); got != 5 {
			t.Fatalf("the relay's cursor is %d after the listener stopped, want 5", got)
		}
		first := l.printed()

		send("while-stopped-1")
		send("while-stopped-2")
		if err := os.WriteFile(cursor, []byte("1000000\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		l = im.listen(t, r, "phone", cursor)
		l.waitPrinted(2, 20*time.Second)
		send("after-1")
		send("after-2")
		l.waitPrinted(4, 20*time.Second)
		l.stop()
		exactlyOnce(t, append(first, l.printed()...), sent, "laptop")
		if got := readCursor(cursor); got != 9 {
			t.Fatalf("cursor file holds %d, want 9", got)
		}
	})
}

// TestLostAnswer (d): the send's request reaches the relay, which stores
// it, and the answer is lost on the way back (the connection is cut); the
// command retries with the same id and gets the first answer, so exactly
// one envelope is delivered.
func TestLostAnswer(t *testing.T) {
	forEach(t, func(t *testing.T, im impl) {
		r := startRelay(t)
		r.register("phone")
		l := im.listen(t, r, "phone", filepath.Join(t.TempDir(), "cursor"))
		proxy := servicetest.NewProxy(t, r.addr)
		proxy.LoseNextAnswer()
		res := im.sendTo(t, "http://"+proxy.Addr, r.token("laptop"), "-to", "phone", "-id", "lost-answer", "exactly once")
		a := res.answer(t, "lost-answer")
		if proxy.AnswersLost() != 1 {
			t.Fatalf("the proxy lost %d answers, want 1", proxy.AnswersLost())
		}
		if a.Deliveries[0].Seq != 1 {
			t.Fatalf("answer %+v, want seq 1", a)
		}
		// A second envelope after it: a repeat of the first would come
		// before this one.
		im.mustSend(t, r, "laptop", "phone", "after", "after")
		l.waitPrinted(2, 20*time.Second)
		l.stop()
		exactlyOnce(t, l.printed(), map[string]string{"lost-answer": "exactly once", "after": "after"}, "laptop")
	})
}

// TestListenerKilled (e): the listener is killed with SIGKILL once its
// cursor file holds seq k, before envelope k+1 is sent, and started again
// with the same file: across both runs every envelope is printed once.
func TestListenerKilled(t *testing.T) {
	forEach(t, func(t *testing.T, im impl) {
		r := startRelay(t)
		r.register("phone")
		cursor := filepath.Join(t.TempDir(), "cursor")
		l := im.listen(t, r, "phone", cursor)
		sent := map[string]string{}
		send := func(i int) {
			id := fmt.Sprintf("kill-%d", i)
			sent[id] = "payload " + id
			im.mustSend(t, r, "laptop", "phone", id, sent[id])
		}
		const k = 4
		for i := 1; i <= k; i++ {
			send(i)
		}
		waitFor(t, 20*time.Second, fmt.Sprintf("cursor file at %d", k), func() bool { return readCursor(cursor) == k })
		l.kill()
		first := l.printed()
		for i := k + 1; i <= 2*k; i++ {
			send(i)
		}
		l = im.listen(t, r, "phone", cursor)
		l.waitPrinted(k, 20*time.Second)
		l.stop()
		exactlyOnce(t, append(first, l.printed()...), sent, "laptop")
	})
}
