package cli

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/flamenet/relay/token"
)

// TestListenCountAcks: `relay listen -count 1` acknowledges what it printed
// before it exits, so that the next listen, with no cursor file of its
// own, goes on with the next envelope instead of printing the same one
// again. Seen red when listen left the acknowledgement to a poll it never
// made.
func TestListenCountAcks(t *testing.T) {
	key := newSeed(t)
	p := start(t, map[string]string{
		"FN_LISTEN":       "127.0.0.1:0",
		"FN_DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "relay.db"),
		"FN_ISSUER_KEYS":  key.public(),
	})
	base := "http://" + p.addr
	now := time.Now()
	phone := key.mint(t, token.Claims{Household: "home", Device: "phone", IssuedAt: now, Expires: now.Add(time.Hour)})
	laptop := key.mint(t, token.Claims{Household: "home", Device: "laptop", IssuedAt: now, Expires: now.Add(time.Hour)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if code, body := request(t, "POST", base+"/v1/register", phone, ""); code != 200 {
		t.Fatalf("register: %d %s", code, body)
	}
	for _, text := range []string{"first", "second"} {
		if r := runCLI(ctx, "send", "-url", base, "-token", laptop, "-to", "phone", text); r.err != nil {
			t.Fatalf("send: %v\n%s", r.err, r.stderr)
		}
	}
	for _, want := range []string{"first", "second"} {
		r := runCLI(ctx, "listen", "-url", base, "-token", phone, "-wait", "2", "-count", "1")
		var line struct{ Payload []byte }
		if r.err != nil || json.Unmarshal([]byte(r.stdout), &line) != nil {
			t.Fatalf("listen -count 1: %v\n%s%s", r.err, r.stdout, r.stderr)
		}
		if string(line.Payload) != want {
			t.Fatalf("listen -count 1 printed %q, want %q", line.Payload, want)
		}
	}
}
