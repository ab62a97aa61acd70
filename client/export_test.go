package client

import "time"

// SetStreamTimeouts sets how long a stream's first event and its silences
// may take, until the test ends.
func SetStreamTimeouts(ready, idle time.Duration) (restore func()) {
	r, i := streamReadyTimeout, streamIdleTimeout
	streamReadyTimeout, streamIdleTimeout = ready, idle
	return func() { streamReadyTimeout, streamIdleTimeout = r, i }
}
