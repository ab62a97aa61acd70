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
		target          Target
		public, private bool // accepted without and with AllowPrivate
	}{
		{"up public name", Target{KindUnifiedPush, up("http://push.example:PORT/up/1")}, true, true},
		{"up https", Target{KindUnifiedPush, up("https://push.example:PORT/up/2")}, true, true},
		{"up public v6 name", Target{KindUnifiedPush, up("http://v6.example:PORT/up")}, true, true},
		{"up query and fragment", Target{KindUnifiedPush, up("http://push.example:PORT/up?t=a%2Fb#frag")}, true, true},
		{"up default port", Target{KindUnifiedPush, "https://push.example/up"}, true, true},
		{"up loopback address", Target{KindUnifiedPush, up("http://127.0.0.1:PORT/up")}, false, true},
		{"up loopback v6", Target{KindUnifiedPush, up("http://[::1]:PORT/up")}, false, true},
		{"up name to loopback", Target{KindUnifiedPush, up("http://loop.example:PORT/up")}, false, true},
		{"up name to private", Target{KindUnifiedPush, up("http://lan.example:PORT/up")}, false, true},
		{"up mixed answer", Target{KindUnifiedPush, up("http://mixed.example:PORT/up")}, false, true},
		{"up unresolvable", Target{KindUnifiedPush, up("http://nowhere.example:PORT/up")}, false, false},
		{"up userinfo", Target{KindUnifiedPush, up("http://user:pw@push.example:PORT/up")}, false, false},
		{"up ftp", Target{KindUnifiedPush, up("ftp://push.example:PORT/up")}, false, false},
		{"up space", Target{KindUnifiedPush, up("http://push.example:PORT/up here")}, false, false},
		{"up nul", Target{KindUnifiedPush, up("http://push.example:PORT/up\x00")}, false, false},
		{"up non-ascii path", Target{KindUnifiedPush, up("http://push.example:PORT/üp")}, false, false},
		{"up non-ascii host", Target{KindUnifiedPush, up("http://püsh.example:PORT/up")}, false, false},
		{"up escaped host", Target{KindUnifiedPush, up("http://push%2Eexample:PORT/up")}, false, false},
		{"up port 0", Target{KindUnifiedPush, "http://push.example:0/up"}, false, false},
		{"up no host", Target{KindUnifiedPush, "http:///up"}, false, false},
		{"up relative", Target{KindUnifiedPush, "/up"}, false, false},
		{"up too long", Target{KindUnifiedPush, up("http://push.example:PORT/") + strings.Repeat("a", maxEndpointLen)}, false, false},
		{"up empty", Target{KindUnifiedPush, ""}, false, false},
		{"apns lower", Target{KindAPNs, devToken("ab")}, true, true},
		{"apns upper", Target{KindAPNs, strings.ToUpper(devToken("cd"))}, true, true},
		{"apns 200 digits", Target{KindAPNs, strings.Repeat("ef", 100)}, true, true},
		{"apns 202 digits", Target{KindAPNs, strings.Repeat("ab", 101)}, false, false},
		{"apns odd length", Target{KindAPNs, "abc"}, false, false},
		{"apns not hex", Target{KindAPNs, "zz" + devToken("")[2:]}, false, false},
		{"apns path", Target{KindAPNs, "../../x"}, false, false},
		{"apns empty", Target{KindAPNs, ""}, false, false},
		{"fcm token", Target{KindFCM, "dGVzdA:APA91b-token_1"}, true, true},
		{"fcm odd printable", Target{KindFCM, `tok"en\with/odd~chars`}, true, true},
		{"fcm longest", Target{KindFCM, strings.Repeat("t", maxTokenLen)}, true, true},
		{"fcm too long", Target{KindFCM, strings.Repeat("t", maxTokenLen+1)}, false, false},
		{"fcm nul", Target{KindFCM, "tok\x00en"}, false, false},
		{"fcm escape", Target{KindFCM, "tok\x1b[31men"}, false, false},
		{"fcm tab", Target{KindFCM, "tok\ten"}, false, false},
		{"fcm newline", Target{KindFCM, "tok\nen"}, false, false},
		{"fcm space", Target{KindFCM, "tok en"}, false, false},
		{"fcm del", Target{KindFCM, "tok\x7f"}, false, false},
		{"fcm non-ascii", Target{KindFCM, "tokén"}, false, false},
		{"fcm empty", Target{KindFCM, ""}, false, false},
		{"unknown kind", Target{"sms", "+15550100"}, false, false},
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
				q.providers[KindUnifiedPush].(*unifiedPush).dialer.afterCheck = func(ap netip.AddrPort) error {
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
