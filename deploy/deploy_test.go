package deploy

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/flamenet/relay/config"
)

// The tool tests run haproxy and systemd-analyze; nothing may outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	minNofile   = 65536           // a held poll is an open file
	drainMargin = 5 * time.Second // after the grace the relay still closes its store
	waitMargin  = 10 * time.Second
	one, fleet  = "compose.yaml", "compose.replicas.yaml"
	unit, hap   = "deploy/relay.service", "deploy/haproxy.cfg"
	kube        = "deploy/kubernetes"
)

// tree is every deployment file parsed into maps and lists: YAML as it
// decodes; the unit as section -> key -> values; the Dockerfile as
// instruction -> arguments; HAProxy as section -> keyword -> rests of its
// lines. The checks read these, never the text, so a reformatted file
// checks the same.
type tree map[string]any

func load(tb testing.TB) tree {
	tb.Helper()
	read := func(path string) string {
		b, err := os.ReadFile(filepath.Join("..", path))
		if err != nil {
			tb.Fatal(err)
		}
		return string(b)
	}
	t, kinds := tree{}, map[string]any{}
	manifests, _ := filepath.Glob("../" + kube + "/*.yaml")
	for _, f := range append([]string{one, fleet}, manifests...) {
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
	section, sections := "", map[string]any{}
	for _, l := range lines(read(unit), "#;") {
		if k, v, ok := strings.Cut(str(l), "="); ok {
			s := sections[section].(map[string]any)
			s[k] = append(orList(s[k]), v)
		} else {
			section = strings.Trim(str(l), "[]")
			sections[section] = map[string]any{}
		}
	}
	t[unit] = sections
	docker := map[string]any{}
	for _, l := range lines(strings.ReplaceAll(read("Dockerfile"), "\\\n", " "), "#") {
		cmd, args, _ := strings.Cut(str(l), " ")
		docker[strings.ToUpper(cmd)] = append(orList(docker[strings.ToUpper(cmd)]), strings.Join(strings.Fields(args), " "))
	}
	t["Dockerfile"] = docker
	haproxy := map[string]any{}
	for _, l := range strings.Split(read(hap), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0][0] != '#' {
			if l[0] != ' ' && l[0] != '\t' {
				section, haproxy[strings.Join(f, " ")] = strings.Join(f, " "), map[string]any{}
			} else {
				s := haproxy[section].(map[string]any)
				s[f[0]] = append(orList(s[f[0]]), strings.Join(f[1:], " "))
			}
		}
	}
	t[hap] = haproxy
	t[".dockerignore"] = lines(read(".dockerignore"), "#")
	t["go.mod"] = regexp.MustCompile(`(?m)^go (\S+)`).FindStringSubmatch(read("go.mod"))[1]
	return t
}

// lines are the text's lines, trimmed, without blank ones and comments.
func lines(text, comment string) (out []any) {
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.ContainsAny(l[:1], comment) {
			out = append(out, l)
		}
	}
	return out
}

func orList(v any) []any { l, _ := v.([]any); return l }

// get walks a file's tree by a dotted path: map keys, list indexes, or
// name=X for the list element whose name is X. nil where the path ends.
func (t tree) get(file, path string) any {
	v := t[file]
	for _, p := range strings.Split(path, ".") {
		switch m := v.(type) {
		case map[string]any:
			v = m[p]
		case []any:
			name, byName := strings.CutPrefix(p, "name=")
			i, err := strconv.Atoi(p)
			if byName {
				i = slices.IndexFunc(m, func(e any) bool { return str(dig(e, "name")) == name })
			}
			if (err != nil && !byName) || i < 0 || i >= len(m) {
				return nil
			}
			v = m[i]
		default:
			return nil
		}
	}
	return v
}

func dig(v any, key string) any { m, _ := v.(map[string]any); return m[key] }

// set replaces (nil: deletes) the value at a path whose parent is a map.
func (t tree) set(file, path string, v any) {
	parent, key := "", path
	if i := strings.LastIndex(path, "."); i >= 0 {
		parent, key = path[:i], path[i+1:]
	}
	m := orMap(t[file])
	if parent != "" {
		m = orMap(t.get(file, parent))
	}
	if m[key] = v; v == nil {
		delete(m, key)
	}
}

// str is a scalar as text, the last value of a list (a unit's key set
// twice, the final Dockerfile stage's USER), "" for nothing.
func str(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case []any:
		if len(v) > 0 && !slices.ContainsFunc(v, func(e any) bool { _, ok := e.(string); return !ok }) {
			return str(v[len(v)-1])
		}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func strs(v any) []string {
	var out []string
	for _, e := range orList(v) {
		out = append(out, str(e))
	}
	return out
}

// line is the rest of the first value in a list (HAProxy's) that starts
// with prefix.
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
	}
	if d, err := time.ParseDuration(v); err == nil {
		return d
	}
	return -1
}

