package push

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
)

var errSafetyNet = errors.New("test safety net: not connecting outside loopback")

// The register-time check and the workers agree: every target that
// Queue.CheckTarget accepts gets as far as the provider (the UnifiedPush
// dialer's connect, the APNs or FCM fake), and every target it refuses is
// refused by the worker before any connection. Each target goes through
// both, with AllowPrivate off and on. Making checkEndpoint skip the
// resolution when private addresses are allowed, as it once did (done once
// on purpose), turns this red: the unresolvable host passes the check and
// fails every send. So does checking FCM tokens at register with a looser
// copy of the rule (only whitespace refused, done once on purpose): tokens
// with NUL, escape, DEL or non-ASCII bytes pass the check and fail forever.
func TestCheckTargetAgreesWithWorkers(t *testing.T) {
	key, keyFile := newP8(t)
	apnsF := newAPNsFake(t, &key.PublicKey, nil)
	fcmF := newFCMFake(t, nil)
	upF := newUPFake(t, nil)
	port := fmt.Sprint(upF.srv.Listener.Addr().(*net.TCPAddr).Port)
	resolver := fakeResolver{
		"push.example":  {"93.184.216.34"},
		"v6.example":    {"2606:2800:220:1:248:1893:25c8:1946"},
		"loop.example":  {"127.0.0.1"},
		"lan.example":   {"10.0.0.1"},
		"mixed.example": {"93.184.216.34", "192.168.1.1"},
	}
	up := func(u string) string { return strings.ReplaceAll(u, "PORT", port) }

	for _, tc := range []struct {
		name            string
		target          device.PushTarget
		public, private bool // accepted without and with AllowPrivate
	}{
		{"up public name", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://push.example:PORT/up/1")}, true, true},
		{"up https", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("https://push.example:PORT/up/2")}, true, true},
		{"up public v6 name", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://v6.example:PORT/up")}, true, true},
		{"up query and fragment", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://push.example:PORT/up?t=a%2Fb#frag")}, true, true},
		{"up default port", device.PushTarget{Kind: device.PushUnifiedPush, Address: "https://push.example/up"}, true, true},
		{"up loopback address", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://127.0.0.1:PORT/up")}, false, true},
		{"up loopback v6", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://[::1]:PORT/up")}, false, true},
		{"up name to loopback", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://loop.example:PORT/up")}, false, true},
		{"up name to private", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://lan.example:PORT/up")}, false, true},
		{"up mixed answer", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://mixed.example:PORT/up")}, false, true},
		{"up unresolvable", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://nowhere.example:PORT/up")}, false, false},
		{"up userinfo", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://user:pw@push.example:PORT/up")}, false, false},
		{"up ftp", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("ftp://push.example:PORT/up")}, false, false},
		{"up space", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://push.example:PORT/up here")}, false, false},
		{"up nul", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://push.example:PORT/up\x00")}, false, false},
		{"up non-ascii path", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://push.example:PORT/üp")}, false, false},
		{"up non-ascii host", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://püsh.example:PORT/up")}, false, false},
		{"up escaped host", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://push%2Eexample:PORT/up")}, false, false},
		{"up port 0", device.PushTarget{Kind: device.PushUnifiedPush, Address: "http://push.example:0/up"}, false, false},
		{"up no host", device.PushTarget{Kind: device.PushUnifiedPush, Address: "http:///up"}, false, false},
		{"up relative", device.PushTarget{Kind: device.PushUnifiedPush, Address: "/up"}, false, false},
		{"up too long", device.PushTarget{Kind: device.PushUnifiedPush, Address: up("http://push.example:PORT/") + strings.Repeat("a", maxEndpointLen)}, false, false},
		{"up empty", device.PushTarget{Kind: device.PushUnifiedPush, Address: ""}, false, false},
		{"apns lower", device.PushTarget{Kind: device.PushAPNs, Address: devToken("ab")}, true, true},
		{"apns upper", device.PushTarget{Kind: device.PushAPNs, Address: strings.ToUpper(devToken("cd"))}, true, true},
		{"apns 200 digits", device.PushTarget{Kind: device.PushAPNs, Address: strings.Repeat("ef", 100)}, true, true},
		{"apns 202 digits", device.PushTarget{Kind: device.PushAPNs, Address: strings.Repeat("ab", 101)}, false, false},
		{"apns odd length", device.PushTarget{Kind: device.PushAPNs, Address: "abc"}, false, false},
		{"apns not hex", device.PushTarget{Kind: device.PushAPNs, Address: "zz" + devToken("")[2:]}, false, false},
		{"apns path", device.PushTarget{Kind: device.PushAPNs, Address: "../../x"}, false, false},
		{"apns empty", device.PushTarget{Kind: device.PushAPNs, Address: ""}, false, false},
		{"fcm token", device.PushTarget{Kind: device.PushFCM, Address: "dGVzdA:APA91b-token_1"}, true, true},
		{"fcm odd printable", device.PushTarget{Kind: device.PushFCM, Address: `tok"en\with/odd~chars`}, true, true},
		{"fcm longest", device.PushTarget{Kind: device.PushFCM, Address: strings.Repeat("t", maxTokenLen)}, true, true},
		{"fcm too long", device.PushTarget{Kind: device.PushFCM, Address: strings.Repeat("t", maxTokenLen+1)}, false, false},
		{"fcm nul", device.PushTarget{Kind: device.PushFCM, Address: "tok\x00en"}, false, false},
		{"fcm escape", device.PushTarget{Kind: device.PushFCM, Address: "tok\x1b[31men"}, false, false},
		{"fcm tab", device.PushTarget{Kind: device.PushFCM, Address: "tok\ten"}, false, false},
		{"fcm newline", device.PushTarget{Kind: device.PushFCM, Address: "tok\nen"}, false, false},
		{"fcm space", device.PushTarget{Kind: device.PushFCM, Address: "tok en"}, false, false},
		{"fcm del", device.PushTarget{Kind: device.PushFCM, Address: "tok\x7f"}, false, false},
		{"fcm non-ascii", device.PushTarget{Kind: device.PushFCM, Address: "tokén"}, false, false},
		{"fcm empty", device.PushTarget{Kind: device.PushFCM, Address: ""}, false, false},
		{"unknown kind", device.PushTarget{Kind: "sms", Address: "+15550100"}, false, false},
	} {
		for _, allowPrivate := range []bool{false, true} {
			want := tc.public
			if allowPrivate {
				want = tc.private
			}
			t.Run(fmt.Sprintf("%s/private=%v", tc.name, allowPrivate), func(t *testing.T) {
				q := newQueue(t, Config{Workers: 1, MaxAttempts: 1, AllowPrivate: allowPrivate,
					ResponseHeaderTimeout: 2 * time.Second, AttemptTimeout: 2 * time.Second,
					UnifiedPush: UnifiedPushConfig{Resolver: resolver},
					APNs:        apnsConfig(keyFile, apnsF),
					FCM:         FCMConfig{CredentialsFile: credentials(t, fcmF.tokenURL()), URL: fcmF.srv.URL},
				}, nil)
				// Every address that passes the dialer's own check is
				// counted as reached; only loopback ones connect.
				var connects atomic.Int64
				q.providers[device.PushUnifiedPush].(*unifiedPush).dialer.afterCheck = func(ap netip.AddrPort) error {
					connects.Add(1)
					if !ap.Addr().IsLoopback() {
						return errSafetyNet
					}
					return nil
				}
				before := apnsF.total() + fcmF.total()

				checkErr := q.CheckTarget(context.Background(), tc.target)
				q.Enqueue(Job{Household: "h", Device: "d", Target: tc.target})
				waitFor(t, "push ended", func() bool {
					s := q.Stats()
					return s.Sent+s.Failed+s.Dropped == s.Attempted
				})
				closeQueue(t, q)
				reached := connects.Load() > 0 || apnsF.total()+fcmF.total() > before

				if (checkErr == nil) != reached {
					t.Errorf("CheckTarget = %v, but the worker reached the provider: %v", checkErr, reached)
				}
				if (checkErr == nil) != want {
					t.Errorf("CheckTarget = %v, want accepted: %v", checkErr, want)
				}
			})
		}
	}
	apnsF.check(t)
	fcmF.check(t)
}
