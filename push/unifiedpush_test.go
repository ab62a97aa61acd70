package push

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
)

// fakeResolver answers from a map, like a DNS server under test control.
type fakeResolver map[string][]string

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	addrs, ok := r[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var out []netip.Addr
	for _, a := range addrs {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

// loopbackOnly is a safety net under the guard being tested: whatever the
// guard does, the test never lets a socket connect outside loopback. It
// answers with an error that is not ErrForbiddenAddress, so a broken guard
// still shows red.
func loopbackOnly(ap netip.AddrPort) error {
	if !ap.Addr().IsLoopback() {
		return fmt.Errorf("test safety net: refusing to connect to %s", ap)
	}
	return nil
}

func TestCheckEndpoint(t *testing.T) {
	ctx := context.Background()
	r := fakeResolver{
		"push.example":      {"93.184.216.34"},
		"rebind.example":    {"127.0.0.1"},
		"internal.example":  {"10.0.0.1"},
		"mixed.example":     {"93.184.216.34", "192.168.1.1"},
		"metadata.example":  {"169.254.169.254"},
		"v6public.example":  {"2606:2800:220:1:248:1893:25c8:1946"},
		"v6private.example": {"fd00::1"},
	}
	for _, tc := range []struct {
		name, url string
		want      error // nil: allowed
		private   error // with allowPrivate
	}{
		{"public host", "https://push.example/up/abc?x=1", nil, nil},
		{"public v6 host", "https://v6public.example/up", nil, nil},
		{"public ip", "http://93.184.216.34:8080/up", nil, nil},
		{"loopback v4", "http://127.0.0.1/up", ErrForbiddenAddress, nil},
		{"loopback v4 other", "http://127.3.2.1:9000/up", ErrForbiddenAddress, nil},
		{"loopback v6", "http://[::1]:8080/up", ErrForbiddenAddress, nil},
		{"private 10/8", "http://10.0.0.1/up", ErrForbiddenAddress, nil},
		{"private 172.16/12", "https://172.20.0.5/up", ErrForbiddenAddress, nil},
		{"private 192.168/16", "https://192.168.0.10/up", ErrForbiddenAddress, nil},
		{"link-local", "http://169.254.169.254/latest/meta-data", ErrForbiddenAddress, nil},
		{"link-local v6", "http://[fe80::1]/up", ErrForbiddenAddress, nil},
		{"unique local v6", "http://[fd12::1]/up", ErrForbiddenAddress, nil},
		{"unspecified", "http://0.0.0.0:8080/up", ErrForbiddenAddress, nil},
		{"v4-mapped loopback", "http://[::ffff:127.0.0.1]/up", ErrForbiddenAddress, nil},
		{"nat64 private", "http://[64:ff9b::a00:1]/up", ErrForbiddenAddress, nil},
		{"6to4 private", "http://[2002:c0a8:101::1]/up", ErrForbiddenAddress, nil},
		{"carrier-grade nat", "http://100.64.1.1/up", ErrForbiddenAddress, nil},
		{"hostname to loopback", "http://rebind.example/up", ErrForbiddenAddress, nil},
		{"hostname to private", "http://internal.example/up", ErrForbiddenAddress, nil},
		{"hostname to metadata", "http://metadata.example/up", ErrForbiddenAddress, nil},
		{"hostname to private v6", "http://v6private.example/up", ErrForbiddenAddress, nil},
		{"one private answer among public", "http://mixed.example/up", ErrForbiddenAddress, nil},
		{"unresolvable", "http://nowhere.example/up", ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"ftp", "ftp://push.example/up", ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"file", "file:///etc/passwd", ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"userinfo", "https://user:pw@push.example/up", ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"user only", "https://user@push.example/up", ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"no host", "https:///up", ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"relative", "/up/abc", ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"opaque", "http:push.example", ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"bad port", "http://push.example:99999/up", ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"too long", "https://push.example/" + strings.Repeat("a", maxEndpointLen), ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"space", "https://push.example/up here", ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"non-ascii path", "https://push.example/üp", ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"non-ascii host", "https://püsh.example/up", ErrInvalidEndpoint, ErrInvalidEndpoint},
		{"escaped non-ascii host", "https://p%C3%BCsh.example/up", ErrInvalidEndpoint, ErrInvalidEndpoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkEndpoint(ctx, tc.url, false, r)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("checkEndpoint(%q) = %v, want %v", tc.url, err, tc.want)
			}
			err = checkEndpoint(ctx, tc.url, true, r)
			if (tc.private == nil) != (err == nil) || (tc.private != nil && !errors.Is(err, tc.private)) {
				t.Errorf("with allowPrivate: checkEndpoint(%q) = %v, want %v", tc.url, err, tc.private)
			}
		})
	}
}

