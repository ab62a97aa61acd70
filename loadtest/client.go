package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/flamenet/relay/client"
)

// The tester speaks the protocol through the client package, one request
// per call (Register, SendOnce, Poll, Ack): its own retries and counting
// stay here, so that every figure counts requests, not the client's
// retries.

// codec is the client codec -codec names.
func codec(name string) client.Codec {
	if name == "msgpack" {
		return client.MessagePack
	}
	return client.JSON
}

// retryable reports whether a careful client sends the same request again:
// no answer came (the relay may or may not have done it), or a 503 said to
// come back. Every other answer is definitive.
func retryable(err error) bool {
	var e *client.Error
	if errors.As(err, &e) {
		return e.Status == http.StatusServiceUnavailable
	}
	return err != nil
}

// turnedAway reports whether the relay turned the request away by admission
// (429 or 503), which a client retries later rather than counts as a fault.
func turnedAway(e *client.Error) bool {
	return e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable
}

// kind names the relay's answer for counting: "<status> <code>", and the
// limit that refused it in parentheses when the relay names one.
func kind(e *client.Error) string {
	k := strconv.Itoa(e.Status)
	if e.Code != "" {
		k += " " + e.Code
	}
	if e.Limit != "" {
		k += " (" + e.Limit + ")"
	}
	return k
}

// errKind names a request error for counting.
func errKind(op string, err error) string {
	var e *client.Error
	if errors.As(err, &e) {
		return op + " " + kind(e)
	}
	if errors.Is(err, client.ErrStreamCut) {
		return op + " cut"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return op + " timeout"
	}
	return op + " transport"
}

// newTransport gives every held poll and every in-flight send its own
// connection: conns is their sum plus slack. With sources above 1 the
// connections are spread over that many loopback source addresses
// (127.0.0.1, .2, ...), each with its own ephemeral ports.
func newTransport(conns, sources int) *http.Transport {
	return &http.Transport{
		Proxy:               nil, // loopback targets; an environment proxy would skew every figure
		DialContext:         sourceDialer(sources),
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
}

// sourceDialer dials from the loopback source addresses round-robin.
func sourceDialer(sources int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	base := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if sources <= 1 {
		return base.DialContext
	}
	var next atomic.Uint32
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := base
		d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+next.Add(1)%uint32(sources)))}
		return d.DialContext(ctx, network, addr)
	}
}
