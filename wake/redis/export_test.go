package redis

import "github.com/flamenet/relay/device"

// SetHooks sets the hub's test hooks: beforeSubscribe runs on the session
// before it sends the subscriptions wanted since it opened, holdWaits when
// a Subscribe starts waiting for its confirmation. Set before use.
func SetHooks(h *Hub, beforeSubscribe func(), holdWaits func(device.Key)) {
	h.hooks = hooks{beforeSubscribe: beforeSubscribe, holdWaits: holdWaits}
}

// PresencePayload is relay from's message that it holds k since the time
// given (unix nanos).
func PresencePayload(from [8]byte, k device.Key, since int64) string {
	return string(appendPresence(header(kindPresence, instanceID(from)), k, since))
}