// CheckEndpoint itself, with the system resolver: "localhost" is a name
// that resolves to loopback.
func TestCheckEndpointSystemResolver(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{"http://localhost:8080/up", "http://127.0.0.1/up", "http://[::1]/up", "http://10.0.0.1/up", "http://169.254.1.1/up"} {
		if err := CheckEndpoint(ctx, u, false); !errors.Is(err, ErrForbiddenAddress) {
			t.Errorf("CheckEndpoint(%q) = %v, want ErrForbiddenAddress", u, err)
		}
		if err := CheckEndpoint(ctx, u, true); err != nil {
			t.Errorf("CheckEndpoint(%q, allowPrivate) = %v", u, err)
		}
	}
}

func TestCheckTarget(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		t  device.PushTarget
		ok bool
	}{
		{device.PushTarget{}, true},
		{device.PushTarget{Kind: device.PushNone}, true},
		{device.PushTarget{Kind: device.PushNone, Address: "x"}, false},
		{device.PushTarget{Kind: device.PushAPNs, Address: strings.Repeat("ab", 32)}, true},
		{device.PushTarget{Kind: device.PushAPNs, Address: "abc"}, false},
		{device.PushTarget{Kind: device.PushAPNs, Address: "zz"}, false},
		{device.PushTarget{Kind: device.PushAPNs, Address: "../../x"}, false},
		{device.PushTarget{Kind: device.PushFCM, Address: "dGVzdA:APA91b-token_1"}, true},
		{device.PushTarget{Kind: device.PushFCM, Address: ""}, false},
		{device.PushTarget{Kind: device.PushFCM, Address: "a b"}, false},
		{device.PushTarget{Kind: device.PushFCM, Address: "a\x00b"}, false},
		{device.PushTarget{Kind: device.PushFCM, Address: "a\x1bb"}, false},
		{device.PushTarget{Kind: device.PushFCM, Address: "aéb"}, false},
		{device.PushTarget{Kind: device.PushUnifiedPush, Address: "http://127.0.0.1/up"}, false},
		{device.PushTarget{Kind: "sms", Address: "x"}, false},
	} {
		if err := CheckTarget(ctx, tc.t, false); (err == nil) != tc.ok {
			t.Errorf("CheckTarget(%+v) = %v, want ok=%v", tc.t, err, tc.ok)
		}
	}
}

// At send time, without AllowPrivate, nothing reaches a loopback, private
// or link-local address, whether named by address or by a hostname whose
// DNS answer changed after registration. The fake listens on 127.0.0.1, so
// a push that got through would be counted there.
func TestSendRefusesPrivate(t *testing.T) {
	fake := newUPFake(t, nil)
	port := fake.srv.Listener.Addr().(*net.TCPAddr).Port
	resolver := fakeResolver{
		"localhost":      {"127.0.0.1"},
		"rebind.example": {"127.0.0.1"},
		"lan.example":    {"10.0.0.1"},
	}
	targets := []string{
		fake.url("/direct"),
		fmt.Sprintf("http://localhost:%d/name", port),
		fmt.Sprintf("http://rebind.example:%d/rebind", port),
		fmt.Sprintf("http://[::1]:%d/v6", port),
		fmt.Sprintf("http://10.0.0.1:%d/lan", port),
		fmt.Sprintf("http://lan.example:%d/lan-name", port),
		"http://169.254.169.254/latest/meta-data",
	}

	t.Run("provider", func(t *testing.T) {
		up := newUnifiedPush(withDefaults(Config{UnifiedPush: UnifiedPushConfig{Resolver: resolver}}))
		up.dialer.afterCheck = loopbackOnly
		defer up.Close()
		for _, u := range targets {
			if err := up.Push(context.Background(), u); !errors.Is(err, ErrForbiddenAddress) {
				t.Errorf("Push(%q) = %v, want ErrForbiddenAddress", u, err)
			}
		}
	})

	t.Run("queue", func(t *testing.T) {
		q := newQueue(t, Config{UnifiedPush: UnifiedPushConfig{Resolver: resolver}}, nil)
		q.providers[device.PushUnifiedPush].(*unifiedPush).dialer.afterCheck = loopbackOnly
		for i, u := range targets {
			q.Enqueue(job(fmt.Sprint("d", i), u))
		}
		waitFor(t, "pushes refused", func() bool { return q.Stats().Failed == uint64(len(targets)) })
		s := closeQueue(t, q)
		if s.Sent != 0 || s.Gone != 0 || s.Retried != 0 {
			t.Errorf("stats %+v; want every push failed, none gone or retried", s)
		}
	})

	if n := fake.total(); n != 0 {
		t.Errorf("the loopback fake received %d pushes", n)
	}
}

