package push

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flamenet/relay/device"
)

// Resolver looks up a host's addresses; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

const (
	maxEndpointLen  = 2048
	maxAPNsTokenLen = 200 // hex digits
	maxTokenLen     = 4096
)

// CheckTarget is the register-time check of a push target. It runs the
// very checks the providers run before each send (and the address rule the
// UnifiedPush dialer applies), so a target it accepts is never refused by
// a worker for its form, and one a worker would refuse is refused here:
//
//   - UnifiedPush: CheckEndpoint.
//   - APNs: 1 to 100 bytes as an even number of hex digits.
//   - FCM: 1 to 4096 bytes of printable ASCII, no space.
//   - Kind "none" (or empty) with no address is valid; any other kind is not.
//
// Whether the kind's provider is configured is Queue.Enabled's question.
// Queue.CheckTarget is the same check with the queue's own settings.
func CheckTarget(ctx context.Context, t device.PushTarget, allowPrivate bool) error {
	return checkTarget(ctx, t, allowPrivate, net.DefaultResolver)
}

func checkTarget(ctx context.Context, t device.PushTarget, allowPrivate bool, r Resolver) error {
	switch t.Kind {
	case "", device.PushNone:
		if t.Address != "" {
			return fmt.Errorf("%w: kind %q takes no address", ErrInvalidTarget, t.Kind)
		}
		return nil
	case device.PushUnifiedPush:
		if hasKeys(t.Address) {
			return checkWebPush(ctx, t.Address, allowPrivate, r)
		}
		return checkEndpoint(ctx, t.Address, allowPrivate, r)
	case device.PushWebPush:
		return checkWebPush(ctx, t.Address, allowPrivate, r)
	case device.PushAPNs:
		return checkAPNsToken(strings.TrimPrefix(t.Address, APNsAlertPrefix))
	case device.PushFCM:
		return checkFCMToken(t.Address)
	default:
		return fmt.Errorf("%w: unknown kind %q", ErrInvalidTarget, t.Kind)
	}
}

// CheckEndpoint is the register-time check of a UnifiedPush endpoint: an
// http or https URL of printable ASCII with a host name or address and no
// userinfo, whose host resolves, and (unless allowPrivate) only to public
// addresses. The same rules run again at send time, the address rule on
// the address actually dialled, so a DNS answer that changes later cannot
// reach an internal service.
func CheckEndpoint(ctx context.Context, rawURL string, allowPrivate bool) error {
	return checkEndpoint(ctx, rawURL, allowPrivate, net.DefaultResolver)
}

func checkEndpoint(ctx context.Context, rawURL string, allowPrivate bool, r Resolver) error {
	u, err := parseEndpoint(rawURL)
	if err != nil {
		return err
	}
	_, err = resolveHost(ctx, r, u.Hostname(), allowPrivate)
	return err
}

// parseEndpoint is the form check of an endpoint, run at register and
// before every send. Its errors never quote the URL.
func parseEndpoint(rawURL string) (*url.URL, error) {
	if len(rawURL) > maxEndpointLen {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrInvalidEndpoint, maxEndpointLen)
	}
	// A URI is ASCII; a space or a control byte is someone's mistake or
	// someone's trick.
	if i := strings.IndexFunc(rawURL, func(r rune) bool { return r <= ' ' || r >= 0x7f }); i >= 0 {
		return nil, fmt.Errorf("%w: byte %d is not printable ASCII", ErrInvalidEndpoint, i)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidEndpoint, stripURL(err))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: scheme %q is not http or https", ErrInvalidEndpoint, u.Scheme)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: userinfo is not allowed", ErrInvalidEndpoint)
	}
	host := u.Hostname()
	if u.Opaque != "" || host == "" {
		return nil, fmt.Errorf("%w: no host", ErrInvalidEndpoint)
	}
	// A host is an address or an ASCII name; %-escapes in the host
	// (which url.Parse decodes) would send the resolver elsewhere than
	// the URL shows.
	if _, err := netip.ParseAddr(host); err != nil && strings.IndexFunc(host, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-' || r == '.' || r == '_')
	}) >= 0 {
		return nil, fmt.Errorf("%w: host is not a name or an address", ErrInvalidEndpoint)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%w: bad port %q", ErrInvalidEndpoint, p)
		}
	}
	return u, nil
}

// resolveHost resolves host (or parses it as an address). Unless
// allowPrivate it refuses the lot if any address is not public: a mixed
// answer is someone's trick. Register time and the dialer both use it.
func resolveHost(ctx context.Context, r Resolver, host string, allowPrivate bool) ([]netip.Addr, error) {
	if allowPrivate {
		return resolve(ctx, r, host)
	}
	return resolveAllowed(ctx, r, host)
}

