package push

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/internal/servicetest"
)

// closedAddr is host:port where nothing listens (connection refused). The
// port stays bound, without a listen, until the test ends: a port closed
// at once was seen taken by the next fake server the test started, which
// then answered in its place.
func closedAddr(tb testing.TB) string {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// A UnifiedPush URL is a capability for its device, and APNs and FCM
// tokens address a device: none may reach a log. Each scenario fails a push
// through a queue of its own (the first failure is always logged) and
// checks the log output at debug level, then the error the provider
// itself returns. Making stripURL return its error unchanged (done once on
// purpose) turns the provider errors red, net/http's url.Error quoting the
// URL with the APNs token or the UnifiedPush capability in it; doing that
// and dropping logErr's replacement too turns the log red as well.
func TestLogsNameNoTarget(t *testing.T) {
	const header = 200 * time.Millisecond
	key, keyFile := newP8(t)
	refused := closedAddr(t)
	untrusted := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(untrusted.Close)

	up500 := newUPFake(t, func(string, int) (int, string) { return 500, "" })
	up404 := newUPFake(t, func(string, int) (int, string) { return 404, "" })
	upHang := newUPFake(t, nil)
	upHang.gate = make(chan struct{})
	t.Cleanup(func() { close(upHang.gate) })

	release := make(chan struct{}) // hanging fakes answer once it closes
	apns500 := newAPNsFake(t, &key.PublicKey, func(string, int) (int, string, string) {
		return 500, "InternalServerError", ""
	})
	apnsHang := newAPNsFake(t, &key.PublicKey, func(string, int) (int, string, string) {
		<-release
		return 200, "", ""
	})
	fcm503 := newFCMFake(t, func(string, int) (int, string, string) {
		return 503, fcmError(503, "UNAVAILABLE", "UNAVAILABLE"), ""
	})
	fcmHang := newFCMFake(t, func(string, int) (int, string, string) {
		<-release
		return 200, "{}", ""
	})
	t.Cleanup(func() { close(release) }) // before the fakes close

	apnsCfg := func(url string, f *apnsFake) APNsConfig {
		c := APNsConfig{KeyFile: keyFile, KeyID: testKeyID, TeamID: testTeamID, Topic: testTopic, URL: url}
		if f != nil {
			c.RootCAs = f.roots()
		}
		return c
	}
	fcmCfg := func(f *fcmFake, url string) FCMConfig {
		return FCMConfig{CredentialsFile: credentials(t, f.tokenURL()), URL: url}
	}
	upSecret := func(base, name string) string { return base + "/SECRET-" + name + "?auth=SECRET-" + name }

	for i, tc := range []struct {
		name    string
		kind    string
		address string
		cfg     Config
		status  int // the status the log must show, 0 for none
		gone    bool
	}{
		{"unifiedpush refused", device.PushUnifiedPush, upSecret("http://"+refused, "refused"), Config{}, 0, false},
		{"unifiedpush 500", device.PushUnifiedPush, upSecret(up500.srv.URL, "500"), Config{}, 500, false},
		{"unifiedpush 404", device.PushUnifiedPush, upSecret(up404.srv.URL, "404"), Config{}, 404, true},
		{"unifiedpush timeout", device.PushUnifiedPush, upSecret(upHang.srv.URL, "timeout"), Config{}, 0, false},
		{"unifiedpush tls", device.PushUnifiedPush, upSecret(untrusted.URL, "tls"), Config{}, 0, false},
		{"unifiedpush bad form", device.PushUnifiedPush, "http://" + refused + "/SECRET-form\x7f", Config{}, 0, false},
		{"apns refused", device.PushAPNs, devToken("5ec1"), Config{APNs: apnsCfg("https://"+refused, nil)}, 0, false},
		{"apns 500", device.PushAPNs, devToken("5ec2"), Config{APNs: apnsCfg(apns500.srv.URL, apns500)}, 500, false},
		{"apns timeout", device.PushAPNs, devToken("5ec3"), Config{APNs: apnsCfg(apnsHang.srv.URL, apnsHang)}, 0, false},
		{"apns tls", device.PushAPNs, devToken("5ec4"), Config{APNs: apnsCfg(untrusted.URL, nil)}, 0, false},
		{"fcm refused", device.PushFCM, "SECRET-fcm-refused", Config{FCM: fcmCfg(fcm503, "http://"+refused)}, 0, false},
		{"fcm 503", device.PushFCM, "SECRET-fcm-503", Config{FCM: fcmCfg(fcm503, fcm503.srv.URL)}, 503, false},
		{"fcm timeout", device.PushFCM, "SECRET-fcm-timeout", Config{FCM: fcmCfg(fcmHang, fcmHang.srv.URL)}, 0, false},
		{"fcm tls", device.PushFCM, "SECRET-fcm-tls", Config{FCM: fcmCfg(fcm503, untrusted.URL)}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs servicetest.Buffer
			cfg := tc.cfg
			cfg.Workers, cfg.AllowPrivate = 1, true
			cfg.MaxAttempts, cfg.RetryBase = 2, 10*time.Millisecond
			cfg.ResponseHeaderTimeout, cfg.AttemptTimeout = header, time.Second
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			q := newQueue(t, cfg, nil)
			household, name := fmt.Sprint("hh", i), fmt.Sprint("dev", i)
			if !q.Enqueue(Job{Household: household, Device: name, Target: device.PushTarget{Kind: tc.kind, Address: tc.address}}) {
				t.Fatal("Enqueue refused")
			}
			waitFor(t, "push failed", func() bool { return q.Stats().Failed == 1 })
			// The provider's own error, which a caller might log too.
			pushErr := q.providers[tc.kind].Push(context.Background(), tc.address)
			closeQueue(t, q)

			out := logs.String()
			want := "push failed"
			if tc.gone {
				want = "push target gone"
			}
			for _, w := range []string{want, "provider=" + tc.kind, "household=" + household, "device=" + name,
				fmt.Sprint("status=", tc.status)} {
				if !strings.Contains(out, w) {
					t.Errorf("log lacks %q:\n%s", w, out)
				}
			}
			if pushErr == nil {
				t.Fatal("the provider's Push succeeded")
			}
			for what, text := range map[string]string{"log": out, "provider error": pushErr.Error()} {
				for _, secret := range []string{tc.address, "SECRET", tc.address[:min(len(tc.address), 16)]} {
					if strings.Contains(text, secret) {
						t.Errorf("%s contains %q:\n%s", what, secret, text)
					}
				}
			}
		})
	}
}