func number(v any) int {
	n, err := strconv.Atoi(str(v))
	if err != nil {
		return -1
	}
	return n
}

// hardNofile is compose's ulimits.nofile (a number, or soft and hard) or
// systemd's LimitNOFILE (N or SOFT:HARD): the hard limit, to which the
// relay raises its soft one.
func hardNofile(v any) int {
	if h := dig(v, "hard"); h != nil {
		return number(h)
	}
	s := str(v)
	return number(s[strings.Index(s, ":")+1:])
}

// operatorValues stand in for what an operator supplies: compose's
// required ${VAR:?} and the example Secret's CHANGE-ME values.
var operatorValues = func() map[string]string {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	return map[string]string{"FN_ISSUER_KEYS": base64.StdEncoding.EncodeToString(pub)}
}()

var interpolation = regexp.MustCompile(`\$\{(\w+)(?::?([-?])([^}]*))?\}`)

// relay is one place the relay runs: its environment as the files set it,
// and the configuration the config package reads from it.
type relay struct {
	env map[string]string
	cfg config.Config
}

// relays reads every environment the files give the relay, by place: the
// image, the unit, each compose relay service ("compose.yaml relay") and
// Kubernetes. Compose and Kubernetes start from the image's ENV, as the
// container runtime does.
func (t tree) relays(p *problems) map[string]relay {
	out := map[string]relay{}
	add := func(where string, env map[string]string) {
		for _, k := range slices.Sorted(maps.Keys(env)) {
			if s, ok := config.Lookup(k); ok || strings.HasPrefix(k, "FN_") {
				if err := s.Check(env[k]); err != nil {
					p.add("%s: %s=%q: %v", where, k, env[k], err)
				}
			}
		}
		cfg, err := config.FromEnv(func(k string) string { return env[k] })
		if err != nil {
			p.add("%s: the relay would not start: %v", where, err)
		}
		out[where] = relay{env, cfg}
	}
	image := func(set map[string]string) map[string]string {
		env := map[string]string{}
		for _, kv := range strings.Fields(strings.Join(strs(t.get("Dockerfile", "ENV")), " ")) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		maps.Copy(env, set)
		return env
	}
	add("Dockerfile", image(nil))
	env := map[string]string{}
	for _, kv := range strings.Fields(strings.Join(strs(t.get(unit, "Service.Environment")), " ")) {
		k, v, _ := strings.Cut(strings.Trim(kv, `"`), "=")
		env[k] = v
	}
	add(unit, env)
	for _, file := range []string{one, fleet} {
		for _, name := range t.relayServices(file) {
			env := map[string]string{}
			for k, v := range t.get(file, "services."+name+".environment").(map[string]any) {
				env[k] = interpolation.ReplaceAllStringFunc(str(v), func(m string) string {
					g := interpolation.FindStringSubmatch(m)
					if v, ok := operatorValues[g[1]]; ok {
						return v
					} else if g[2] == "?" {
						p.add("%s: %s needs %s, which the checks have no value for", file, k, g[1])
					}
					return g[3]
				})
			}
			add(file+" "+name, image(env))
		}
	}
	env = map[string]string{}
	for _, e := range orList(t.get(kube, "Deployment.spec.template.spec.containers.0.env")) {
		name, ref := str(dig(e, "name")), dig(dig(e, "valueFrom"), "secretKeyRef")
		env[name] = str(dig(e, "value"))
		if ref != nil {
			v, ok := t.get(kube, "Secret.stringData."+str(dig(ref, "key"))).(string)
			if !ok || str(t.get(kube, "Secret.metadata.name")) != str(dig(ref, "name")) {
				p.add("%s: %s: the example Secret has no %s", kube, name, str(dig(ref, "key")))
			}
			if env[name] = v; v == "CHANGE-ME" {
				env[name] = operatorValues[name]
			}
		} else if name == "FN_ISSUER_KEYS" || name == "FN_DATABASE_URL" || name == "FN_REDIS_URL" {
			p.add("%s: %s is set in the manifest; it belongs in the Secret", kube, name)
		}
	}
	add(kube, image(env))
	return out
}

// relayServices are the compose services built from the Dockerfile.
func (t tree) relayServices(file string) []string {
	var out []string
	for name, svc := range orMap(t.get(file, "services")) {
		if dig(svc, "build") != nil {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func orMap(v any) map[string]any { m, _ := v.(map[string]any); return m }

func port(cfg config.Config) string {
	_, p, _ := net.SplitHostPort(cfg.Listen)
	return p
}

// problems collects what the checks find, so one run reports all of them.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }
