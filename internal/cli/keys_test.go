package cli

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/webpush"
	"github.com/flamenet/relay/token"
)

// TestKeygenOut: -out writes the private key 0600 and refuses an existing
// file unless -force, which replaces it whole, 0600 even over a file that
// was readable by others.
func TestKeygenOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "issuer.key")
	if err := run(context.Background(), []string{"keygen", "-out", path}, env(nil), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	first := readKeyFile(t, path)
	err := run(context.Background(), []string{"keygen", "-out", path}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-force") {
		t.Fatalf("second keygen -out: %v, want a refusal naming -force", err)
	}
	if readKeyFile(t, path) != first {
		t.Fatal("a refused keygen changed the key file")
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"keygen", "-out", path, "-force"}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	second := readKeyFile(t, path)
	if second == first {
		t.Fatal("keygen -force left the old key")
	}
	// The public key printed is the new private key's.
	priv, err := parseSeed(second)
	if err != nil {
		t.Fatal(err)
	}
	if pub := base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)); !strings.Contains(out.String(), "FN_ISSUER_KEYS="+pub) {
		t.Fatalf("keygen printed %q, not the public key %s", out.String(), pub)
	}
	if strings.Contains(out.String(), second) {
		t.Fatal("keygen -out printed the private key")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("keygen -force left %d files in the directory, want 1", len(entries))
	}
}

