package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/seal"
	"github.com/flamenet/relay/token"
)

type cliResult struct {
	stdout, stderr string
	err            error
}

// runCLI runs the program with args; runCLIAsync in a goroutine.
func runCLI(ctx context.Context, args ...string) cliResult {
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, env(nil), &stdout, &stderr)
	return cliResult{stdout.String(), stderr.String(), err}
}

func runCLIAsync(ctx context.Context, args ...string) <-chan cliResult {
	ch := make(chan cliResult, 1)
	go func() { ch <- runCLI(ctx, args...) }()
	return ch
}

// waitDirectoryKey waits until the directory lists the key of the
// identity in file (which the command being waited for creates) for
// device, and returns it.
func waitDirectoryKey(t *testing.T, base, tok, device, file string) []byte {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for ; time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		id, err := seal.LoadIdentity(file)
		if err != nil {
			continue
		}
		code, b := request(t, "GET", base+"/v1/devices", tok, "")
		var dir struct {
			Devices []struct {
				Device      string `json:"device"`
				IdentityKey []byte `json:"identity_key"`
			} `json:"devices"`
		}
		if code != 200 || json.Unmarshal(b, &dir) != nil {
			t.Fatalf("directory: %d %s", code, b)
		}
		for _, d := range dir.Devices {
			if d.Device == device && bytes.Equal(d.IdentityKey, id.Public()) {
				return d.IdentityKey
			}
		}
	}
	t.Fatalf("the directory never listed %s's key from %s", device, file)
	return nil
}

// TestSealedCLI: `relay listen -open` and `relay send -seal` make an
// encrypted round trip through a relay process; each creates its device's
// identity and says its fingerprint; a changed key is refused until
// -trust names the device, and an envelope that does not open is printed
// with its error.
func TestSealedCLI(t *testing.T) {
	key := newSeed(t)
	dir := t.TempDir()
	p := start(t, map[string]string{
		"FN_LISTEN":       "127.0.0.1:0",
		"FN_DATABASE_URL": "sqlite:" + filepath.Join(dir, "relay.db"),
		"FN_ISSUER_KEYS":  key.public(),
	})
	base := "http://" + p.addr
	mint := func(dev string) string {
		now := time.Now()
		return key.mint(t, token.Claims{Household: "home", Device: dev, IssuedAt: now, Expires: now.Add(time.Hour)})
	}
	phone, laptop := mint("phone"), mint("laptop")
	phoneID, laptopID := filepath.Join(dir, "phone.id"), filepath.Join(dir, "laptop.id")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	cursor := filepath.Join(dir, "phone.cursor")
	listening := runCLIAsync(ctx, "listen", "-url", base, "-token", phone, "-cursor-file", cursor, "-wait", "5", "-count", "1", "-open", "-identity", phoneID)
	phoneKey := waitDirectoryKey(t, base, laptop, "phone", phoneID)
	sent := runCLI(ctx, "send", "-url", base, "-token", laptop, "-to", "phone", "-seal", "-identity", laptopID, "hello, sealed")
	if sent.err != nil || !strings.Contains(sent.stdout, `"deliveries":[{"device":"phone","seq":1}]`) {
		t.Fatalf("send -seal: %v\n%s%s", sent.err, sent.stdout, sent.stderr)
	}
	laptopIdentity, err := seal.LoadIdentity(laptopID)
	if err != nil {
		t.Fatal(err)
	}
	if want := "laptop's fingerprint: " + laptopIdentity.Fingerprint(); !strings.Contains(sent.stderr, want) {
		t.Errorf("send -seal's stderr %q lacks %q", sent.stderr, want)
	}
	got := <-listening
	var line struct {
		Seq     int64
		From    string
		Payload []byte
		Error   string
	}
	if got.err != nil || json.Unmarshal([]byte(got.stdout), &line) != nil || string(line.Payload) != "hello, sealed" || line.From != "laptop" || line.Error != "" {
		t.Fatalf("listen -open: %v\n%s%s", got.err, got.stdout, got.stderr)
	}
	if want := "phone's fingerprint: " + seal.Fingerprint(phoneKey); !strings.Contains(got.stderr, want) {
		t.Errorf("listen -open's stderr %q lacks %q", got.stderr, want)
	}
	for _, f := range []string{phoneID, laptopID, phoneID + ".pins", laptopID + ".pins"} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v", f, fi, err)
		}
	}

	// The phone starts over with a new identity: the laptop refuses to
	// seal to it until told to trust it.
	newPhoneID := filepath.Join(dir, "phone2.id")
	listening = runCLIAsync(ctx, "listen", "-url", base, "-token", phone, "-cursor-file", cursor, "-wait", "5", "-count", "2", "-open", "-identity", newPhoneID)
	waitDirectoryKey(t, base, laptop, "phone", newPhoneID)
	refused := runCLI(ctx, "send", "-url", base, "-token", laptop, "-to", "phone", "-seal", "-identity", laptopID, "not to a changed key")
	if !errors.Is(refused.err, seal.ErrKeyChanged) || !strings.Contains(refused.stderr, "-trust phone") {
		t.Fatalf("send -seal to a changed key: %v\n%s", refused.err, refused.stderr)
	}
	// A plain envelope, which does not open, then the sealed one.
	if plain := runCLI(ctx, "send", "-url", base, "-token", laptop, "-to", "phone", "not sealed"); plain.err != nil {
		t.Fatal(plain.err)
	}
	trusted := runCLI(ctx, "send", "-url", base, "-token", laptop, "-to", "phone", "-seal", "-identity", laptopID, "-trust", "phone", "to the new key")
	if trusted.err != nil || !strings.Contains(trusted.stderr, "trusting phone's key") {
		t.Fatalf("send -seal -trust phone: %v\n%s", trusted.err, trusted.stderr)
	}
	got = <-listening
	lines := strings.Split(strings.TrimSpace(got.stdout), "\n")
	if got.err != nil || len(lines) != 2 {
		t.Fatalf("listen -open: %v\n%s%s", got.err, got.stdout, got.stderr)
	}
	var first, second struct {
		Payload []byte
		Error   string
	}
	json.Unmarshal([]byte(lines[0]), &first)
	json.Unmarshal([]byte(lines[1]), &second)
	if first.Error != "malformed" || first.Payload != nil || second.Error != "" || string(second.Payload) != "to the new key" {
		t.Errorf("listen -open printed %q", lines)
	}
}

// TestSealedCLIUsage: -seal and -open need an identity file, and an
// identity file without -seal or -open is a mistake, not a plain send.
func TestSealedCLIUsage(t *testing.T) {
	for _, args := range [][]string{
		{"send", "-token", "t", "-to", "phone", "-seal", "x"},
		{"listen", "-token", "t", "-open"},
		{"send", "-token", "t", "-to", "phone", "-identity", "laptop.id", "x"},
		{"listen", "-token", "t", "-identity", "phone.id"},
		{"listen", "-token", "t", "-trust", "laptop"},
	} {
		// Nothing listens at the URL; a command that went ahead would retry
		// until the deadline.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		full := append([]string{args[0], "-url", "http://127.0.0.1:1"}, args[1:]...)
		err := run(ctx, full, env(nil), io.Discard, io.Discard)
		cancel()
		var exit *exitError
		if !errors.As(err, &exit) || exit.code != 2 || !strings.Contains(err.Error(), "-identity") {
			t.Errorf("%q: %v, want exit 2 naming -identity", args, err)
		}
	}
}