// The last guard on its own: a dial straight to a checked-out address (as
// after a DNS answer that changed between lookup and connect) is refused by
// the dialer's Control, which sees the address the socket connects to.
// Making control return nil (done once on purpose) turns this red.
func TestDialerControlRefusesConnect(t *testing.T) {
	fake := newUPFake(t, nil)
	d := newGuardedDialer(fakeResolver{}, false)
	for _, network := range []string{"tcp", "tcp4"} {
		c, err := d.dialer.DialContext(context.Background(), network, fake.srv.Listener.Addr().String())
		if err == nil {
			c.Close()
			t.Fatalf("%s dial to %s connected", network, fake.srv.Listener.Addr())
		}
		if !errors.Is(err, ErrForbiddenAddress) {
			t.Errorf("%s dial error %v, want ErrForbiddenAddress", network, err)
		}
	}
	if n := fake.total(); n != 0 {
		t.Errorf("fake received %d requests", n)
	}
}

func TestUnifiedPushAnswers(t *testing.T) {
	fake := newUPFake(t, func(path string, n int) (int, string) {
		switch path {
		case "/ok":
			return 201, ""
		case "/gone404":
			return 404, ""
		case "/gone410":
			return 410, ""
		case "/busy": // 429 with Retry-After once, then fine
			if n == 1 {
				return 429, "1"
			}
			return 201, ""
		case "/flaky": // 503 once, then fine
			if n == 1 {
				return 503, ""
			}
			return 201, ""
		case "/down":
			return 500, ""
		case "/later": // asks for more time than the push has
			return 429, "3600"
		case "/bad":
			return 400, ""
		case "/redirect":
			return 307, ""
		}
		return 418, ""
	})
	var gone goneRecorder
	q := newQueue(t, Config{AllowPrivate: true, MaxAttempts: 3, RetryBase: 10 * time.Millisecond, Timeout: 10 * time.Second}, gone.onGone)
	paths := []string{"/ok", "/gone404", "/gone410", "/busy", "/flaky", "/down", "/later", "/bad", "/redirect"}
	for _, p := range paths {
		q.Enqueue(job(strings.TrimPrefix(p, "/"), fake.url(p)))
	}
	waitFor(t, "every push ended", func() bool {
		s := q.Stats()
		return s.Sent+s.Failed == uint64(len(paths))
	})
	s := closeQueue(t, q)

	wantHits := map[string]int{"/ok": 1, "/gone404": 1, "/gone410": 1, "/busy": 2, "/flaky": 2, "/down": 3, "/later": 1, "/bad": 1, "/redirect": 1}
	for p, want := range wantHits {
		if got := fake.hitsFor(p); got != want {
			t.Errorf("%s: %d requests, want %d", p, got, want)
		}
	}
	if s.Sent != 3 || s.Gone != 2 || s.Failed != 6 || s.Retried != 4 {
		t.Errorf("stats %+v; want sent 3, gone 2, failed 6 (gone included), retried 4", s)
	}
	goneDevices := map[string]bool{}
	for _, j := range gone.got() {
		goneDevices[j.Device] = true
		if j.Household != "hh-"+j.Device || j.Target.Kind != device.PushUnifiedPush {
			t.Errorf("onGone job %+v", j)
		}
	}
	if len(gone.got()) != 2 || !goneDevices["gone404"] || !goneDevices["gone410"] {
		t.Errorf("onGone called for %+v, want gone404 and gone410 once each", gone.got())
	}
	// Retry-After: 1 was honoured.
	fake.mu.Lock()
	busy := fake.times["/busy"]
	fake.mu.Unlock()
	if len(busy) == 2 && busy[1].Sub(busy[0]) < time.Second {
		t.Errorf("retried after %v, before the 1 s Retry-After", busy[1].Sub(busy[0]))
	}
	fake.checkBodies(t)
}

func TestParseEndpointKeepsQuery(t *testing.T) {
	u, err := parseEndpoint("https://push.example/up?token=abc&x=%2F")
	if err != nil {
		t.Fatal(err)
	}
	if got := u.Query().Get("x"); got != "/" {
		t.Errorf("query x = %q", got)
	}
	if _, err := url.Parse(u.String()); err != nil {
		t.Error(err)
	}
}
