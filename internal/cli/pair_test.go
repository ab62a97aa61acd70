package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/internal/pairtest"
)

// TestPairListenSend: relay pair writes a credentials file (0600, with
// the relay's URL); relay send and relay listen take -store instead of a
// token and need no -url; listen renews due credentials into the file
// before it uses them. The commands run on the real clock, so the phone's
// file is made due by writing it an early expiry.
func TestPairListenSend(t *testing.T) { pairModes(t, testPairListenSend) }

func testPairListenSend(t *testing.T, mode pairtest.Mode) {
	cr := pairtest.NewContractMode(t, mode, pairtest.NewClock(), time.Hour)
	dir := t.TempDir()
	phoneFile, laptopFile := filepath.Join(dir, "phone.json"), filepath.Join(dir, "laptop.json")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for dev, file := range map[string]string{"phone": phoneFile, "laptop": laptopFile} {
		var stdout, stderr bytes.Buffer
		if err := run(ctx, []string{"pair", "-url", cr.URL, "-code", cr.Invite(dev), "-store", file}, noEnv, &stdout, &stderr); err != nil {
			t.Fatalf("pair %s: %v\n%s", dev, err, stderr.String())
		}
		if !strings.Contains(stdout.String(), `paired as device "`+dev+`"`) {
			t.Fatalf("pair printed %q", stdout.String())
		}
		if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("credentials file: %v %v", fi, err)
		}
	}
	store := client.FileStore(phoneFile)
	paired, err := store.Load(ctx)
	if err != nil || paired.URL != cr.URL {
		t.Fatalf("the file holds %+v (%v)", paired, err)
	}
	due := paired
	due.AccessExpiresAt = time.Now().Add(time.Minute)
	if err := store.Save(ctx, due); err != nil {
		t.Fatal(err)
	}

	var listenOut, listenErr bytes.Buffer
	listened := make(chan error, 1)
	go func() {
		listened <- run(ctx, []string{"listen", "-store", phoneFile, "-wait", "1", "-count", "1"}, noEnv, &listenOut, &listenErr)
	}()
	// The phone's first poll registers it: send until the relay knows it.
	for {
		var stdout, stderr bytes.Buffer
		err := run(ctx, []string{"send", "-store", laptopFile, "-to", "phone", "-id", "one", "hello"}, noEnv, &stdout, &stderr)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "unknown_device") {
			t.Fatalf("send: %v\n%s", err, stderr.String())
		}
		select {
		case <-ctx.Done():
			t.Fatal("the phone never registered")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := <-listened; err != nil {
		t.Fatalf("listen: %v\n%s", err, listenErr.String())
	}
	var line struct {
		ID      string `json:"id"`
		From    string `json:"from"`
		Payload []byte `json:"payload"`
	}
	if err := json.Unmarshal(listenOut.Bytes(), &line); err != nil || line.ID != "one" || line.From != "laptop" || string(line.Payload) != "hello" {
		t.Fatalf("listen printed %q (%v)", listenOut.String(), err)
	}
	renewed, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if renewals, _ := cr.Counts(); renewals != 1 || renewed.RenewalSecret == paired.RenewalSecret || renewed.URL != cr.URL {
		t.Fatalf("%d renewals; the file's secret changed: %v, URL %q", renewals, renewed.RenewalSecret != paired.RenewalSecret, renewed.URL)
	}

	// Usage mistakes: exit 2.
	for _, args := range [][]string{
		{"pair", "-url", cr.URL, "-store", phoneFile},                 // no code
		{"pair", "-url", cr.URL, "-code", "X"},                        // no store
		{"send", "-store", phoneFile, "-token", "t", "-to", "a", "x"}, // both
		{"listen", "-store", filepath.Join(dir, "none.json")},         // no file
	} {
		err := run(ctx, args, noEnv, &bytes.Buffer{}, &bytes.Buffer{})
		var exit *exitError
		if !errors.As(err, &exit) || exit.code != 2 {
			t.Errorf("%q: %v, want exit 2", args, err)
		}
	}
	// A wrong code: the relay's refusal, not a usage mistake.
	err = run(ctx, []string{"pair", "-url", cr.URL, "-code", "WRONG", "-store", filepath.Join(dir, "x.json")}, noEnv, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("pair with a wrong code: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x.json")); err == nil {
		t.Errorf("a refused pairing wrote a file")
	}
}

