package cli

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	qrcode "github.com/skip2/go-qrcode"

	"github.com/flamenet/relay/token"
)

// TestInvite: relay invite, against a real relay that mints its own
// tokens, prints a code that pairs the device with the asked scope, the
// link carrying it, its expiry and the link as a QR code; the relay's
// access log names the command's token relay-cli.
func TestInvite(t *testing.T) {
	p, base, keyFile := startPairing(t, nil)
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"invite", "-household", "flat", "-device", "tablet", "-scope", "admin", "-url", base, "-issuer-key-file", keyFile},
		noEnv, &stdout, &stderr)
	if err != nil {
		t.Fatalf("invite: %v\n%s", err, stderr.String())
	}
	out := stdout.String()
	m := regexp.MustCompile(`(?m)^  code: +(\S+)\n  link: +(\S+)\n  expires: +(.+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no code, link and expiry in:\n%s", out)
	}
	code, link := m[1], m[2]
	if link != base+"/console/#pair="+code+"&household=flat&scope=admin" || !strings.Contains(m[3], "(in 10m0s)") {
		t.Errorf("link %q, expiry %q", link, m[3])
	}
	q, err := qrcode.New(link, qrcode.Medium)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, q.ToSmallString(false)) {
		t.Errorf("no QR code of the link in:\n%s", out)
	}
	if !strings.Contains(out, "relay pair -url "+base+" -code "+code) {
		t.Errorf("no pair command in:\n%s", out)
	}

	status, body := request(t, "POST", base+"/v1/pair", "", `{"code":"`+code+`"}`)
	var c struct{ Household, Device, Scope string }
	if err := json.Unmarshal(body, &c); status != http.StatusOK || err != nil || c != (struct{ Household, Device, Scope string }{"flat", "tablet", "admin"}) {
		t.Fatalf("pairing with the printed code: %d %s", status, body)
	}

	// The name is in use now: refused, unless -replace; a pending
	// invitation can be listed and cancelled.
	invite := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), append([]string{"invite", "-household", "flat", "-url", base, "-issuer-key-file", keyFile}, args...),
			noEnv, &stdout, &stderr)
		return stdout.String(), err
	}
	if _, err := invite("-device", "tablet"); err == nil || !strings.Contains(err.Error(), "409") || !strings.Contains(err.Error(), "-replace") {
		t.Errorf("an invitation for a device in use: %v, want a 409 naming -replace", err)
	}
	out, err = invite("-device", "tablet", "-replace")
	if err != nil || !strings.Contains(out, "Redeeming it removes the device \"tablet\"") {
		t.Errorf("-replace: %v\n%s", err, out)
	}
	replacing := regexp.MustCompile(`(?m)^  code: +(\S+)$`).FindStringSubmatch(out)
	if out, err := invite("-list"); err != nil || !strings.Contains(out, "replacing the device of that name, made by relay-cli") {
		t.Errorf("-list: %v\n%s", err, out)
	}
	if out, err := invite("-cancel", "-device", "tablet"); err != nil || !strings.Contains(out, "Cancelled") {
		t.Errorf("-cancel: %v\n%s", err, out)
	}
	if replacing != nil {
		if status, body := request(t, "POST", base+"/v1/pair", "", `{"code":"`+replacing[1]+`"}`); status != http.StatusUnauthorized {
			t.Errorf("pairing with a cancelled code: %d %s", status, body)
		}
	}
	if _, err := invite("-cancel", "-device", "tablet"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("-cancel of nothing pending: %v, want a 404", err)
	}
	// -replace for a name that is no device: nothing to remove, and the
	// command says nothing of removing one. Seen red when it did.
	if out, err := invite("-device", "kettle", "-replace"); err != nil || strings.Contains(out, "Redeeming it removes") || !strings.Contains(out, "  code: ") {
		t.Errorf("-replace of no device: %v\n%s", err, out)
	}

	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`method=POST route=/v1/invitations status=201 .*household=flat device=relay-cli`).MatchString(p.logs()) {
		t.Errorf("no access line of the invitation by relay-cli:\n%s", p.logs())
	}
}

// TestInviteRefusals: a key the relay does not trust, a relay that does
// not pair (FN_ISSUER_KEYS set) and a bad command line each end the
// command with the reason.
func TestInviteRefusals(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "issuer.key")
	other := filepath.Join(dir, "other.key")
	for _, f := range []string{keyFile, other} {
		if err := run(context.Background(), []string{"keygen", "-out", f}, noEnv, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
			t.Fatal(err)
		}
	}
	pairing := start(t, map[string]string{"FN_LISTEN": "127.0.0.1:0", "FN_DATABASE_URL": "sqlite:" + filepath.Join(dir, "a.db"), "FN_ISSUER_KEY_FILE": keyFile})
	key, err := readIssuerKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pub := key.Public().(ed25519.PublicKey)
	outside := start(t, map[string]string{"FN_LISTEN": "127.0.0.1:0", "FN_DATABASE_URL": "sqlite:" + filepath.Join(dir, "b.db"),
		"FN_ISSUER_KEYS": base64.StdEncoding.EncodeToString(pub)})
	for _, tt := range []struct {
		args []string
		want string
		code int // exit code; 0: an error without one (exit 1)
	}{
		{[]string{"-url", "http://" + pairing.addr, "-issuer-key-file", other, "-device", "phone"}, "does not trust this issuer key", 0},
		{[]string{"-url", "http://" + outside.addr, "-issuer-key-file", keyFile, "-device", "phone"}, "does not pair devices", 0},
		{[]string{"-url", "http://" + pairing.addr, "-issuer-key-file", keyFile, "-device", "bad name"}, "400", 0},
		{[]string{"-issuer-key-file", keyFile}, "-device is required", 2},
		{[]string{"-issuer-key-file", keyFile, "-device", "phone", "-scope", "root"}, "-scope", 2},
		{[]string{"-issuer-key-file", filepath.Join(dir, "missing.key"), "-device", "phone"}, "issuer key", 0},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), append([]string{"invite"}, tt.args...), noEnv, &stdout, &stderr)
		var exit *exitError
		gotCode := 0
		if errors.As(err, &exit) {
			gotCode = exit.code
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) || gotCode != tt.code {
			t.Errorf("%q: %v (exit %d), want an error with %q, exit %d", tt.args, err, gotCode, tt.want, tt.code)
		}
		if stdout.Len() > 0 {
			t.Errorf("%q printed %q", tt.args, stdout.String())
		}
	}
}

// TestInviteToken: relay invite's token is an admin token of the
// household, sub relay-cli, living 60 seconds.
func TestInviteToken(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Truncate(time.Second)
	tok, err := inviteToken(key, "home", now)
	if err != nil {
		t.Fatal(err)
	}
	c, err := token.Verify(tok, []ed25519.PublicKey{pub}, now)
	if err != nil {
		t.Fatal(err)
	}
	if c.Household != "home" || c.Device != "relay-cli" || c.Scope != token.ScopeAdmin || c.Expires.Sub(c.IssuedAt) != time.Minute || !c.IssuedAt.Equal(now) {
		t.Errorf("claims %+v", c)
	}
}

// TestPairFingerprintReachesTheInviter: the device pairs with its identity
// (relay pair -identity) and prints its key's fingerprint; the inviting
// admin's relay invite -list shows the same digits beside the device, so
// the two can compare them, and a device invited but not yet paired shows
// as pending, without a key.
func TestPairFingerprintReachesTheInviter(t *testing.T) {
	_, base, keyFile := startPairing(t, nil)
	dir := filepath.Dir(keyFile) // its directory, the test's own
	invite := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), append([]string{"invite", "-url", base, "-issuer-key-file", keyFile}, args...), noEnv, &stdout, &stderr); err != nil {
			t.Fatalf("invite %v: %v\n%s", args, err, stderr.String())
		}
		return stdout.String()
	}
	code := regexp.MustCompile(`(?m)^  code: +(\S+)$`).FindStringSubmatch(invite("-device", "phone"))
	invite("-device", "laptop")
	if code == nil {
		t.Fatal("no code printed")
	}
	var out bytes.Buffer
	identity := filepath.Join(dir, "phone.identity")
	if err := run(context.Background(), []string{"pair", "-url", base, "-code", code[1], "-store", filepath.Join(dir, "phone.json"), "-identity", identity}, noEnv, &out, &out); err != nil {
		t.Fatalf("pair: %v\n%s", err, out.String())
	}
	fp := regexp.MustCompile(`(?m)^fingerprint: ((?:\d{5} ){5}\d{5})$`).FindStringSubmatch(out.String())
	if fp == nil {
		t.Fatalf("pair printed no fingerprint:\n%s", out.String())
	}
	listed := invite("-list")
	if !regexp.MustCompile(`(?m)^phone \(device\): paired at \S+, made by relay-cli; fingerprint ` + fp[1] + `$`).MatchString(listed) {
		t.Errorf("invite -list does not show phone with the fingerprint %s:\n%s", fp[1], listed)
	}
	if !regexp.MustCompile(`(?m)^laptop \(device\): pending until \S+, made by relay-cli; no key$`).MatchString(listed) {
		t.Errorf("invite -list does not show laptop pending:\n%s", listed)
	}
}
