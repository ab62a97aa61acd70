package driver

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/flamenet/relay/client"
)

// codec is the client codec -codec names.
func codec(name string) client.Codec {
	if name == "msgpack" {
		return client.MessagePack
	}
	return client.JSON
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
