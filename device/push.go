package device

// Push target kinds, as in docs/PROTOCOL.md.
const (
	PushNone        = "none"
	PushUnifiedPush = "unifiedpush"
	PushAPNs        = "apns"
	PushFCM         = "fcm"
	PushWebPush     = "webpush"
)

// PushTarget is where a content-free wake for a device goes. The zero value
// (or Kind PushNone) means no push.
type PushTarget struct {
	Kind string // PushNone, PushUnifiedPush, PushAPNs, PushFCM or PushWebPush
	// Address is the endpoint URL, the APNs device token or the FCM
	// registration token; for Web Push (and UnifiedPush with keys) the
	// endpoint, its p256dh and its auth, one per line (push.WebPushAddress).
	Address string
}

// Empty reports whether the target sends nothing.
func (p PushTarget) Empty() bool { return p.Kind == "" || p.Kind == PushNone }
