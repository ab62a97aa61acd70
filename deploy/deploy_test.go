package deploy

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"go/version"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/internal/servicetest"
)

// The tool tests run haproxy and systemd-analyze; nothing may outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	minNofile   = 65536           // a held poll is an open file
	drainMargin = 5 * time.Second // after the grace the relay still closes its store
	waitMargin  = 10 * time.Second
	one, fleet  = "compose.yaml", "deploy/compose.replicas.yaml"
	ha          = "deploy/compose.ha.yaml" // the fleet on a highly available Postgres
	unit, hap   = "deploy/relay.service", "deploy/haproxy.cfg"
	kube        = "deploy/kubernetes" // kind -> manifest
)

// tree is every deployment file parsed into maps and lists: YAML as it
// decodes, the others by sections(). The checks read these, never the
// text, so a reformatted file checks the same.
type tree map[string]any

func load(tb testing.TB) tree {
	read := func(path string) string {
		b, err := os.ReadFile(filepath.Join("..", path))
		if err != nil {
			tb.Fatal(err)
		}
		return string(b)
	}
	t, kinds := tree{}, map[string]any{}
	manifests, _ := filepath.Glob("../" + kube + "/*.yaml")
	for _, f := range append([]string{one, fleet, ha}, manifests...) {
		dec := yaml.NewDecoder(strings.NewReader(read(strings.TrimPrefix(f, "../"))))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				tb.Fatalf("%s: %v", f, err)
			}
			t[f], kinds[str(doc["kind"])] = doc, doc
		}
	}
	t[kube] = kinds
	never := func(string) bool { return false }
	t[unit] = sections(read(unit), "#;", "=", func(l string) bool { return l[0] == '[' })
	t[hap] = sections(read(hap), "#", " ", func(l string) bool { return l[0] != ' ' && l[0] != '\t' })
	t["Dockerfile"] = sections(strings.ReplaceAll(read("Dockerfile"), "\\\n", " "), "#", " ", never)[""]
	t[".dockerignore"] = sections(read(".dockerignore"), "#", "\x00", never)[""]
	t["go.mod"] = regexp.MustCompile(`(?m)^go (\S+)`).FindStringSubmatch(read("go.mod"))[1]
	loadProxySamples(t, read)
	return t
}

// sections reads a line-based file: header lines open sections ("" before
// the first), other lines are key and value split at sep, each key's values
// a list in file order (a unit's Environment=, HAProxy's timeouts).
func sections(text, comment, sep string, header func(string) bool) map[string]any {
	cur := map[string]any{}
	out := map[string]any{"": cur}
	for _, raw := range strings.Split(text, "\n") {
		l := strings.Join(strings.Fields(raw), " ")
		if l == "" || strings.ContainsAny(l[:1], comment) {
			continue
		} else if header(raw) {
			cur = map[string]any{}
			out[strings.Trim(l, "[]")] = cur
		} else {
			k, v, _ := strings.Cut(l, sep)
			cur[k] = append(orList(cur[k]), v)
		}
	}
	return out
}

// get walks a file's tree by a dotted path: map keys, list indexes, or
// name=X for the list element whose name is X. nil where the path ends.
func (t tree) get(file, path string) any {
	v := t[file]
	for _, p := range strings.Split(path, ".") {
		l := orList(v)
		i, err := strconv.Atoi(p)
		if name, ok := strings.CutPrefix(p, "name="); ok {
			i, err = slices.IndexFunc(l, func(e any) bool { return str(dig(e, "name")) == name }), nil
		}
		if v = dig(v, p); err == nil && i >= 0 && i < len(l) {
			v = l[i]
		}
	}
	return v
}

// set replaces (nil: deletes) the value at a path whose parent is a map.
func (t tree) set(file, path string, v any) {
	i := strings.LastIndex(path, ".")
	m := orMap(t[file])
	if i >= 0 {
		m = orMap(t.get(file, path[:i]))
	}
	if m[path[i+1:]] = v; v == nil {
		delete(m, path[i+1:])
	}
}

