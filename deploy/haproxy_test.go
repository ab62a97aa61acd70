package deploy

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// deploy/haproxy.cfg, the load balancer of compose.replicas.yaml.

// haproxySections maps "kind name" ("defaults ", "backend relays") to the
// section's lines.
func haproxySections(src string) (map[string][]string, []string) {
	sections := map[string][]string{}
	var order []string
	var cur string
	for line := range strings.Lines(src) {
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "global", "defaults", "frontend", "backend", "listen", "resolvers":
			name := ""
			if len(fields) > 1 {
				name = fields[1]
			}
			cur = fields[0] + " " + name
			order = append(order, cur)
			continue
		}
		sections[cur] = append(sections[cur], strings.Join(fields, " "))
	}
	return sections, order
}

// haproxyTime parses an HAProxy time: a number with an optional unit,
// milliseconds by default.
func haproxyTime(v string) (time.Duration, error) {
	i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	num, unit := v, "ms"
	if i >= 0 {
		num, unit = v[:i], v[i:]
	}
	n, err := strconv.Atoi(num)
	if err != nil {
		return 0, err
	}
	d := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour}[unit]
	if d == 0 {
		return 0, fmt.Errorf("unknown unit %q", unit)
	}
	return time.Duration(n) * d, nil
}

func checkHAProxy(src string, upstreams, published []string, maxWait time.Duration, p *problems) {
	sections, order := haproxySections(src)
	var frontends, backends []string
	for _, s := range order {
		switch {
		case strings.HasPrefix(s, "frontend "), strings.HasPrefix(s, "listen "):
			frontends = append(frontends, s)
		case strings.HasPrefix(s, "backend "):
			backends = append(backends, s)
		}
	}
	if len(backends) != 1 || len(frontends) != 1 {
		p.add("%s: %d frontends and %d backends, want one of each", haproxyCfg, len(frontends), len(backends))
		return
	}
	// A setting in the section wins over the defaults section.
	lookup := func(section, prefix string) []string {
		var out []string
		for _, sec := range []string{"defaults ", section} {
			for _, l := range sections[sec] {
				if strings.HasPrefix(l, prefix) {
					out = append(out, l)
				}
			}
		}
		return out
	}
	margin := 10 * time.Second
	for _, t := range []struct{ section, name string }{{backends[0], "timeout server"}, {frontends[0], "timeout client"}} {
		lines := lookup(t.section, t.name+" ")
		if len(lines) == 0 {
			p.add("%s: no %s; want one above the longest poll wait (%v) plus %v", haproxyCfg, t.name, maxWait, margin)
			continue
		}
		d, err := haproxyTime(strings.Fields(lines[len(lines)-1])[2])
		if err != nil || d < maxWait+margin {
			p.add("%s: %q, want at least %v: a held poll is silent for up to FN_MAX_WAIT_SECS (%v)", haproxyCfg, lines[len(lines)-1], maxWait+margin, maxWait)
		}
	}
	for _, l := range slices.Compact(slices.Sorted(slices.Values(append(lookup(backends[0], "option "), lookup(frontends[0], "option ")...)))) {
		switch l {
		case "option httpclose", "option http-server-close", "option forceclose", "option http-buffer-response":
			p.add("%s: %q; want HTTP/1.1 keep-alive to the relays and unbuffered responses", haproxyCfg, l)
		}
	}

	var servers []string
	var checked bool
	for _, l := range sections[backends[0]] {
		f := strings.Fields(l)
		switch {
		case f[0] == "server" && len(f) >= 3:
			servers = append(servers, f[2])
		case l == "option httpchk GET /ready", strings.HasPrefix(l, "http-check send") && slices.Contains(f, "/ready"):
			checked = true
		}
	}
	if !checked {
		p.add("%s: the backend does not check /ready, so a draining relay stays in rotation", haproxyCfg)
	}
	slices.Sort(servers)
	if !slices.Equal(servers, upstreams) {
		p.add("%s: servers %q, want the relay services %q", haproxyCfg, servers, upstreams)
	}
	var bound bool
	for _, l := range sections[frontends[0]] {
		if f := strings.Fields(l); f[0] == "bind" && len(f) > 1 {
			_, port, _ := net.SplitHostPort(f[1])
			bound = bound || slices.Contains(published, port)
		}
	}
	if !bound {
		p.add("%s: the frontend binds no port that compose publishes (%q)", haproxyCfg, published)
	}
}