func pairModes(t *testing.T, test func(*testing.T, pairtest.Mode)) {
	for _, m := range pairtest.Modes() {
		t.Run(string(m), func(t *testing.T) { test(t, m) })
	}
}

// TestRefusalsSayWhatToDo: when the relay refuses a device for good, the
// command's error ends with the commands that help: a used code and a
// removed paired device need a new invitation (relay invite, with the
// device's names when the -store file has them), a refused token a look
// at it (relay token check -url, which asks the relay).
func TestRefusalsSayWhatToDo(t *testing.T) { pairModes(t, testRefusalsSayWhatToDo) }

func testRefusalsSayWhatToDo(t *testing.T, mode pairtest.Mode) {
	clock := pairtest.NewClock()
	cr := pairtest.NewContractMode(t, mode, clock, time.Hour)
	dir := t.TempDir()
	phoneFile := filepath.Join(dir, "phone.json")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wantEnd := func(what string, err error, end string) {
		t.Helper()
		if err == nil || !strings.HasSuffix(err.Error(), end) {
			t.Errorf("%s: %v\nwant it to end with %q", what, err, end)
		}
	}

	code := cr.Invite("phone")
	if err := run(ctx, []string{"pair", "-url", cr.URL, "-code", code, "-store", phoneFile}, noEnv, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	err := run(ctx, []string{"pair", "-url", cr.URL, "-code", code, "-store", filepath.Join(dir, "again.json")}, noEnv, &bytes.Buffer{}, &bytes.Buffer{})
	wantEnd("pair with a used code", err, "ask an admin for a new invitation (relay invite -device NAME)")

	// The phone registers, then an admin removes it.
	src, err := client.NewRenewing(ctx, cr.URL, client.FileStore(phoneFile), client.RenewingOptions{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	phone, err := client.NewWithCredentials(cr.URL, src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := phone.Register(ctx); err != nil {
		t.Fatal(err)
	}
	tabletToken := cr.Mint("tablet", time.Hour)
	tablet, err := client.New(cr.URL, tabletToken)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tablet.Register(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second) // removals come after the tokens' iat
	for _, d := range []string{"phone", "tablet"} {
		if err := cr.Remove(d); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Second)

	err = run(ctx, []string{"listen", "-store", phoneFile, "-wait", "1"}, noEnv, &bytes.Buffer{}, &bytes.Buffer{})
	if !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("listen of a removed device: %v, want ErrUnauthorized", err)
	}
	wantEnd("listen of a removed device", err, "ask an admin for a new invitation and pair again (relay invite -household home -device phone, then relay pair -url "+cr.URL+" -code CODE -store "+phoneFile+"; if relay devices still lists phone, invite with -replace)")
	err = run(ctx, []string{"send", "-store", phoneFile, "-to", "phone", "x"}, noEnv, &bytes.Buffer{}, &bytes.Buffer{})
	wantEnd("send of a removed device", err, "(relay invite -household home -device phone, then relay pair -url "+cr.URL+" -code CODE -store "+phoneFile+"; if relay devices still lists phone, invite with -replace)")

	err = run(ctx, []string{"listen", "-url", cr.URL, "-token", tabletToken, "-wait", "1"}, noEnv, &bytes.Buffer{}, &bytes.Buffer{})
	wantEnd("listen with a removed device's token", err, "; relay token check -url "+cr.URL+" TOKEN says why")
}