func dig(v any, key string) any  { return orMap(v)[key] }
func orMap(v any) map[string]any { m, _ := v.(map[string]any); return m }
func orList(v any) []any         { l, _ := v.([]any); return l }

// str is a scalar as text, the last of a list of strings (a unit's key set
// twice, the final Dockerfile stage's USER), "" for nothing.
func str(v any) string {
	if l := strs(v); len(l) > 0 && !strings.HasPrefix(l[0], "{") {
		return l[len(l)-1]
	} else if s, ok := v.(string); ok || v == nil {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func strs(v any) (out []string) {
	for _, e := range orList(v) {
		out = append(out, str(e))
	}
	return out
}

// line is the rest of the first value in a list (HAProxy's) that starts
// with the word prefix; "" prefix: the first value.
func line(v any, prefix string) string {
	for _, s := range strs(v) {
		if rest, ok := strings.CutPrefix(s+" ", prefix+" "); ok || prefix == "" {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// duration reads "20s", "1m30s", or a bare number in unit; -1 for neither.
func duration(v string, unit time.Duration) time.Duration {
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(n * float64(unit))
	} else if d, err := time.ParseDuration(v); err == nil {
		return d
	}
	return -1
}

func number(v any) int {
	if n, err := strconv.Atoi(str(v)); err == nil {
		return n
	}
	return -1
}

// hardNofile is compose's ulimits.nofile (N, or soft and hard) or systemd's
// LimitNOFILE (N or SOFT:HARD): the hard limit, which the relay raises to.
func hardNofile(v any) int {
	if h := dig(v, "hard"); h != nil {
		return number(h)
	}
	return number(str(v)[strings.Index(str(v), ":")+1:])
}

// operatorKey stands in for the issuer keys an operator supplies: compose's
// required ${FN_ISSUER_KEYS:?} and the example Secret's CHANGE-ME.
var operatorKey = func() string {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	return base64.StdEncoding.EncodeToString(pub)
}()

var interpolation = regexp.MustCompile(`\$\{(\w+)(?::?([-?])([^}]*))?\}`)

// relays reads every environment the files give the relay, by place (the
// image, the unit, each compose relay service as "compose.yaml relay", and
// Kubernetes, which start from the image's ENV as container runtimes do),
// through the config package itself: each value by its setting's parser,
// then the whole configuration as the relay would load it.
func (t tree) relays(p *problems) map[string]config.Config {
	out := map[string]config.Config{}
	add := func(where string, env map[string]string) {
		for _, k := range slices.Sorted(maps.Keys(env)) {
			s, ok := config.Lookup(k)
			err := s.Check(env[k])
			p.when((ok || strings.HasPrefix(k, "FN_")) && err != nil, "%s: %s=%q: %v", where, k, env[k], err)
		}
		cfg, err := config.FromEnv(func(k string) string { return env[k] })
		p.when(err != nil, "%s: the relay would not start: %v", where, err)
		out[where] = cfg
	}
	assign := func(kvs []string) map[string]string {
		env := map[string]string{}
		for _, kv := range strings.Fields(strings.Join(kvs, " ")) {
			k, v, _ := strings.Cut(strings.Trim(kv, `"`), "=")
			env[k] = v
		}
		return env
	}
	image := assign(strs(t.get("Dockerfile", "ENV")))
	add("Dockerfile", image)
	add(unit, assign(strs(t.get(unit, "Service.Environment"))))
	for _, file := range []string{one, fleet, ha} {
		for _, name := range t.relayServices(file) {
			env := maps.Clone(image)
			for k, v := range orMap(t.get(file, "services."+name+".environment")) {
				env[k] = interpolation.ReplaceAllStringFunc(str(v), func(m string) string {
					g := interpolation.FindStringSubmatch(m)
					if g[1] == "FN_ISSUER_KEYS" {
						return operatorKey
					} else if g[2] == "?" {
						p.add("%s: %s needs %s, which the checks have no value for", file, k, g[1])
					}
					return g[3]
				})
			}
			add(file+" "+name, env)
		}
	}
	env := maps.Clone(image)
	for _, e := range orList(t.get(kube, "Deployment.spec.template.spec.containers.0.env")) {
		name, ref := str(dig(e, "name")), dig(dig(e, "valueFrom"), "secretKeyRef")
		if env[name] = str(dig(e, "value")); ref != nil {
			v, ok := t.get(kube, "Secret.stringData."+str(dig(ref, "key"))).(string)
			p.when(!ok || str(t.get(kube, "Secret.metadata.name")) != str(dig(ref, "name")), "%s: %s: the example Secret has no %s", kube, name, str(dig(ref, "key")))
			if env[name] = v; v == "CHANGE-ME" && name == "FN_ISSUER_KEYS" {
				env[name] = operatorKey
			}
		} else if name == "FN_ISSUER_KEYS" || name == "FN_DATABASE_URL" || name == "FN_REDIS_URL" {
			p.add("%s: %s is set in the manifest; it belongs in the Secret", kube, name)
		}
	}
	add(kube, env)
	return out
}

// relayServices are the compose services built from the relay's
// Dockerfile (compose.ha.yaml builds its Postgres from another).
func (t tree) relayServices(file string) (out []string) {
	for name, svc := range orMap(t.get(file, "services")) {
		if b := dig(svc, "build"); b != nil && inRoot(file, str(dig(b, "context"))) == "." {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// inRoot is a path named in a compose file, which compose reads from the
// file's own directory, as a path from the repository's root.
func inRoot(file, p string) string {
	return path.Join(path.Dir(file), p)
}

// balanced checks a fleet's load balancer: timeouts above the longest
// poll, every relay a server it waits for, haproxy.cfg mounted.
func (t tree) balanced(fleet string, r map[string]config.Config, p *problems) {
	for _, name := range t.relayServices(fleet) {
		rl := r[fleet+" "+name]
		for _, side := range []string{"client", "server"} {
			d := duration(line(t.get(hap, "defaults.timeout"), side), 1e6)
			p.when(d < rl.MaxWait+waitMargin, "%s: timeout %s %v, want above FN_MAX_WAIT_SECS (%v) plus %v", hap, side, d, rl.MaxWait, waitMargin)
		}
		if !slices.ContainsFunc(strs(t.get(hap, "backend relays.server")), func(s string) bool { return strings.Fields(s + " x")[1] == name+":"+port(rl) }) {
			p.add("%s: no server %s:%s for the relay service %s", hap, name, port(rl), name)
		}
		p.when(str(t.get(fleet, "services.lb.depends_on."+name+".condition")) != "service_healthy", "%s lb: does not wait for %s to be healthy", fleet, name)
	}
	if !slices.ContainsFunc(strs(t.get(fleet, "services.lb.volumes")), func(v string) bool { return inRoot(fleet, strings.Split(v, ":")[0]) == hap }) {
		p.add("%s lb: does not mount %s", fleet, hap)
	}
}

func port(cfg config.Config) string {
	_, p, _ := net.SplitHostPort(cfg.Listen)
	return p
}

// problems collects what the checks find, so one run reports all of them.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// when adds the problem if bad holds.
func (p *problems) when(bad bool, format string, args ...any) {
	if bad {
		p.add(format, args...)
	}
}

const pod, container = "Deployment.spec.template.spec", "Deployment.spec.template.spec.containers.0"

// checks look at the parsed files and the relays' configurations.
var checks = []func(t tree, r map[string]config.Config, p *problems){
	// The supervisor waits out the relay's drain before SIGKILL.
	func(t tree, r map[string]config.Config, p *problems) {
		for where, rl := range r {
			file, svc, _ := strings.Cut(where, " ")
			need, stop := rl.ShutdownGrace+drainMargin, duration(str(t.get(file, "services."+svc+".stop_grace_period")), 1e9)
			switch {
			case where == unit:
				stop = duration(str(t.get(unit, "Service.TimeoutStopSec")), 1e9)
			case where == kube:
				stop = duration(str(t.get(kube, pod+".terminationGracePeriodSeconds")), 1e9)
				need += duration(str(t.get(kube, container+".lifecycle.preStop.sleep.seconds")), 1e9)
			case where == "Dockerfile":
				continue
			}
			p.when(stop < need, "%s: the supervisor kills after %v (stop_grace_period, TimeoutStopSec, terminationGracePeriodSeconds), before the drain's %v", where, stop, need)
		}
		s := str(t.get(unit, "Service.KillSignal"))
		p.when(s != "SIGTERM" && s != "", "%s: KillSignal=%s; the relay drains on SIGTERM", unit, s)
	},
	// Held polls are open files; the proxy holds two per client.
	func(t tree, r map[string]config.Config, p *problems) {
		n := hardNofile(t.get(unit, "Service.LimitNOFILE"))
		p.when(n < minNofile, "%s: LimitNOFILE %d, want at least %d", unit, n, minNofile)
		for _, file := range []string{one, fleet, ha} {
			for _, svc := range t.relayServices(file) {
				n := hardNofile(t.get(file, "services."+svc+".ulimits.nofile"))
				p.when(n < minNofile, "%s %s: ulimits nofile %d, want at least %d", file, svc, n, minNofile)
			}
		}
		for _, file := range []string{fleet, ha} {
			n, m := hardNofile(t.get(file, "services.lb.ulimits.nofile")), number(line(t.get(hap, "global.maxconn"), ""))
			p.when(n < 2*m, "%s lb: ulimits nofile %d below twice HAProxy's maxconn %d", file, n, m)
		}
	},
	// Health checks ask the relay's own port: /ready for traffic, /live for restarts.
	func(t tree, r map[string]config.Config, p *problems) {
		want := func(rl config.Config) string {
			return strings.Join(append(execForm(str(t.get("Dockerfile", "ENTRYPOINT"))), "probe", "http://127.0.0.1:"+port(rl)+"/ready"), " ")
		}
		hc := str(t.get("Dockerfile", "HEALTHCHECK"))
		got := strings.Join(execForm(hc[strings.Index(hc, "CMD ")+4:]), " ")
		p.when(got != want(r["Dockerfile"]), "Dockerfile: HEALTHCHECK runs %q, want %q (ENTRYPOINT, FN_LISTEN's port, /ready)", got, want(r["Dockerfile"]))
		for where, rl := range r {
			if file, svc, ok := strings.Cut(where, " "); ok {
				test := strs(t.get(file, "services."+svc+".healthcheck.test"))
				p.when(strings.Join(test[min(1, len(test)):], " ") != want(rl), "%s: healthcheck runs %q, want %q (ENTRYPOINT, FN_LISTEN's port, /ready)", where, test, want(rl))
			}
		}
		for probe, path := range map[string]string{"readinessProbe": "/ready", "livenessProbe": "/live"} {
			get := t.get(kube, container+"."+probe+".httpGet")
			p.when(str(dig(get, "path")) != path || t.containerPort(dig(get, "port")) != port(r[kube]), "%s: %s asks %v on port %v, want %s on FN_LISTEN's port", kube, probe, dig(get, "path"), dig(get, "port"), path)
		}
		chk := line(t.get(hap, "backend relays.http-check"), "send")
		p.when(!strings.Contains(chk+" ", "uri /ready "), "%s: http-check send %q, want uri /ready", hap, chk)
	},
	// The load balancer: timeouts above the longest poll, every relay a server.
	func(t tree, r map[string]config.Config, p *problems) {
		for _, fleet := range []string{fleet, ha} {
			t.balanced(fleet, r, p)
		}
		for _, sec := range []string{"defaults", "backend relays"} {
			if slices.ContainsFunc(strs(t.get(hap, sec+".option")), func(o string) bool { return strings.HasSuffix(o, "close") }) {
				p.add("%s: %s closes connections to the relays; keep-alive saves a handshake per poll", hap, sec)
			}
		}
	},
	// Replica counts agree with FN_RELAY_REPLICAS; containers share Postgres.
	func(t tree, r map[string]config.Config, p *problems) {
		for where, rl := range r {
			file, _, ok := strings.Cut(where, " ")
			n := len(t.relayServices(file))
			if where == kube {
				n = number(t.get(kube, "Deployment.spec.replicas"))
			} else if !ok {
				continue
			}
			p.when(n != rl.RelayReplicas || rl.Database.Kind != config.Postgres, "%s: %d replicas on %s, FN_RELAY_REPLICAS says %d; want them equal, on postgres", where, n, rl.Database.Kind, rl.RelayReplicas)
		}
		p.when(number(t.get(kube, "PodDisruptionBudget.spec.maxUnavailable")) < 1 && number(t.get(kube, "PodDisruptionBudget.spec.minAvailable")) >= r[kube].RelayReplicas, "%s: the PodDisruptionBudget lets no relay be drained", kube)
	},
	// Kubernetes objects select the Deployment's pods and the relay's port.
	func(t tree, r map[string]config.Config, p *problems) {
		for _, sel := range []string{"Service.spec.selector", "PodDisruptionBudget.spec.selector.matchLabels", "Deployment.spec.selector.matchLabels"} {
			for k, v := range orMap(t.get(kube, sel)) {
				p.when(str(dig(t.get(kube, "Deployment.spec.template.metadata.labels"), k)) != str(v), "%s: %s %s=%v is not a label of the pods", kube, sel, k, v)
			}
			p.when(len(orMap(t.get(kube, sel))) == 0, "%s: %s selects nothing", kube, sel)
		}
		target := t.get(kube, "Service.spec.ports.0.targetPort")
		p.when(t.containerPort(target) != port(r[kube]), "%s: the Service targets %v, not FN_LISTEN's port", kube, target)
	},
	// Least privilege in every runtime.
	func(t tree, r map[string]config.Config, p *problems) {
		uid, _, _ := strings.Cut(str(t.get("Dockerfile", "USER")), ":")
		p.when(number(uid) < 1, "Dockerfile: USER %q, want a numeric non-root user", uid)
		for path, want := range map[string]string{pod + ".securityContext.runAsNonRoot": "true", container + ".securityContext.readOnlyRootFilesystem": "true",
			container + ".securityContext.allowPrivilegeEscalation": "false", container + ".securityContext.capabilities.drop": "ALL"} {
			got := str(t.get(kube, path))
			p.when(got != want, "%s: %s is %s, want %s", kube, path, got, want)
		}
		for _, file := range []string{one, fleet, ha} {
			for name, svc := range orMap(t.get(file, "services")) {
				for _, pub := range strs(dig(svc, "ports")) {
					p.when(!strings.HasPrefix(pub, "127.0.0.1:"), "%s %s: port %s is published beyond loopback", file, name, pub)
				}
			}
			for _, svc := range t.relayServices(file) {
				p.when(str(t.get(file, "services."+svc+".read_only")) != "true" || !slices.Contains(strs(t.get(file, "services."+svc+".cap_drop")), "ALL"), "%s %s: want read_only and cap_drop ALL", file, svc)
			}
		}
		p.when(str(t.get(unit, "Service.DynamicUser")) != "yes" && strings.TrimPrefix(str(t.get(unit, "Service.User")), "root") == "", "%s: runs as root; want DynamicUser=yes or a User", unit)
		for _, f := range strs(t.get(unit, "Service.SystemCallFilter")) {
			p.when(strings.HasPrefix(f, "~") && (strings.Contains(f, "@resources") || strings.Contains(f, "setrlimit")), "%s: SystemCallFilter=%s denies setrlimit, which raises the open-file limit", unit, f)
		}
	},
	// State lives where the runtime keeps it; builds are static and clean.
	func(t tree, r map[string]config.Config, p *problems) {
		for where, dir := range map[string]string{"Dockerfile": strings.Join(execForm(str(t.get("Dockerfile", "VOLUME"))), " "), unit: "/var/lib/" + str(t.get(unit, "Service.StateDirectory"))} {
			cfg := r[where]
			for what, f := range map[string]string{"FN_DATABASE_URL": cfg.Database.Path, "FN_ISSUER_KEY_FILE": cfg.IssuerKeyFile} {
				p.when(cfg.Database.Kind != config.SQLite || filepath.Dir(f) != dir || dir == "/var/lib/", "%s: %s %q is not in the state directory %q", where, what, f, dir)
			}
		}
		from := strings.Fields(str(strs(t.get("Dockerfile", "FROM"))[0]) + " ")[0]
		image, v, _ := strings.Cut(from, ":")
		p.when(image != "golang" || version.Compare(version.Lang("go"+v), version.Lang("go"+t["go.mod"].(string))) < 0, "Dockerfile: builds with %q, older than go.mod's go %s", from, t["go.mod"])
		p.when(!strings.Contains(" "+strings.Join(strs(t.get("Dockerfile", "ENV")), " ")+" ", " CGO_ENABLED=0 "), "Dockerfile: the build does not set CGO_ENABLED=0; the final image has no libc")
		for _, must := range []string{".git", "data"} { // data may hold an issuer private key
			p.when(dig(t[".dockerignore"], must) == nil, ".dockerignore: %s is not kept out of the build context", must)
		}
	},
}

// containerPort resolves a port by name or number to the container's port.
func (t tree) containerPort(ref any) string {
	for _, p := range orList(t.get(kube, container+".ports")) {
		if str(dig(p, "name")) == str(ref) || str(dig(p, "containerPort")) == str(ref) {
			return str(dig(p, "containerPort"))
		}
	}
	return ""
}

// execForm reads a JSON array argument (CMD ["/relay", "probe"]).
func execForm(s string) (out []string) {
	_ = json.Unmarshal([]byte(s), &out)
	return out
}

func (t tree) problems() problems {
	var p problems
	r := t.relays(&p)
	for _, c := range checks {
		c(t, r, &p)
	}
	return p
}

func TestDeployFiles(t *testing.T) {
	for _, msg := range load(t).problems() {
		t.Error(msg)
	}
}

// securityThreshold is the highest exposure `systemd-analyze security`
// may rate the unit, in tenths (0 best, 100 worst).
const securityThreshold = 20

// TestReadmeFigures: the README quotes the unit's exposure as the bound
// TestToolsAccept holds it to, not a score measured once by hand (which
// differs between systemd versions); and what it lists as not covered is
// not what docs/OPERATIONS.md documents under a heading of that name.
// Seen red with "rates it 1.4" and "Backups" in the list.
func TestReadmeFigures(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	flat := strings.Join(strings.Fields(readme), " ")
	if want := fmt.Sprintf("exposure at most %.1f", float64(securityThreshold)/10); !strings.Contains(flat, want) {
		t.Errorf("the README does not say %q", want)
	}
	if m := regexp.MustCompile(`rates it \d`).FindString(flat); m != "" {
		t.Errorf("the README quotes a measured score: %q", m)
	}
	ops, err := os.ReadFile(filepath.Join("..", "docs", "OPERATIONS.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, notCovered, ok := strings.Cut(readme, "\n## What is not covered\n")
	if !ok {
		t.Fatal(`the README has no "What is not covered"`)
	}
	notCovered, _, _ = strings.Cut(notCovered, "\n## ")
	for _, m := range regexp.MustCompile(`(?m)^- \*\*(.+?)\*\*`).FindAllStringSubmatch(notCovered, -1) {
		topic := strings.TrimSuffix(m[1], ".")
		if regexp.MustCompile(`(?mi)^##+ ` + regexp.QuoteMeta(topic) + `\b`).Match(ops) {
			t.Errorf("the README lists %q as not covered; docs/OPERATIONS.md has a section on it", m[1])
		}
	}
}

// TestToolsAccept: HAProxy and systemd read the files themselves, and the
// unit's exposure stays low (0 best, 10 worst; the threshold in tenths).
func TestToolsAccept(t *testing.T) {
	self, _ := os.Executable() // verify wants ExecStart to exist
	src, err := os.ReadFile("relay.service")
	unit := filepath.Join(t.TempDir(), "relay.service")
	if err == nil {
		err = os.WriteFile(unit, []byte(strings.Replace(string(src), "ExecStart=/usr/local/bin/relay", "ExecStart="+self, 1)), 0o644)
	}
	if err == nil {
		// The push credentials drop-in, read by verify with the unit.
		err = os.MkdirAll(unit+".d", 0o755)
	}
	if err == nil {
		var dropIn []byte
		if dropIn, err = os.ReadFile(filepath.Join("relay.service.d", "push.conf")); err == nil {
			err = os.WriteFile(filepath.Join(unit+".d", "push.conf"), dropIn, 0o644)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{"haproxy", "-c", "-f", "haproxy.cfg"}, {"systemd-analyze", "verify", "--man=no", unit}, {"systemd-analyze", "security", "--offline=yes", "--threshold=" + strconv.Itoa(securityThreshold), unit}} {
		t.Run(cmd[0]+" "+cmd[1], func(t *testing.T) {
			bin, err := exec.LookPath(cmd[0])
			if err != nil {
				servicetest.Unavailable(t, cmd[0], err) // skips, or fails with FN_TEST_REQUIRE_SERVICES=1
			}
			// verify exits 0 on what it only warns about.
			if out, err := exec.CommandContext(t.Context(), bin, cmd[1:]...).CombinedOutput(); err != nil || cmd[1] == "verify" && len(out) > 0 {
				t.Errorf("%q: %v\n%s", cmd, err, out)
			}
		})
	}
}

// breakage sets path in file to to (nil deletes); a problem must say want.
type breakage struct {
	file, path string
	to         any
	want       string
}

// TestChecksCatchBreakage breaks the parsed files one way at a time and
// expects a problem that says so: each row is a check seen red.
func TestChecksCatchBreakage(t *testing.T) {
	for _, tt := range append([]breakage{
		{one, "services.relay.environment.FN_LOG_FORMATS", "json", "FN_LOG_FORMATS"},
		{one, "services.relay.environment.FN_SHUTDOWN_GRACE", "soon", "FN_SHUTDOWN_GRACE"},
		{one, "services.relay.environment.FN_SHUTDOWN_GRACE", "30s", "drain"},
		{one, "services.relay.stop_grace_period", "12s", "drain"},
		{one, "services.relay.ulimits", map[string]any{"nofile": 1024}, "nofile"},
		{one, "services.relay.healthcheck.test", []any{"CMD", "/relay", "probe", "http://127.0.0.1:8080/live"}, "healthcheck"},
		{one, "services.relay.environment.FN_LISTEN", "0.0.0.0:8081", "healthcheck"},
		{one, "services.relay.ports", []any{"8080:8080"}, "loopback"},
		{one, "services.relay.read_only", false, "read_only"},
		{fleet, "services.relay-1.environment.FN_REDIS_URL", nil, "FN_REDIS_URL"},
		{fleet, "services.relay-2.environment.FN_DATABASE_URL", "sqlite:/data/r.db", "on sqlite"},
		{fleet, "services.relay-1.environment.FN_RELAY_REPLICAS", "3", "FN_RELAY_REPLICAS says 3"},
		{fleet, "services.relay-2", nil, "FN_RELAY_REPLICAS says 2"},
		{fleet, "services.lb.ulimits", map[string]any{"nofile": 65536}, "maxconn"},
		{fleet, "services.lb.volumes", []any{"./deploy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg"}, "mount"},
		{fleet, "services.lb.depends_on.relay-2", nil, "healthy"},
		{hap, "defaults.timeout", []any{"client 90s", "server 60000"}, "timeout server"},
		{hap, "defaults.timeout", []any{"client 50s", "server 90s"}, "timeout client"},
		{hap, "backend relays.http-check", []any{"send meth GET uri /live"}, "/ready"},
		{hap, "backend relays.server", []any{"relay-1 relay-1:8080", "relay-2 relay-2:9090"}, "relay-2"},
		{hap, "defaults.option", []any{"http-server-close"}, "keep-alive"},
		{unit, "Service.TimeoutStopSec", []any{"10s"}, "TimeoutStopSec"},
		{unit, "Service.KillSignal", []any{"SIGKILL"}, "KillSignal"},
		{unit, "Service.LimitNOFILE", []any{"1024:1024"}, "LimitNOFILE"},
		{unit, "Service.DynamicUser", nil, "root"},
		{unit, "Service.SystemCallFilter", []any{"@system-service", "~@privileged @resources"}, "setrlimit"},
		{unit, "Service.Environment", []any{"FN_DATABASE_URL=sqlite:/tmp/relay.db"}, "state directory"},
		{"Dockerfile", "USER", []any{"0"}, "non-root"},
		{".dockerignore", "data", nil, "data is not kept"},
		{"Dockerfile", "FROM", []any{"golang:1.20 AS build"}, "go.mod"},
		{"Dockerfile", "ENV", []any{"FN_LISTEN=0.0.0.0:8081 FN_DATABASE_URL=sqlite:/data/relay.db FN_ISSUER_KEY_FILE=/data/issuer.key"}, "CGO_ENABLED"},
		{"Dockerfile", "ENV", []any{"CGO_ENABLED=0", "FN_LISTEN=0.0.0.0:8081 FN_DATABASE_URL=sqlite:/data/relay.db FN_ISSUER_KEY_FILE=/tmp/k"}, "FN_ISSUER_KEY_FILE"},
		{"Dockerfile", "ENV", []any{"CGO_ENABLED=0", "FN_LISTEN=0.0.0.0:8081 FN_DATABASE_URL=sqlite:/data/relay.db FN_ISSUER_KEY_FILE=/data/k"}, "HEALTHCHECK"},
		{kube, "Deployment.spec.replicas", 3, "FN_RELAY_REPLICAS says 2"},
		{kube, pod + ".terminationGracePeriodSeconds", 20, "drain"},
		{kube, container + ".readinessProbe.httpGet.path", "/live", "readinessProbe"},
		{kube, container + ".livenessProbe.httpGet.port", "metrics", "livenessProbe"},
		{kube, container + ".env.name=FN_ISSUER_KEYS.valueFrom", nil, "belongs in the Secret"},
		{kube, container + ".env.name=FN_ISSUER_KEYS.valueFrom.secretKeyRef.key", "issuer_keys", "no issuer_keys"},
		{kube, "Service.spec.selector", map[string]any{"app": "relay"}, "Service.spec.selector"},
		{kube, "PodDisruptionBudget.spec", map[string]any{"minAvailable": 2}, "drained"},
		{kube, container + ".securityContext.allowPrivilegeEscalation", true, "allowPrivilegeEscalation"},
	}, proxyBreakage...) {
		d := load(t)
		d.set(tt.file, tt.path, tt.to)
		if p := d.problems(); !slices.ContainsFunc(p, func(m string) bool { return strings.Contains(m, tt.want) }) {
			t.Errorf("%s %s = %v: no problem mentions %q: %q", tt.file, tt.path, tt.to, tt.want, p)
		}
	}
}

// TestPushCredentialsDropIn: each credential the drop-in loads is the file
// a push setting the relay knows is pointed at, in the unit's credentials
// directory, and nothing else is set there.
func TestPushCredentialsDropIn(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("relay.service.d", "push.conf"))
	if err != nil {
		t.Fatal(err)
	}
	loaded := map[string]bool{}
	pointed := map[string]string{} // credential -> setting
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "LoadCredential="); ok {
			name, src, _ := strings.Cut(v, ":")
			if !strings.HasPrefix(src, "/etc/relay/credentials/") {
				t.Errorf("credential %s read from %s, not /etc/relay/credentials/", name, src)
			}
			loaded[name] = true
		}
		if v, ok := strings.CutPrefix(line, "Environment="); ok {
			setting, val, _ := strings.Cut(v, "=")
			cred, ok := strings.CutPrefix(val, "%d/")
			if _, known := config.Lookup(setting); !known || !ok {
				t.Errorf("%s: want a known FN_ setting pointed at %%d/CREDENTIAL", line)
			}
			pointed[cred] = setting
		}
	}
	for _, want := range []string{"FN_APNS_KEY_FILE", "FN_FCM_CREDENTIALS_FILE"} {
		if !slices.Contains(slices.Collect(maps.Values(pointed)), want) {
			t.Errorf("the drop-in does not set %s", want)
		}
	}
	for cred, setting := range pointed {
		if !loaded[cred] {
			t.Errorf("%s points at credential %s, which no LoadCredential= loads", setting, cred)
		}
	}
}
