package deploy

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flamenet/relay/config"
)

// The tool tests run haproxy and systemd-analyze; nothing may outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	minNofile   = 65536           // a held poll is an open file
	drainMargin = 5 * time.Second // after the grace the relay still closes its store
	waitMargin  = 10 * time.Second
)

// operatorValues stand in for what an operator supplies: compose's
// required ${VAR:?} and the example Secret's CHANGE-ME values.
var operatorValues = func() map[string]string {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	return map[string]string{"FN_ISSUER_KEYS": base64.StdEncoding.EncodeToString(pub)}
}()

// relay is one place the relay runs: its environment as the deployment
// sets it, read by the config package itself.
type relay struct {
	where string
	env   map[string]string
	cfg   config.Config
}

var interpolation = regexp.MustCompile(`\$\{(\w+)(?::?([-?])([^}]*))?\}`)

// relays collects every environment the files give the relay. Compose and
// Kubernetes start from the image's ENV, as the container runtime does.
func (d *deployment) relays(p *problems) []relay {
	var out []relay
	add := func(where string, env map[string]string) {
		for k, v := range env {
			if s, ok := config.Lookup(k); !ok && strings.HasPrefix(k, "FN_") {
				p.add("%s: %s is not a relay setting", where, k)
			} else if ok {
				if err := s.Check(v); err != nil {
					p.add("%s: %s=%q: %v", where, k, v, err)
				}
			}
		}
		cfg, err := config.FromEnv(func(k string) string { return env[k] })
		if err != nil {
			p.add("%s: the relay would not start: %v", where, err)
		}
		out = append(out, relay{where, env, cfg})
	}
	add("Dockerfile", d.dockerEnv())
	env := map[string]string{}
	for _, kv := range d.unit["Service.Environment"] {
		for _, a := range strings.Fields(kv) {
			k, v, _ := strings.Cut(strings.Trim(a, `"`), "=")
			env[k] = v
		}
	}
	add("deploy/relay.service", env)
	for _, file := range slices.Sorted(maps.Keys(d.compose)) {
		for _, name := range d.relayServices(file) {
			env := d.dockerEnv()
			vars := map[string]any{}
			switch e := dig(d.compose[file], "services", name, "environment").(type) {
			case map[string]any:
				vars = e
			case []any:
				for _, kv := range strs(e) {
					k, v, _ := strings.Cut(kv, "=")
					vars[k] = v
				}
			}
			for k, v := range vars {
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
			add(file+" "+name, env)
		}
	}
	if c := d.container(); c != nil {
		env := d.dockerEnv()
		list, _ := dig(c, "env").([]any)
		for _, e := range list {
			name, ref := str(dig(e, "name")), dig(e, "valueFrom", "secretKeyRef")
			env[name] = str(dig(e, "value"))
			if ref != nil {
				secret := d.kube["Secret"]
				v, ok := dig(secret, "stringData", str(dig(ref, "key"))).(string)
				if !ok || str(dig(secret, "metadata", "name")) != str(dig(ref, "name")) {
					p.add("kubernetes: %s: the example Secret has no %s", name, str(dig(ref, "key")))
				}
				if v == "CHANGE-ME" {
					v = operatorValues[name]
				}
				env[name] = v
			} else if name == "FN_ISSUER_KEYS" || name == "FN_DATABASE_URL" || name == "FN_REDIS_URL" {
				p.add("kubernetes: %s is set in the manifest; it belongs in the Secret", name)
			}
		}
		add("kubernetes", env)
	}
	return out
}

// relayServices are the compose services built from the Dockerfile.
func (d *deployment) relayServices(file string) []string {
	var out []string
	services, _ := dig(d.compose[file], "services").(map[string]any)
	for name, svc := range services {
		if dig(svc, "build") != nil {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func (d *deployment) container() any {
	return dig(d.kube["Deployment"], "spec", "template", "spec", "containers", "0")
}

func port(cfg config.Config) string {
	_, p, _ := net.SplitHostPort(cfg.Listen)
	return p
}

// problems collects what the checks find, so one run reports all of them.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// duration reads "20s", "1m30s", bare seconds, or HAProxy's bare
// milliseconds when unit is time.Millisecond.
func duration(v string, unit time.Duration) time.Duration {
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(n * float64(unit))
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return -1
	}
	return d
}

// number reads an int from YAML or text; -1 when it is none.
func number(v any) int {
	n, err := strconv.Atoi(str(v))
	if err != nil {
		return -1
	}
	return n
}

// hardNofile is the hard open-file limit of compose's ulimits.nofile
// (a number, or soft and hard); the relay raises its soft limit to it.
func hardNofile(v any) int {
	if h := dig(v, "hard"); h != nil {
		return number(h)
	}
	return number(v)
}