func readKeyFile(t *testing.T, path string) string {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("%s has mode %v, want 0600", path, info.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestTokenPrivateKey: the private key comes from a file or the
// environment, never from the command line (there is no -key: a usage
// mistake whose message does not repeat the key); -issuer-key-file wins
// over FN_ISSUER_PRIVATE_KEY.
func TestTokenPrivateKey(t *testing.T) {
	fileKey, envKey := newSeed(t), newSeed(t)
	path := filepath.Join(t.TempDir(), "issuer.key")
	if err := os.WriteFile(path, []byte(fileKey.seed+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"token", "-key", envKey.seed, "-device", "phone"}, env(nil), &stdout, &stderr)
	if exit := (*exitError)(nil); !errors.As(err, &exit) || exit.code != 2 || strings.Contains(err.Error()+stdout.String()+stderr.String(), envKey.seed) {
		t.Fatalf("token -key: %v, %q %q; want exit 2 without the key", err, stdout.String(), stderr.String())
	}
	mint := func(args []string, vars map[string]string) string {
		t.Helper()
		var out bytes.Buffer
		if err := run(context.Background(), append([]string{"token", "-device", "phone"}, args...), env(vars), &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out.String())
	}
	verifies := func(tok string, k seedKey) bool {
		_, err := token.Verify(tok, []ed25519.PublicKey{k.pub}, time.Now())
		return err == nil
	}
	if tok := mint(nil, map[string]string{"FN_ISSUER_PRIVATE_KEY": envKey.seed, "FN_ISSUER_KEY_FILE": path}); !verifies(tok, envKey) {
		t.Fatal("FN_ISSUER_PRIVATE_KEY was not used over FN_ISSUER_KEY_FILE")
	}
	if tok := mint([]string{"-issuer-key-file", path}, map[string]string{"FN_ISSUER_PRIVATE_KEY": envKey.seed}); !verifies(tok, fileKey) {
		t.Fatal("-issuer-key-file did not win over FN_ISSUER_PRIVATE_KEY")
	}
	if tok := mint(nil, map[string]string{"FN_ISSUER_KEY_FILE": path}); !verifies(tok, fileKey) {
		t.Fatal("FN_ISSUER_KEY_FILE was not used")
	}
}

type seedKey struct {
	seed string
	priv ed25519.PrivateKey
	pub  ed25519.PublicKey
}

func newSeed(t *testing.T) seedKey {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return seedKey{base64.StdEncoding.EncodeToString(priv.Seed()), priv, pub}
}

func (k seedKey) public() string { return base64.StdEncoding.EncodeToString(k.pub) }

func (k seedKey) mint(t *testing.T, c token.Claims) string {
	t.Helper()
	tok, err := token.Mint(k.priv, c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestTokenCheck: relay token check prints the claims and the relay's
// verdict, and exits 0 only for a token the relay accepts.
func TestTokenCheck(t *testing.T) {
	trusted, other := newSeed(t), newSeed(t)
	now := time.Now()
	ok := token.Claims{Household: "home", Device: "phone", IssuedAt: now, Expires: now.Add(time.Hour)}
	with := func(f func(*token.Claims)) token.Claims { c := ok; f(&c); return c }
	hs256 := b64url(`{"alg":"HS256","typ":"JWT"}`) + "." + b64url(`{"hh":"home","sub":"phone","exp":9999999999}`) + "." + b64url("x")
	tests := []struct {
		name  string
		tok   string
		valid bool
		want  []string
	}{
		{"valid", trusted.mint(t, ok), true, []string{"hh       home", "sub      phone", "scope    device (none given)", "iat      ", "exp      ", "signed   by key 2 of 2", "\n" + offlineVerdict}},
		{"admin", trusted.mint(t, with(func(c *token.Claims) { c.Scope = token.ScopeAdmin })), true, []string{"scope    admin", "\n" + offlineVerdict}},
		{"no iat", trusted.mint(t, with(func(c *token.Claims) { c.IssuedAt = time.Time{} })), true, []string{"note     no iat", "\n" + offlineVerdict}},
		{"unknown key", other.mint(t, ok), false, []string{"hh       home", "refused: bad signature", "401"}},
		{"expired", trusted.mint(t, with(func(c *token.Claims) { c.Expires = now.Add(-2 * time.Minute) })), false, []string{"refused: expired: exp is ", "ago", "401"}},
		{"not yet valid", trusted.mint(t, with(func(c *token.Claims) { c.NotBefore = now.Add(time.Hour) })), false, []string{"nbf      ", "refused: not yet valid", "401"}},
		{"iat in the future", trusted.mint(t, with(func(c *token.Claims) { c.IssuedAt = now.Add(time.Hour) })), false, []string{"refused: iat in the future", "401"}},
		{"bad names", trusted.mint(t, with(func(c *token.Claims) { c.Device = "my phone" })), false, []string{"sub      my phone", "refused: bad names", "400"}},
		{"malformed", "not.a-token", false, []string{"refused: malformed", "401"}},
		{"algorithm", hs256, false, []string{"alg      HS256", "refused: algorithm is not EdDSA", "401"}},
	}
	vars := map[string]string{"FN_ISSUER_KEYS": other.public() + "x," + trusted.public()}
	if err := run(context.Background(), []string{"token", "check", "x.y.z"}, env(vars), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "FN_ISSUER_KEYS") {
		t.Fatalf("a bad FN_ISSUER_KEYS: %v, want an error naming it", err)
	}
	// Two keys, as during a rotation; the second signs.
	vars["FN_ISSUER_KEYS"] = newSeed(t).public() + "," + trusted.public()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), []string{"token", "check", tt.tok}, env(vars), &out, io.Discard)
			if tt.valid && err != nil {
				t.Fatalf("refused: %v\n%s", err, out.String())
			}
			if !tt.valid && !errors.Is(err, errRefused) {
				t.Fatalf("err %v, want errRefused (exit 1)\n%s", err, out.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			if !tt.valid && strings.Contains(out.String(), "\nvalid") {
				t.Errorf("a refused token printed valid:\n%s", out.String())
			}
		})
	}
	// The -issuer-keys flag wins over FN_ISSUER_KEYS.
	err := run(context.Background(), []string{"token", "check", "-issuer-keys", other.public(), trusted.mint(t, ok)}, env(vars), io.Discard, io.Discard)
	if !errors.Is(err, errRefused) {
		t.Fatalf("-issuer-keys did not replace FN_ISSUER_KEYS: %v", err)
	}
}

func b64url(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// TestTokenCheckBinary runs the built binary: the token from standard input
// and from -token-file, the keys from the relay's default key file
// (data/issuer.key under the working directory, as serve would use), and
// the exit statuses.
func TestTokenCheckBinary(t *testing.T) {
	dir := t.TempDir()
	key := newSeed(t)
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data", "issuer.key"), []byte(key.seed+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	good := key.mint(t, token.Claims{Household: "home", Device: "phone", IssuedAt: now, Expires: now.Add(time.Hour)})
	expired := key.mint(t, token.Claims{Household: "home", Device: "phone", IssuedAt: now.Add(-2 * time.Hour), Expires: now.Add(-time.Hour)})
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(expired+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(stdin string, args ...string) (int, string) {
		t.Helper()
		cmd := exec.Command(relayBin, append([]string{"token", "check"}, args...)...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), string(out)
	}
	if code, out := check(good+"\n", "-"); code != 0 || !strings.Contains(out, "trusted  the key in data/issuer.key, public "+key.public()) || !strings.HasSuffix(out, "\n"+offlineVerdict) {
		t.Fatalf("stdin, good token: exit %d\n%s", code, out)
	}
	if code, out := check("", "-token-file", tokFile); code != 1 || !strings.Contains(out, "refused: expired") {
		t.Fatalf("-token-file, expired token: exit %d\n%s", code, out)
	}
	if code, _ := check(""); code != 1 {
		t.Fatalf("no token given: exit %d, want 1", code)
	}
	// No key configured and no key file: refused to check, and no key is
	// created (a new key would verify nothing).
	if err := os.Remove(filepath.Join(dir, "data", "issuer.key")); err != nil {
		t.Fatal(err)
	}
	if code, _ := check("", good); code != 1 {
		t.Fatalf("no key: exit %d, want 1", code)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "issuer.key")); err == nil {
		t.Fatal("token check created an issuer key")
	}
}

// TestSubcommandHelp: -h prints the command's usage on stdout and exits 0.
func TestSubcommandHelp(t *testing.T) {
	for _, args := range [][]string{{"keygen", "-h"}, {"token", "-h"}, {"token", "check", "-h"}} {
		cmd := exec.Command(relayBin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if want := "usage: relay " + args[0]; !strings.Contains(string(out), want) || !strings.Contains(string(out), "  -") {
			t.Fatalf("%v printed %q, want usage with flags", args, out)
		}
	}
}

// TestPubkey: relay pubkey prints the public key of an existing key file,
// from -issuer-key-file or FN_ISSUER_KEY_FILE, and refuses a missing one.
func TestPubkey(t *testing.T) {
	k := newSeed(t)
	path := filepath.Join(t.TempDir(), "issuer.key")
	if err := os.WriteFile(path, []byte(k.seed+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		vars map[string]string
	}{
		{[]string{"pubkey", "-issuer-key-file", path}, nil},
		{[]string{"pubkey"}, map[string]string{"FN_ISSUER_KEY_FILE": path}},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), c.args, env(c.vars), &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "FN_ISSUER_KEYS="+k.public()) {
			t.Errorf("%v: %q lacks the public key %s", c.args, out.String(), k.public())
		}
	}
	if err := run(context.Background(), []string{"pubkey", "-issuer-key-file", path + ".missing"}, env(nil), io.Discard, io.Discard); err == nil {
		t.Error("pubkey of a missing file succeeded")
	}
}

// TestLooseIssuerKeyWarned: a relay whose issuer key file others may read
// says so when it starts, and one whose file is 0600 does not.
func TestLooseIssuerKeyWarned(t *testing.T) {
	for _, mode := range []os.FileMode{0o644, 0o600} {
		dir := t.TempDir()
		keyFile := filepath.Join(dir, "issuer.key")
		if err := run(context.Background(), []string{"keygen", "-out", keyFile}, env(nil), io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(keyFile, mode); err != nil {
			t.Fatal(err)
		}
		p := start(t, map[string]string{
			"FN_LISTEN":          "127.0.0.1:0",
			"FN_DATABASE_URL":    "sqlite:" + filepath.Join(dir, "relay.db"),
			"FN_ISSUER_KEY_FILE": keyFile,
		})
		if _, err := p.stop(t); err != nil {
			t.Fatal(err)
		}
		warned := strings.Contains(p.logs(), "the issuer key file may be read by other users")
		if warned != (mode == 0o644) || (warned && !strings.Contains(p.logs(), "mode=0644")) {
			t.Errorf("key file mode %04o: warned %v; log:\n%s", mode, warned, p.logs())
		}
	}
}

// TestVAPIDKeyCreated: a relay with a VAPID contact creates its VAPID key
// on first start (mode 0600), serves its public half, and keeps it across
// a restart; one without a contact sends no Web Push.
func TestVAPIDKeyCreated(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "vapid.key")
	vars := map[string]string{
		"FN_LISTEN":          "127.0.0.1:0",
		"FN_DATABASE_URL":    "sqlite:" + filepath.Join(dir, "relay.db"),
		"FN_ISSUER_KEY_FILE": filepath.Join(dir, "issuer.key"),
		"FN_VAPID_KEY_FILE":  keyFile,
		"FN_VAPID_SUBJECT":   "mailto:ops@relay.example",
	}
	served := func() (int, string) {
		p := start(t, vars)
		status, body := request(t, "GET", "http://"+p.addr+"/v1/push/vapid", "", "")
		if _, err := p.stop(t); err != nil {
			t.Fatal(err)
		}
		var v struct {
			PublicKey string `json:"public_key"`
		}
		_ = json.Unmarshal(body, &v)
		return status, v.PublicKey
	}
	status, first := served()
	fi, err := os.Stat(keyFile)
	if status != http.StatusOK || first == "" || err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("first start: %d %q; key file %v, %v", status, first, fi, err)
	}
	b, _ := os.ReadFile(keyFile)
	key, err := webpush.ParseVAPIDKey(string(b))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := key.PublicKey.Bytes()
	if first != base64.RawURLEncoding.EncodeToString(pub) {
		t.Errorf("served %s, the file's key is another", first)
	}
	if _, again := served(); again != first {
		t.Errorf("after a restart the key is %s, was %s", again, first)
	}
	delete(vars, "FN_VAPID_SUBJECT")
	if status, _ := served(); status != http.StatusNotFound {
		t.Errorf("without a contact: %d, want 404", status)
	}
}
