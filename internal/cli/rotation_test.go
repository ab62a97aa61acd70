package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/token"
)

// TestKeyRotation follows docs/OPERATIONS.md's rotation on a real relay
// process: trusting the old and new keys it accepts tokens of both;
// restarted with only the new key it refuses the old key's tokens (401)
// and accepts the new ones. A client whose poll was held with an old token
// sees only what any restart does (its poll answered empty at the drain),
// and needs nothing but a new token on its next request: its cursor and
// its envelopes are where they were.
func TestKeyRotation(t *testing.T) {
	oldKey, newKey := newSeed(t), newSeed(t)
	vars := map[string]string{
		"FN_LISTEN":       "127.0.0.1:0",
		"FN_METRICS_ADDR": "127.0.0.1:0",
		"FN_DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "relay.db"),
		"FN_ISSUER_KEYS":  oldKey.public() + "," + newKey.public(),
	}
	mint := func(k seedKey, dev string) string {
		now := time.Now()
		return k.mint(t, token.Claims{Household: "home", Device: dev, IssuedAt: now, Expires: now.Add(time.Hour)})
	}
	phoneOld, phoneNew := mint(oldKey, "phone"), mint(newKey, "phone")
	laptopOld, laptopNew := mint(oldKey, "laptop"), mint(newKey, "laptop")

	// Both keys trusted: the old key's tokens and the new key's work side
	// by side, for the same device.
	p := start(t, vars)
	base := "http://" + p.addr
	if code, b := request(t, "POST", base+"/v1/register", phoneOld, ""); code != 200 {
		t.Fatalf("register with the old key: %d %s", code, b)
	}
	if code, b := request(t, "POST", base+"/v1/send", laptopOld, `{"id":"m1","to":["phone"],"payload":"eA=="}`); code != 202 {
		t.Fatalf("send with the old key: %d %s", code, b)
	}
	if ids, cursor := pollIDs(t, base, phoneNew, 0, 0); len(ids) != 1 || ids[0] != "m1" || cursor != 1 {
		t.Fatalf("poll with the new key: %v cursor %d, want [m1] cursor 1", ids, cursor)
	}

	// A poll held with the old key's token when the relays are restarted
	// without that key.
	held := make(chan heldAnswer, 1)
	go func() {
		req, _ := http.NewRequest("GET", base+"/v1/poll?cursor=1&wait=60", nil)
		req.Header.Set("Authorization", "Bearer "+phoneOld)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			held <- heldAnswer{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		held <- heldAnswer{code: resp.StatusCode, body: b}
	}()
	waitMetric(t, p, "fn_held_polls", 1)
	if _, err := p.stop(t); err != nil {
		t.Fatalf("relay exit: %v", err)
	}
	h := <-held
	if h.err != nil || h.code != 200 || !strings.Contains(string(h.body), `"envelopes":[]`) {
		t.Fatalf("the held poll at the restart: %v %d %s, want the drain's empty 200", h.err, h.code, h.body)
	}

	vars["FN_ISSUER_KEYS"] = newKey.public()
	p = start(t, vars)
	base = "http://" + p.addr
	for _, r := range []struct{ method, path, tok, body string }{
		{"GET", "/v1/poll?cursor=1", phoneOld, ""},
		{"POST", "/v1/send", laptopOld, `{"id":"m2","to":["phone"],"payload":"eA=="}`},
	} {
		code, b := request(t, r.method, base+r.path, r.tok, r.body)
		var e struct{ Error string }
		if code != 401 || json.Unmarshal(b, &e) != nil || e.Error != "unauthorized" {
			t.Fatalf("%s %s with the old key after its removal: %d %s, want 401 unauthorized", r.method, r.path, code, b)
		}
	}
	if code, b := request(t, "POST", base+"/v1/send", laptopNew, `{"id":"m2","to":["phone"],"payload":"eA=="}`); code != 202 {
		t.Fatalf("send with the new key: %d %s", code, b)
	}
	// The client's next poll, same cursor, new token: m1 stays acknowledged
	// and m2 arrives.
	if ids, cursor := pollIDs(t, base, phoneNew, 1, 0); len(ids) != 1 || ids[0] != "m2" || cursor != 2 {
		t.Fatalf("poll with the new key after the rotation: %v cursor %d, want [m2] cursor 2", ids, cursor)
	}
	if _, err := p.stop(t); err != nil {
		t.Fatalf("relay exit: %v", err)
	}

	// token check, with the same setting, agrees with the relay.
	checkVars := env(map[string]string{"FN_ISSUER_KEYS": newKey.public()})
	var out bytes.Buffer
	if err := run(context.Background(), []string{"token", "check", phoneOld}, checkVars, &out, io.Discard); !errors.Is(err, errRefused) || !strings.Contains(out.String(), "bad signature") {
		t.Fatalf("token check of the old key's token: %v\n%s", err, out.String())
	}
	if err := run(context.Background(), []string{"token", "check", phoneNew}, checkVars, io.Discard, io.Discard); err != nil {
		t.Fatalf("token check of the new key's token: %v", err)
	}
}

type heldAnswer struct {
	code int
	body []byte
	err  error
}

// pollIDs polls once and returns the envelope ids and the new cursor.
func pollIDs(t *testing.T, base, tok string, cursor, wait int) ([]string, int) {
	t.Helper()
	code, b := request(t, "GET", fmt.Sprintf("%s/v1/poll?cursor=%d&wait=%d", base, cursor, wait), tok, "")
	if code != 200 {
		t.Fatalf("poll: %d %s", code, b)
	}
	var pr struct {
		Cursor    int `json:"cursor"`
		Envelopes []struct {
			ID string `json:"id"`
		} `json:"envelopes"`
	}
	if err := json.Unmarshal(b, &pr); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range pr.Envelopes {
		ids = append(ids, e.ID)
	}
	return ids, pr.Cursor
}
