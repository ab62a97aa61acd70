package deploy

import (
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// compose.yaml and compose.replicas.yaml, decoded as compose reads them
// (anchors and both forms of environment, ulimits and depends_on).

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image           string            `yaml:"image"`
	Build           composeBuild      `yaml:"build"`
	Environment     composeEnv        `yaml:"environment"`
	Ports           []string          `yaml:"ports"`
	Ulimits         map[string]ulimit `yaml:"ulimits"`
	Healthcheck     *healthcheck      `yaml:"healthcheck"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
	DependsOn       composeDependsOn  `yaml:"depends_on"`
	Command         stringList        `yaml:"command"`
	Volumes         []string          `yaml:"volumes"`
}

type composeBuild struct{ Context, Dockerfile string }

func (b *composeBuild) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		b.Context = n.Value
		return nil
	}
	var m struct{ Context, Dockerfile string }
	err := n.Decode(&m)
	*b = composeBuild(m)
	return err
}

// composeEnv takes both forms compose allows: a map or a list of K=V.
type composeEnv map[string]string

func (e *composeEnv) UnmarshalYAML(n *yaml.Node) error {
	*e = composeEnv{}
	if n.Kind == yaml.SequenceNode {
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		for _, kv := range list {
			k, v, _ := strings.Cut(kv, "=")
			(*e)[k] = v
		}
		return nil
	}
	var m map[string]string
	err := n.Decode(&m)
	maps.Copy(*e, m)
	return err
}

// ulimit takes both forms: a single number or soft and hard.
type ulimit struct{ Soft, Hard int }

func (u *ulimit) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		v, err := strconv.Atoi(n.Value)
		*u = ulimit{v, v}
		return err
	}
	var m struct{ Soft, Hard int }
	err := n.Decode(&m)
	*u = ulimit(m)
	return err
}

type healthcheck struct {
	Test stringList `yaml:"test"`
}

// stringList takes a string or a list of strings.
type stringList []string

func (s *stringList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*s = stringList{n.Value}
		return nil
	}
	var l []string
	err := n.Decode(&l)
	*s = l
	return err
}

// composeDependsOn maps a service to its condition; the list form means
// service_started.
type composeDependsOn map[string]string

func (d *composeDependsOn) UnmarshalYAML(n *yaml.Node) error {
	*d = composeDependsOn{}
	if n.Kind == yaml.SequenceNode {
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		for _, s := range l {
			(*d)[s] = "service_started"
		}
		return nil
	}
	var m map[string]struct{ Condition string }
	if err := n.Decode(&m); err != nil {
		return err
	}
	for k, v := range m {
		if v.Condition == "" {
			v.Condition = "service_started"
		}
		(*d)[k] = v.Condition
	}
	return nil
}

func parseCompose(name, src string, p *problems) (composeFile, bool) {
	var cf composeFile
	if err := yaml.Unmarshal([]byte(src), &cf); err != nil {
		p.add("%s: %v", name, err)
		return cf, false
	}
	return cf, true
}

// relayServices are the services built from the repository's Dockerfile.
func relayServices(cf composeFile) []string {
	var names []string
	for name, svc := range cf.Services {
		if svc.Build.Context != "" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// checkRelayService checks what every relay service of either compose file
// needs.
func checkRelayService(file, name string, cf composeFile, f files, s settings, p *problems) {
	svc := cf.Services[name]
	env := map[string]string(svc.Environment)
	where := file + ": " + name

	if ctx := strings.TrimSuffix(svc.Build.Context, "/"); ctx != "." || (svc.Build.Dockerfile != "" && svc.Build.Dockerfile != dockerfile) {
		p.add("%s: build %+v, want context . and the repository's Dockerfile", where, svc.Build)
	}
	nofile, ok := svc.Ulimits["nofile"]
	if !ok || nofile.Soft < minNofile || nofile.Hard < minNofile {
		p.add("%s: ulimits nofile %+v, want soft and hard at least %d (a held poll is an open file)", where, nofile, minNofile)
	}

	if host, _, _ := net.SplitHostPort(env["FN_LISTEN"]); host != "0.0.0.0" {
		p.add("%s: FN_LISTEN=%q, want 0.0.0.0:PORT so other containers reach it", where, env["FN_LISTEN"])
	}
	port := s.listenPort(env)
	checkProbe(where, svc.Healthcheck, entrypoint(f), port, p)

	grace, err := s.grace(env)
	if err != nil {
		p.add("%s: FN_SHUTDOWN_GRACE: %v", where, err)
	}
	stop, err := time.ParseDuration(svc.StopGracePeriod)
	if err != nil || stop < grace+drainMargin {
		p.add("%s: stop_grace_period %q, want at least FN_SHUTDOWN_GRACE (%v) + %v so the drain finishes before SIGKILL", where, svc.StopGracePeriod, grace, drainMargin)
	}

	if !strings.HasPrefix(env["FN_ISSUER_KEYS"], "${FN_ISSUER_KEYS:?") {
		p.add("%s: FN_ISSUER_KEYS=%q, want ${FN_ISSUER_KEYS:?...} so compose refuses to start without it", where, env["FN_ISSUER_KEYS"])
	}

	db, err := url.Parse(interpolate(env["FN_DATABASE_URL"]))
	if err != nil || db.Scheme != "postgres" {
		p.add("%s: FN_DATABASE_URL=%q, want postgres://", where, env["FN_DATABASE_URL"])
	} else {
		checkDependency(where, "FN_DATABASE_URL", cf, svc, db.Hostname(), "postgres:17", p)
	}
	checkLoopbackPorts(where, svc, p)
}

// interpolate stands in for compose's variable substitution: a
// ${VAR:-default} becomes its default, any other ${...} a placeholder.
func interpolate(v string) string {
	re := regexp.MustCompile(`\$\{[A-Za-z0-9_]+(:?-)?([^}]*)\}`)
	return re.ReplaceAllStringFunc(v, func(m string) string {
		if sub := re.FindStringSubmatch(m); sub[1] != "" {
			return sub[2]
		}
		return "x"
	})
}

// checkProbe checks a compose health check: the image's own binary probing
// /ready on the API port.
func checkProbe(where string, hc *healthcheck, ep []string, port string, p *problems) {
	if hc == nil || len(hc.Test) == 0 {
		p.add("%s: no healthcheck, want one on /ready", where)
		return
	}
	test := []string(hc.Test)
	if test[0] != "CMD" || len(test) != 4 || len(ep) == 0 || test[1] != ep[0] || test[2] != "probe" {
		p.add("%s: healthcheck %q, want [CMD, <the Dockerfile's ENTRYPOINT %q>, probe, URL] (the image has no shell)", where, test, ep)
		return
	}
	u, err := url.Parse(test[3])
	if err != nil || u.Path != "/ready" {
		p.add("%s: healthcheck probes %q, want /ready", where, test[3])
		return
	}
	if u.Port() != port || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost") {
		p.add("%s: healthcheck probes %s, want 127.0.0.1 on the port FN_LISTEN uses (%s)", where, u.Host, port)
	}
}

// checkDependency checks that the setting of svc names host, a service
// of the image want, which has a health check and which svc waits for.
func checkDependency(where, setting string, cf composeFile, svc composeService, host, want string, p *problems) {
	dep, ok := cf.Services[host]
	if !ok {
		p.add("%s: %s names host %q, which is no service of the file", where, setting, host)
		return
	}
	if dep.Image != want {
		p.add("%s: service %s is %q, want %s", where, host, dep.Image, want)
	}
	if dep.Healthcheck == nil || len(dep.Healthcheck.Test) == 0 {
		p.add("%s: service %s has no healthcheck", where, host)
	}
	if svc.DependsOn[host] != "service_healthy" {
		p.add("%s: depends_on %s is %q, want condition service_healthy", where, host, svc.DependsOn[host])
	}
}

// checkLoopbackPorts wants every published port bound to 127.0.0.1.
func checkLoopbackPorts(where string, svc composeService, p *problems) {
	for _, port := range svc.Ports {
		if !strings.HasPrefix(port, "127.0.0.1:") {
			p.add("%s: port %q is published on every interface, want 127.0.0.1:HOST:CONTAINER", where, port)
		}
	}
}

func checkPostgres(file string, cf composeFile, p *problems) {
	for name, svc := range cf.Services {
		if !strings.HasPrefix(svc.Image, "postgres") {
			continue
		}
		if svc.Healthcheck == nil || !slices.Contains(svc.Healthcheck.Test, "pg_isready") {
			p.add("%s: %s: healthcheck %v, want pg_isready", file, name, svc.Healthcheck)
		}
		var named bool
		for _, v := range svc.Volumes {
			src, dst, _ := strings.Cut(v, ":")
			if _, ok := cf.Volumes[src]; ok && strings.HasPrefix(dst, "/var/lib/postgresql/data") {
				named = true
			}
		}
		if !named {
			p.add("%s: %s: want a named volume (declared under volumes:) on /var/lib/postgresql/data", file, name)
		}
	}
}

func checkComposeSingle(f files, s settings, p *problems) {
	cf, ok := parseCompose(composeSingle, f[composeSingle], p)
	if !ok {
		return
	}
	relays := relayServices(cf)
	if len(relays) != 1 {
		p.add("%s: %d services built from the Dockerfile, want one relay", composeSingle, len(relays))
		return
	}
	checkRelayService(composeSingle, relays[0], cf, f, s, p)
	svc := cf.Services[relays[0]]
	port := s.listenPort(svc.Environment)
	if !slices.ContainsFunc(svc.Ports, func(p string) bool { return strings.HasSuffix(p, ":"+port) }) {
		p.add("%s: %s: ports %q do not publish the API port %s", composeSingle, relays[0], svc.Ports, port)
	}
	checkPostgres(composeSingle, cf, p)
}

func checkComposeFleet(f files, s settings, p *problems) {
	cf, ok := parseCompose(composeFleet, f[composeFleet], p)
	if !ok {
		return
	}
	relays := relayServices(cf)
	if len(relays) < 2 {
		p.add("%s: %d services built from the Dockerfile, want two relays or more", composeFleet, len(relays))
		if len(relays) == 0 {
			return
		}
	}
	first := cf.Services[relays[0]].Environment
	for _, name := range relays {
		checkRelayService(composeFleet, name, cf, f, s, p)
		svc := cf.Services[name]
		env := svc.Environment
		where := composeFleet + ": " + name
		if env["FN_RELAY_REPLICAS"] != strconv.Itoa(len(relays)) {
			p.add("%s: FN_RELAY_REPLICAS=%q, want %d, the number of relay services", where, env["FN_RELAY_REPLICAS"], len(relays))
		}
		if r, err := url.Parse(interpolate(env["FN_REDIS_URL"])); err != nil || r.Scheme != "redis" {
			p.add("%s: FN_REDIS_URL=%q, want redis:// (wake-ups across replicas)", where, env["FN_REDIS_URL"])
		} else {
			checkDependency(where, "FN_REDIS_URL", cf, svc, r.Hostname(), "redis:7", p)
		}
		for _, k := range []string{"FN_ISSUER_KEYS", "FN_DATABASE_URL", "FN_REDIS_URL"} {
			if env[k] != first[k] {
				p.add("%s: %s differs from %s's; every replica must share it", where, k, relays[0])
			}
		}
	}
	checkPostgres(composeFleet, cf, p)
	for name, svc := range cf.Services {
		if strings.HasPrefix(svc.Image, "redis") && (!hasOption(svc.Command, "--save", "") || !hasOption(svc.Command, "--appendonly", "no")) {
			p.add("%s: %s: command %q, want --save \"\" --appendonly no (wake-ups are hints; no persistence)", composeFleet, name, svc.Command)
		}
	}

	// The load balancer: HAProxy with deploy/haproxy.cfg, started once the
	// relays are ready.
	var lb string
	for name, svc := range cf.Services {
		if strings.HasPrefix(svc.Image, "haproxy:") {
			lb = name
		}
	}
	if lb == "" {
		p.add("%s: no haproxy service in front of the relays", composeFleet)
		return
	}
	svc := cf.Services[lb]
	where := composeFleet + ": " + lb
	if !slices.ContainsFunc(svc.Volumes, func(v string) bool {
		return strings.HasPrefix(v, "./"+haproxyCfg+":/usr/local/etc/haproxy/haproxy.cfg")
	}) {
		p.add("%s: volumes %q do not mount ./%s as the haproxy.cfg", where, svc.Volumes, haproxyCfg)
	}
	for _, r := range relays {
		if svc.DependsOn[r] != "service_healthy" {
			p.add("%s: depends_on %s is %q, want service_healthy", where, r, svc.DependsOn[r])
		}
	}
	checkLoopbackPorts(where, svc, p)
	if nofile := svc.Ulimits["nofile"]; nofile.Hard < 2*minNofile {
		p.add("%s: ulimits nofile %+v, want at least %d: each connection is two files in the proxy", where, nofile, 2*minNofile)
	}

	env := cf.Services[relays[0]].Environment
	maxWait, err := s.maxWait(env)
	if err != nil {
		p.add("%s: FN_MAX_WAIT_SECS: %v", composeFleet, err)
	}
	var upstreams []string
	for _, r := range relays {
		upstreams = append(upstreams, r+":"+s.listenPort(cf.Services[r].Environment))
	}
	var published []string
	for _, port := range svc.Ports {
		published = append(published, port[strings.LastIndex(port, ":")+1:])
	}
	checkHAProxy(f[haproxyCfg], upstreams, published, maxWait, p)
}

// hasOption reports whether args hold name followed by value.
func hasOption(args []string, name, value string) bool {
	i := slices.Index(args, name)
	return i >= 0 && i+1 < len(args) && args[i+1] == value
}
