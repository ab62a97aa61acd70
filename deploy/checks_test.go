package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flamenet/relay/config"
	"github.com/flamenet/relay/internal/servicetest"
)

const pod, container = "Deployment.spec.template.spec", "Deployment.spec.template.spec.containers.0"

// checks look at the parsed files and the relays' configurations.
var checks = []func(t tree, r map[string]relay, p *problems){
	// The supervisor waits out the relay's drain before SIGKILL.
	func(t tree, r map[string]relay, p *problems) {
		for where, rl := range r {
			file, svc, _ := strings.Cut(where, " ")
			need, stop := rl.cfg.ShutdownGrace+drainMargin, duration(str(t.get(file, "services."+svc+".stop_grace_period")), 1e9)
			switch {
			case where == unit:
				stop = duration(str(t.get(unit, "Service.TimeoutStopSec")), 1e9)
			case where == kube:
				stop = duration(str(t.get(kube, pod+".terminationGracePeriodSeconds")), 1e9)
				need += duration(str(t.get(kube, container+".lifecycle.preStop.sleep.seconds")), 1e9)
			case where == "Dockerfile":
				continue
			}
			if stop < need {
				p.add("%s: the supervisor kills after %v (stop_grace_period, TimeoutStopSec, terminationGracePeriodSeconds), before the drain's %v", where, stop, need)
			}
		}
		if s := str(t.get(unit, "Service.KillSignal")); s != "SIGTERM" && s != "" {
			p.add("%s: KillSignal=%s; the relay drains on SIGTERM", unit, s)
		}
	},
	// Held polls are open files; the proxy holds two per client.
	func(t tree, r map[string]relay, p *problems) {
		if n := hardNofile(t.get(unit, "Service.LimitNOFILE")); n < minNofile {
			p.add("%s: LimitNOFILE %d, want at least %d", unit, n, minNofile)
		}
		for _, file := range []string{one, fleet} {
			for _, svc := range t.relayServices(file) {
				if n := hardNofile(t.get(file, "services."+svc+".ulimits.nofile")); n < minNofile {
					p.add("%s %s: ulimits nofile %d, want at least %d", file, svc, n, minNofile)
				}
			}
		}
		if n, m := hardNofile(t.get(fleet, "services.lb.ulimits.nofile")), number(line(t.get(hap, "global.maxconn"), "")); n < 2*m {
			p.add("%s lb: ulimits nofile %d below twice HAProxy's maxconn %d", fleet, n, m)
		}
	},
	// Health checks ask the relay's own port: /ready for traffic, /live for restarts.
	func(t tree, r map[string]relay, p *problems) {
		want := func(rl relay) string {
			return strings.Join(append(execForm(str(t.get("Dockerfile", "ENTRYPOINT"))), "probe", "http://127.0.0.1:"+port(rl.cfg)+"/ready"), " ")
		}
		hc := str(t.get("Dockerfile", "HEALTHCHECK"))
		if got := strings.Join(execForm(hc[strings.Index(hc, "CMD ")+4:]), " "); got != want(r["Dockerfile"]) {
			p.add("Dockerfile: HEALTHCHECK runs %q, want %q (ENTRYPOINT, FN_LISTEN's port, /ready)", got, want(r["Dockerfile"]))
		}
		for where, rl := range r {
			if file, svc, ok := strings.Cut(where, " "); ok {
				if test := strs(t.get(file, "services."+svc+".healthcheck.test")); strings.Join(test[min(1, len(test)):], " ") != want(rl) {
					p.add("%s: healthcheck runs %q, want %q (ENTRYPOINT, FN_LISTEN's port, /ready)", where, test, want(rl))
				}
			}
		}
		for probe, path := range map[string]string{"readinessProbe": "/ready", "livenessProbe": "/live"} {
			get := t.get(kube, container+"."+probe+".httpGet")
			if str(dig(get, "path")) != path || t.containerPort(dig(get, "port")) != port(r[kube].cfg) {
				p.add("%s: %s asks %v on port %v, want %s on FN_LISTEN's port", kube, probe, dig(get, "path"), dig(get, "port"), path)
			}
		}
		if chk := line(t.get(hap, "backend relays.http-check"), "send"); !strings.Contains(chk+" ", "uri /ready ") {
			p.add("%s: http-check send %q, want uri /ready", hap, chk)
		}
	},
	// The load balancer: timeouts above the longest poll, every relay a server.
	func(t tree, r map[string]relay, p *problems) {
		for _, name := range t.relayServices(fleet) {
			rl := r[fleet+" "+name]
			for _, side := range []string{"client", "server"} {
				if d := duration(line(t.get(hap, "defaults.timeout"), side), 1e6); d < rl.cfg.MaxWait+waitMargin {
					p.add("%s: timeout %s %v, want above FN_MAX_WAIT_SECS (%v) plus %v", hap, side, d, rl.cfg.MaxWait, waitMargin)
				}
			}
			if !slices.ContainsFunc(strs(t.get(hap, "backend relays.server")), func(s string) bool { return strings.Fields(s + " x")[1] == name+":"+port(rl.cfg) }) {
				p.add("%s: no server %s:%s for the relay service %s", hap, name, port(rl.cfg), name)
			}
			if str(t.get(fleet, "services.lb.depends_on."+name+".condition")) != "service_healthy" {
				p.add("%s lb: does not wait for %s to be healthy", fleet, name)
			}
		}
		for _, sec := range []string{"defaults", "backend relays"} {
			if slices.ContainsFunc(strs(t.get(hap, sec+".option")), func(o string) bool { return strings.HasSuffix(o, "close") }) {
				p.add("%s: %s closes connections to the relays; keep-alive saves a handshake per poll", hap, sec)
			}
		}
		if !slices.ContainsFunc(strs(t.get(fleet, "services.lb.volumes")), func(v string) bool { return path.Clean(strings.Split(v, ":")[0]) == hap }) {
			p.add("%s lb: does not mount %s", fleet, hap)
		}
	},
	// Replica counts agree with FN_RELAY_REPLICAS; containers share Postgres.
	func(t tree, r map[string]relay, p *problems) {
		for where, rl := range r {
			file, _, ok := strings.Cut(where, " ")
			n := len(t.relayServices(file))
			if where == kube {
				n = number(t.get(kube, "Deployment.spec.replicas"))
			} else if !ok {
				continue
			}
			if n != rl.cfg.RelayReplicas || rl.cfg.Database.Kind != config.Postgres {
				p.add("%s: %d replicas on %s, FN_RELAY_REPLICAS says %d; want them equal, on postgres", where, n, rl.cfg.Database.Kind, rl.cfg.RelayReplicas)
			}
		}
		if number(t.get(kube, "PodDisruptionBudget.spec.maxUnavailable")) < 1 && number(t.get(kube, "PodDisruptionBudget.spec.minAvailable")) >= r[kube].cfg.RelayReplicas {
			p.add("%s: the PodDisruptionBudget lets no relay be drained", kube)
		}
	},
	// Kubernetes objects select the Deployment's pods and the relay's port.
	func(t tree, r map[string]relay, p *problems) {
		for _, sel := range []string{"Service.spec.selector", "PodDisruptionBudget.spec.selector.matchLabels", "Deployment.spec.selector.matchLabels"} {
			for k, v := range orMap(t.get(kube, sel)) {
				if str(dig(t.get(kube, "Deployment.spec.template.metadata.labels"), k)) != str(v) {
					p.add("%s: %s %s=%v is not a label of the pods", kube, sel, k, v)
				}
			}
			if len(orMap(t.get(kube, sel))) == 0 {
				p.add("%s: %s selects nothing", kube, sel)
			}
		}
		if target := t.get(kube, "Service.spec.ports.0.targetPort"); t.containerPort(target) != port(r[kube].cfg) {
			p.add("%s: the Service targets %v, not FN_LISTEN's port", kube, target)
		}
	},
	// Least privilege in every runtime.
	func(t tree, r map[string]relay, p *problems) {
		if uid, _, _ := strings.Cut(str(t.get("Dockerfile", "USER")), ":"); number(uid) < 1 {
			p.add("Dockerfile: USER %q, want a numeric non-root user", uid)
		}
		for path, want := range map[string]string{pod + ".securityContext.runAsNonRoot": "true", container + ".securityContext.readOnlyRootFilesystem": "true",
			container + ".securityContext.allowPrivilegeEscalation": "false", container + ".securityContext.capabilities.drop": "ALL"} {
			if got := str(t.get(kube, path)); got != want {
				p.add("%s: %s is %s, want %s", kube, path, got, want)
			}
		}
		for _, file := range []string{one, fleet} {
			for name, svc := range orMap(t.get(file, "services")) {
				for _, pub := range strs(dig(svc, "ports")) {
					if !strings.HasPrefix(pub, "127.0.0.1:") {
						p.add("%s %s: port %s is published beyond loopback", file, name, pub)
					}
				}
			}
			for _, svc := range t.relayServices(file) {
				if str(t.get(file, "services."+svc+".read_only")) != "true" || !slices.Contains(strs(t.get(file, "services."+svc+".cap_drop")), "ALL") {
					p.add("%s %s: want read_only and cap_drop ALL", file, svc)
				}
			}
		}
		if str(t.get(unit, "Service.DynamicUser")) != "yes" && strings.TrimPrefix(str(t.get(unit, "Service.User")), "root") == "" {
			p.add("%s: runs as root; want DynamicUser=yes or a User", unit)
		}
		for _, f := range strs(t.get(unit, "Service.SystemCallFilter")) {
			if strings.HasPrefix(f, "~") && (strings.Contains(f, "@resources") || strings.Contains(f, "setrlimit")) {
				p.add("%s: SystemCallFilter=%s denies setrlimit, which raises the open-file limit", unit, f)
			}
		}
	},
	// State lives where the runtime keeps it; builds are static and clean.
	func(t tree, r map[string]relay, p *problems) {
		for where, dir := range map[string]string{"Dockerfile": strings.Join(execForm(str(t.get("Dockerfile", "VOLUME"))), " "), unit: "/var/lib/" + str(t.get(unit, "Service.StateDirectory"))} {
			cfg := r[where].cfg
			for what, f := range map[string]string{"FN_DATABASE_URL": cfg.Database.Path, "FN_ISSUER_KEY_FILE": cfg.IssuerKeyFile} {
				if cfg.Database.Kind != config.SQLite || filepath.Dir(f) != dir || dir == "/var/lib/" {
					p.add("%s: %s %q is not in the state directory %q", where, what, f, dir)
				}
			}
		}
		from := strings.Fields(str(strs(t.get("Dockerfile", "FROM"))[0]) + " ")[0]
		if image, v, _ := strings.Cut(from, ":"); image != "golang" || versionLess(v, t["go.mod"].(string)) {
			p.add("Dockerfile: builds with %q, older than go.mod's go %s", from, t["go.mod"])
		}
		if !strings.Contains(" "+strings.Join(strs(t.get("Dockerfile", "ENV")), " ")+" ", " CGO_ENABLED=0 ") {
			p.add("Dockerfile: the build does not set CGO_ENABLED=0; the final image has no libc")
		}
		for _, must := range []string{".git", "data"} { // data may hold an issuer private key
			if !slices.Contains(strs(t[".dockerignore"]), must) {
				p.add(".dockerignore: %s is not kept out of the build context", must)
			}
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

// versionLess compares major.minor: 1.25 < 1.26.0.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a+".0", "."), strings.Split(b+".0", ".")
	return number(as[0]) < number(bs[0]) || number(as[0]) == number(bs[0]) && number(as[1]) < number(bs[1])
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

// tool finds a binary, or skips (fails with FN_TEST_REQUIRE_SERVICES=1).
func tool(t *testing.T, name string) string {
	bin, err := exec.LookPath(name)
	if err != nil {
		servicetest.Unavailable(t, name, err)
	}
	return bin
}

// TestHAProxyAccepts: HAProxy itself reads its configuration.
func TestHAProxyAccepts(t *testing.T) {
	if out, err := exec.CommandContext(t.Context(), tool(t, "haproxy"), "-c", "-f", "haproxy.cfg").CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
}

// TestSystemdAccepts: systemd reads the unit, and its exposure stays low.
func TestSystemdAccepts(t *testing.T) {
	bin := tool(t, "systemd-analyze")
	src, err := os.ReadFile("relay.service")
	self, _ := os.Executable() // verify wants ExecStart to exist
	unit := filepath.Join(t.TempDir(), "relay.service")
	if err == nil {
		err = os.WriteFile(unit, []byte(strings.Replace(string(src), "ExecStart=/usr/local/bin/relay", "ExecStart="+self, 1)), 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), bin, "verify", "--man=no", unit).CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// Exposure is scored 0 (best) to 10; the threshold is in tenths.
	if out, err := exec.CommandContext(t.Context(), bin, "security", "--offline=yes", "--threshold=20", unit).CombinedOutput(); err != nil {
		t.Errorf("systemd-analyze security: exposure above 2.0, or unsupported: %v\n%s", err, out)
	}
}

// TestChecksCatchBreakage breaks the parsed files one way at a time and
// expects a problem that says so: each row is a check seen red.
func TestChecksCatchBreakage(t *testing.T) {
	for _, tt := range []struct {
		file, path string
		to         any // nil deletes
		want       string
	}{
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
		{fleet, "services.lb.volumes", []any{"./haproxy.cfg:/etc/haproxy.cfg"}, "mount"},
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
	} {
		d := load(t)
		d.set(tt.file, tt.path, tt.to)
		if p := d.problems(); !slices.ContainsFunc(p, func(m string) bool { return strings.Contains(m, tt.want) }) {
			t.Errorf("%s %s = %v: no problem mentions %q: %q", tt.file, tt.path, tt.to, tt.want, p)
		}
	}
}