func resolve(ctx context.Context, r Resolver, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("%w: resolve %q: %w", ErrInvalidEndpoint, host, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: %q has no address", ErrInvalidEndpoint, host)
	}
	return addrs, nil
}

// resolveAllowed is resolve that refuses any answer with an address that
// is not public.
func resolveAllowed(ctx context.Context, r Resolver, host string) ([]netip.Addr, error) {
	addrs, err := resolve(ctx, r, host)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if !publicAddr(a) {
			return nil, fmt.Errorf("%w: %s", ErrForbiddenAddress, a)
		}
	}
	return addrs, nil
}

// Ranges that are neither covered by netip's predicates nor public.
var internalPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),      // "this network": 0.0.0.0 reaches the local host
	netip.MustParsePrefix("100.64.0.0/10"),  // shared address space (carrier-grade NAT)
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, and broadcast
	netip.MustParsePrefix("100::/64"),       // discard-only
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64
	netip.MustParsePrefix("fec0::/10"),      // deprecated site-local
}

// Prefixes of IPv6 forms that carry an IPv4 address a router would reach.
var (
	nat64Prefix = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour   = netip.MustParsePrefix("2002::/16")
	compatV4    = netip.MustParsePrefix("::/96")
)

// publicAddr reports whether a push may connect to a: not loopback,
// private, link-local, unspecified, multicast or otherwise internal,
// also when a is an IPv6 form wrapping such an IPv4 address.
func publicAddr(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	if !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsUnspecified() ||
		a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() {
		return false
	}
	for _, p := range internalPrefixes {
		if p.Contains(a) {
			return false
		}
	}
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64Prefix.Contains(a), compatV4.Contains(a):
			return publicAddr(netip.AddrFrom4([4]byte(b[12:16])))
		case sixToFour.Contains(a):
			return publicAddr(netip.AddrFrom4([4]byte(b[2:6])))
		}
	}
	return true
}

// guardedDialer connects only to allowed addresses. It resolves the host
// itself and checks every address, and its net.Dialer checks again, in
// Control, the address the socket is about to connect to: that is the
// check no DNS answer or redirect can get around.
type guardedDialer struct {
	resolver     Resolver
	allowPrivate bool
	dialer       net.Dialer
	// afterCheck, when set (tests only), sees each address that passed
	// the check just before connect and may refuse it.
	afterCheck func(netip.AddrPort) error
}

func newGuardedDialer(r Resolver, allowPrivate bool) *guardedDialer {
	if r == nil {
		r = net.DefaultResolver
	}
	d := &guardedDialer{resolver: r, allowPrivate: allowPrivate}
	d.dialer = net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: d.control}
	return d
}

// control runs after the socket is made and before it connects.
func (d *guardedDialer) control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: unparsable %q", ErrForbiddenAddress, address)
	}
	if !d.allowPrivate && !publicAddr(ap.Addr()) {
		return fmt.Errorf("%w: %s", ErrForbiddenAddress, ap.Addr())
	}
	if d.afterCheck != nil {
		return d.afterCheck(ap)
	}
	return nil
}

func (d *guardedDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidEndpoint, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("%w: bad port %q", ErrInvalidEndpoint, portStr)
	}
	addrs, err := resolveHost(ctx, d.resolver, host, d.allowPrivate)
	if err != nil {
		return nil, err
	}
	var firstErr error
	for _, a := range addrs {
		c, err := d.dialer.DialContext(ctx, network, netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	if firstErr == nil {
		firstErr = fmt.Errorf("%w: %q has no address", ErrInvalidEndpoint, host)
	}
	return nil, firstErr
}

// checkAPNsToken is the form of an APNs device token, run at register and
// before every send. Tokens are 32 bytes today; Apple says they may grow,
// so up to 100 bytes are taken.
func checkAPNsToken(tok string) error {
	if tok == "" || len(tok) > maxAPNsTokenLen || len(tok)%2 != 0 {
		return fmt.Errorf("%w: an APNs device token is an even number of hex digits, at most %d", ErrInvalidTarget, maxAPNsTokenLen)
	}
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return fmt.Errorf("%w: an APNs device token is hex", ErrInvalidTarget)
		}
	}
	return nil
}

// checkFCMToken is the form of an FCM registration token, run at register
// and before every send: printable ASCII without spaces, so that it cannot
// carry a control byte into a request or a log.
func checkFCMToken(tok string) error {
	if tok == "" || len(tok) > maxTokenLen {
		return fmt.Errorf("%w: an FCM registration token is 1 to %d bytes", ErrInvalidTarget, maxTokenLen)
	}
	if strings.IndexFunc(tok, func(r rune) bool { return r <= ' ' || r >= 0x7f }) >= 0 {
		return fmt.Errorf("%w: an FCM registration token is printable ASCII", ErrInvalidTarget)
	}
	return nil
}
