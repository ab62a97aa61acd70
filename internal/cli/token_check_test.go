package cli

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/pairtest"
	"github.com/flamenet/relay/token"
)

// offlineVerdict is token check's last line for a token it cannot fault
// without the relay: a removal is known only there.
const offlineVerdict = "valid signature and expiry; whether the device was removed only the relay knows (-url asks it)\n"

// TestTokenCheckRemovedDevice is the case: a removed device's
// token, which the relay refuses. Offline, token check does not call it
// valid but says what it cannot know; with -url it asks the relay, says
// refused and exits 1, and for a device still there says accepted. A
// relay it cannot ask is exit 3, not a verdict.
func TestTokenCheckRemovedDevice(t *testing.T) {
	clock := pairtest.NewClock()
	base, key := pairtest.StartRelay(t, clock, nil)
	mint := func(device, scope string) string {
		now := clock.Now()
		tok, err := token.Mint(key, token.Claims{Household: "home", Device: device, Scope: scope, IssuedAt: now, Expires: now.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	phone, tablet := mint("phone", ""), mint("tablet", "")
	for _, tok := range []string{phone, tablet} {
		if code, b := request(t, "POST", base+"/v1/register", tok, `{}`); code != 200 {
			t.Fatalf("register: %d %s", code, b)
		}
	}
	clock.Advance(time.Second) // the removal comes after the token's iat
	if code, b := request(t, "DELETE", base+"/v1/devices/phone", mint("admin", token.ScopeAdmin), ""); code != 204 {
		t.Fatalf("removing phone: %d %s", code, b)
	}
	vars := env(map[string]string{"FN_ISSUER_KEYS": base64.StdEncoding.EncodeToString(key.Public().(ed25519.PublicKey))})
	check := func(args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"token", "check"}, args...), vars, &out, io.Discard)
		return out.String(), err
	}

	if out, err := check(phone); err != nil || !strings.HasSuffix(out, "\n"+offlineVerdict) {
		t.Errorf("offline, a removed device's token: %v\n%s\nwant exit 0 and the last line %q", err, out, offlineVerdict)
	}
	out, err := check("-url", base, phone)
	if !errors.Is(err, errRefused) || !strings.Contains(out, "refused: the relay at "+base+" answers 401") || strings.Contains(out, "\nvalid") {
		t.Errorf("-url, a removed device's token: %v\n%s\nwant exit 1 and the relay's refusal", err, out)
	}
	if out, err := check("-url", base, tablet); err != nil || !strings.HasSuffix(out, "\nvalid: the relay at "+base+" accepts it\n") {
		t.Errorf("-url, a device that is there: %v\n%s\nwant exit 0, accepted", err, out)
	}
	// A relay that does not answer: no verdict, exit 3.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String()
	ln.Close()
	out, err = check("-url", gone, tablet)
	var exit *exitError
	if !errors.As(err, &exit) || exit.code != 3 || strings.Contains(out, "\nvalid") {
		t.Errorf("-url, no relay there: %v\n%s\nwant exit 3 and no verdict", err, out)
	}
}
