package device

// Push target kinds, as in docs/PROTOCOL.md.
const (
	PushNone        = "none"
	PushUnifiedPush = "unifiedpush"
	PushAPNs        = "apns"
	PushFCM         = "fcm"
)

// PushTarget is where a content-free wake for a device goes. The zero value
// (or Kind PushNone) means no push.
type PushTarget struct {
	Kind    string // PushNone, PushUnifiedPush, PushAPNs or PushFCM
	Address string // endpoint URL, APNs device token or FCM registration token
}

// Empty reports whether the target sends nothing.
func (p PushTarget) Empty() bool { return p.Kind == "" || p.Kind == PushNone }
