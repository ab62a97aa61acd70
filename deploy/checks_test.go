package deploy

import (
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flamenet/relay/config"
	"github.com/flamenet/relay/internal/servicetest"
)

// check looks at the parsed files and the relays' configurations.
type check func(d *deployment, r map[string]relay, p *problems)

var checks = map[string]check{
	// The supervisor waits out the relay's drain before SIGKILL.
	"grace": func(d *deployment, r map[string]relay, p *problems) {
		for _, rl := range r {
			var stop, need = -1 * drainMargin, rl.cfg.ShutdownGrace + drainMargin
			switch file, svc, _ := strings.Cut(rl.where, " "); {
			case rl.where == "deploy/relay.service":
				stop = duration(last(d.unit["Service.TimeoutStopSec"], "90s"), 1e9)
			case rl.where == "kubernetes":
				pod := dig(d.kube["Deployment"], "spec", "template", "spec")
				stop = duration(str(dig(pod, "terminationGracePeriodSeconds")), 1e9)
				need += duration(str(dig(d.container(), "lifecycle", "preStop", "sleep", "seconds")), 1e9)
			case strings.HasPrefix(file, "compose"):
				stop = duration(orDefault(str(dig(d.compose[file], "services", svc, "stop_grace_period")), "10s"), 1e9)
			default:
				continue
			}
			if stop < need {
				p.add("%s: the supervisor kills after %v (stop_grace_period, TimeoutStopSec or terminationGracePeriodSeconds), before the relay's drain of %v has room", rl.where, stop, need)
			}
		}
		if s := last(d.unit["Service.KillSignal"], "SIGTERM"); s != "SIGTERM" {
			p.add("deploy/relay.service: KillSignal=%s; the relay drains on SIGTERM", s)
		}
	},
	// Held polls are open files; the relay raises its soft limit to the hard.
	"nofile": func(d *deployment, r map[string]relay, p *problems) {
		lim := last(d.unit["Service.LimitNOFILE"], "0")
		if n, _ := strconv.Atoi(lim[strings.Index(lim, ":")+1:]); n < minNofile {
			p.add("deploy/relay.service: LimitNOFILE=%s, want at least %d", lim, minNofile)
		}
		for file, doc := range d.compose {
			for _, svc := range d.relayServices(file) {
				if n := hardNofile(dig(doc, "services", svc, "ulimits", "nofile")); n < minNofile {
					p.add("%s %s: ulimits nofile hard %d, want at least %d", file, svc, n, minNofile)
				}
			}
		}
		// The proxy holds two files per client connection.
		maxconn := number(field(d.haproxy["global"], "maxconn"))
		if n := hardNofile(dig(d.compose["compose.replicas.yaml"], "services", "lb", "ulimits", "nofile")); n < 2*maxconn {
			p.add("compose.replicas.yaml lb: ulimits nofile %d below twice HAProxy's maxconn %d", n, maxconn)
		}
	},
	// Health checks ask the relay's own port: /ready for traffic, /live for restarts.
	"probes": func(d *deployment, r map[string]relay, p *problems) {
		entry := execForm(d.dockerLast("ENTRYPOINT"))
		want := func(rl relay) string {
			return strings.Join(append(entry, "probe", "http://127.0.0.1:"+port(rl.cfg)+"/ready"), " ")
		}
		hc := d.dockerLast("HEALTHCHECK")
		if got := strings.Join(execForm(hc[strings.Index(hc, "CMD ")+4:]), " "); got != want(r["Dockerfile"]) {
			p.add("Dockerfile: HEALTHCHECK runs %q, want %q (ENTRYPOINT, FN_LISTEN's port, /ready)", got, want(r["Dockerfile"]))
		}
		for _, rl := range r {
			file, svc, _ := strings.Cut(rl.where, " ")
			if test := strs(dig(d.compose[file], "services", svc, "healthcheck", "test")); strings.HasPrefix(file, "compose") && strings.Join(test[min(1, len(test)):], " ") != want(rl) {
				p.add("%s: healthcheck runs %q, want %q (ENTRYPOINT, FN_LISTEN's port, /ready)", rl.where, test, want(rl))
			}
		}
		c := d.container()
		for probe, path := range map[string]string{"readinessProbe": "/ready", "livenessProbe": "/live"} {
			get := dig(c, probe, "httpGet")
			if str(dig(get, "path")) != path || containerPort(c, dig(get, "port")) != port(r["kubernetes"].cfg) {
				p.add("kubernetes: %s asks %v port %v, want %s on FN_LISTEN's port", probe, dig(get, "path"), dig(get, "port"), path)
			}
		}
		if chk := field(d.haproxy["backend relays"], "http-check", "send"); !strings.Contains(chk+" ", " uri /ready ") {
			p.add("deploy/haproxy.cfg: http-check %q, want uri /ready", chk)
		}
	},
	// The load balancer: timeouts above the longest poll, every relay a server.
	"proxy": func(d *deployment, r map[string]relay, p *problems) {
		for _, name := range d.relayServices("compose.replicas.yaml") {
			rl := r["compose.replicas.yaml "+name]
			for _, side := range []string{"client", "server"} {
				if t := duration(field(d.haproxy["defaults"], "timeout", side), 1e6); t < rl.cfg.MaxWait+waitMargin {
					p.add("deploy/haproxy.cfg: timeout %s %v, want above FN_MAX_WAIT_SECS (%v) plus %v", side, t, rl.cfg.MaxWait, waitMargin)
				}
			}
			if !slices.ContainsFunc(d.haproxy["backend relays"], func(l []string) bool {
				return len(l) > 2 && l[0] == "server" && l[2] == name+":"+port(rl.cfg)
			}) {
				p.add("deploy/haproxy.cfg: no server %s:%s for relay service %s", name, port(rl.cfg), name)
			}
			if str(dig(d.compose["compose.replicas.yaml"], "services", "lb", "depends_on", name, "condition")) != "service_healthy" {
				p.add("compose.replicas.yaml lb: does not wait for %s to be healthy", name)
			}
		}
		for _, sec := range []string{"defaults", "backend relays"} {
			if slices.ContainsFunc(d.haproxy[sec], func(l []string) bool { return len(l) > 1 && l[0] == "option" && strings.HasSuffix(l[1], "close") }) {
				p.add("deploy/haproxy.cfg: %s closes connections to the relays; keep-alive saves a handshake per poll", sec)
			}
		}
		mounted := slices.ContainsFunc(strs(dig(d.compose["compose.replicas.yaml"], "services", "lb", "volumes")), func(v string) bool {
			src, _, _ := strings.Cut(v, ":")
			return path.Clean(src) == "deploy/haproxy.cfg"
		})
		if !mounted {
			p.add("compose.replicas.yaml lb: does not mount deploy/haproxy.cfg")
		}
	},
	// Every replica count agrees with FN_RELAY_REPLICAS; the fleet shares one store.
	"replicas": func(d *deployment, r map[string]relay, p *problems) {
		for _, rl := range r {
			file, _, _ := strings.Cut(rl.where, " ")
			var n int
			if rl.where == "kubernetes" {
				n = number(dig(d.kube["Deployment"], "spec", "replicas"))
			} else if strings.HasPrefix(file, "compose") {
				n = len(d.relayServices(file))
			} else {
				continue
			}
			if n != rl.cfg.RelayReplicas {
				p.add("%s: %d replicas run, FN_RELAY_REPLICAS says %d", rl.where, n, rl.cfg.RelayReplicas)
			}
			if rl.cfg.Database.Kind != config.Postgres {
				p.add("%s: FN_DATABASE_URL is %s; a container's store is Postgres here", rl.where, rl.cfg.Database.Kind)
			}
		}
		pdb := d.kube["PodDisruptionBudget"]
		if n := number(dig(d.kube["Deployment"], "spec", "replicas")); number(dig(pdb, "spec", "maxUnavailable")) < 1 && number(dig(pdb, "spec", "minAvailable")) >= n {
			p.add("kubernetes: the PodDisruptionBudget lets no relay be drained")
		}
	},
	// Kubernetes objects select the Deployment's pods and ports.
	"selectors": func(d *deployment, r map[string]relay, p *problems) {
		labels := dig(d.kube["Deployment"], "spec", "template", "metadata", "labels")
		for kind, sel := range map[string]any{
			"Service":             dig(d.kube["Service"], "spec", "selector"),
			"PodDisruptionBudget": dig(d.kube["PodDisruptionBudget"], "spec", "selector", "matchLabels"),
			"Deployment":          dig(d.kube["Deployment"], "spec", "selector", "matchLabels"),
		} {
			m, _ := sel.(map[string]any)
			for k, v := range m {
				if str(dig(labels, k)) != str(v) {
					p.add("kubernetes: the %s selects %s=%v, which the pods do not carry", kind, k, v)
				}
			}
			if len(m) == 0 {
				p.add("kubernetes: the %s selects nothing", kind)
			}
		}
		ports, _ := dig(d.kube["Service"], "spec", "ports").([]any)
		for _, sp := range ports {
			if containerPort(d.container(), dig(sp, "targetPort")) != port(r["kubernetes"].cfg) {
				p.add("kubernetes: the Service targets %v, not FN_LISTEN's port", dig(sp, "targetPort"))
			}
		}
	},
	// Least privilege in every runtime.
	"privilege": func(d *deployment, r map[string]relay, p *problems) {
		if uid, _, _ := strings.Cut(d.dockerLast("USER"), ":"); number(uid) < 1 {
			p.add("Dockerfile: USER %q, want a numeric non-root user", d.dockerLast("USER"))
		}
		c, pod := d.container(), dig(d.kube["Deployment"], "spec", "template", "spec")
		for path, want := range map[string]string{"securityContext.runAsNonRoot": "true", "securityContext.readOnlyRootFilesystem": "true",
			"securityContext.allowPrivilegeEscalation": "false", "securityContext.capabilities.drop": `["ALL"]`, "resources.limits.memory": "1Gi"} {
			if got := str(dig(c, strings.Split(path, ".")...)); got != want && !(path == "resources.limits.memory" && got != "") {
				p.add("kubernetes: container %s is %q, want %s", path, got, want)
			}
		}
		if str(dig(pod, "securityContext", "runAsNonRoot")) != "true" {
			p.add("kubernetes: the pod does not set runAsNonRoot")
		}
		for file, doc := range d.compose {
			services, _ := dig(doc, "services").(map[string]any)
			for name, svc := range services {
				for _, pub := range strs(dig(svc, "ports")) {
					if !strings.HasPrefix(pub, "127.0.0.1:") {
						p.add("%s %s: port %s is published beyond loopback", file, name, pub)
					}
				}
			}
			for _, svc := range d.relayServices(file) {
				if str(dig(doc, "services", svc, "read_only")) != "true" || !slices.Contains(strs(dig(doc, "services", svc, "cap_drop")), "ALL") {
					p.add("%s %s: want read_only and cap_drop ALL", file, svc)
				}
			}
		}
		if last(d.unit["Service.DynamicUser"], "no") != "yes" && last(d.unit["Service.User"], "root") == "root" {
			p.add("deploy/relay.service: runs as root; want DynamicUser=yes or a User")
		}
		for _, f := range d.unit["Service.SystemCallFilter"] {
			if strings.HasPrefix(f, "~") && (strings.Contains(f, "@resources") || strings.Contains(f, "setrlimit")) {
				p.add("deploy/relay.service: SystemCallFilter=%s denies setrlimit, which raises the open-file limit", f)
			}
		}
	},
	// State lives where the runtime keeps it; builds are static and clean.
	"state": func(d *deployment, r map[string]relay, p *problems) {
		for where, dir := range map[string]string{"Dockerfile": d.dockerVolume(), "deploy/relay.service": "/var/lib/" + last(d.unit["Service.StateDirectory"], "")} {
			cfg := r[where].cfg
			for what, f := range map[string]string{"FN_DATABASE_URL": cfg.Database.Path, "FN_ISSUER_KEY_FILE": cfg.IssuerKeyFile} {
				if cfg.Database.Kind != config.SQLite || !strings.HasPrefix(filepath.Clean(f), dir+"/") || dir == "/var/lib/" {
					p.add("%s: %s %q is not in the state directory %q", where, what, f, dir)
				}
			}
		}
		from := d.docker[0].args
		if v := from[strings.Index(from, ":")+1 : strings.Index(from+" ", " ")]; !strings.HasPrefix(from, "golang:") || versionLess(v, d.goMod) {
			p.add("Dockerfile: builds with %q, older than go.mod's go %s", from, d.goMod)
		}
		if !slices.ContainsFunc(d.docker, func(in instruction) bool { return in.cmd == "ENV" && strings.Contains(in.args, "CGO_ENABLED=0") }) {
			p.add("Dockerfile: the build does not set CGO_ENABLED=0; the final image has no libc")
		}
		for _, must := range []string{".git", "data"} { // data may hold an issuer private key
			if !slices.Contains(d.ignore, must) {
				p.add(".dockerignore: %s is not excluded from the build context", must)
			}
		}
	},
}

func last(v []string, def string) string {
	if len(v) == 0 {
		return def
	}
	return v[len(v)-1]
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// field is the rest of the first line that starts with prefix, "" for none.
func field(lines [][]string, prefix ...string) string {
	for _, l := range lines {
		if len(l) >= len(prefix) && slices.Equal(l[:len(prefix)], prefix) {
			return strings.Join(l[len(prefix):], " ")
		}
	}
	return ""
}

// containerPort resolves a probe's or Service's port (a name or a number)
// to the container's port number.
func containerPort(c, ref any) string {
	ports, _ := dig(c, "ports").([]any)
	for _, p := range ports {
		if str(dig(p, "name")) == str(ref) || str(dig(p, "containerPort")) == str(ref) {
			return str(dig(p, "containerPort"))
		}
	}
	return ""
}

func (d *deployment) dockerVolume() string {
	v := execForm(d.dockerLast("VOLUME"))
	if len(v) == 0 {
		return "(none)"
	}
	return v[0]
}

// versionLess compares dotted versions: 1.25 < 1.26.0.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range min(len(as), len(bs), 2) {
		if x, y := number(as[i]), number(bs[i]); x != y {
			return x < y
		}
	}
	return false
}

func run(d *deployment) problems {
	var p problems
	r := map[string]relay{}
	for _, rl := range d.relays(&p) {
		r[rl.where] = rl
	}
	for _, name := range slices.Sorted(maps.Keys(checks)) {
		checks[name](d, r, &p)
	}
	return p
}

func TestDeployFiles(t *testing.T) {
	for _, msg := range run(load(t)) {
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

// TestHAProxyAccepts: HAProxy itself reads the configuration.
func TestHAProxyAccepts(t *testing.T) {
	out, err := exec.CommandContext(t.Context(), tool(t, "haproxy"), "-c", "-f", "haproxy.cfg").CombinedOutput()
	if err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
}

// TestSystemdAccepts: systemd reads the unit, and its exposure stays low.
func TestSystemdAccepts(t *testing.T) {
	bin := tool(t, "systemd-analyze")
	src, err := os.ReadFile("relay.service")
	if err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable() // verify wants ExecStart to exist
	unit := filepath.Join(t.TempDir(), "relay.service")
	body := strings.Replace(string(src), "ExecStart=/usr/local/bin/relay", "ExecStart="+self, 1)
	if err := os.WriteFile(unit, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), bin, "verify", "--man=no", unit).CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// Exposure is scored 0 (best) to 10; the threshold is in tenths.
	if out, err := exec.CommandContext(t.Context(), bin, "security", "--offline=yes", "--threshold=20", unit).CombinedOutput(); err != nil {
		t.Errorf("systemd-analyze security: exposure above 2.0 or unsupported: %v\n%s", err, out)
	}
}

// TestChecksCatchBreakage breaks the parsed files one way at a time and
// expects a check to say so: each row is a check seen red.
func TestChecksCatchBreakage(t *testing.T) {
	svc := func(d *deployment, file, name string) map[string]any {
		return dig(d.compose[file], "services", name).(map[string]any)
	}
	env := func(d *deployment, file, name string) map[string]any {
		return svc(d, file, name)["environment"].(map[string]any)
	}
	kenv := func(d *deployment, name string) map[string]any {
		list := dig(d.container(), "env").([]any)
		return list[slices.IndexFunc(list, func(e any) bool { return dig(e, "name") == name })].(map[string]any)
	}
	set := func(lines [][]string, prefix string, to ...string) {
		for i, l := range lines {
			if strings.HasPrefix(strings.Join(l, " "), prefix) {
				lines[i] = to
			}
		}
	}
	const one, fleet = "compose.yaml", "compose.replicas.yaml"
	for _, tt := range []struct {
		name, want string
		break_     func(d *deployment)
	}{
		{"unknown setting", "FN_LOG_FORMATS", func(d *deployment) { env(d, one, "relay")["FN_LOG_FORMATS"] = "json" }},
		{"bad value", "FN_SHUTDOWN_GRACE", func(d *deployment) { env(d, one, "relay")["FN_SHUTDOWN_GRACE"] = "soon" }},
		{"fleet without redis", "FN_REDIS_URL", func(d *deployment) { delete(env(d, fleet, "relay-1"), "FN_REDIS_URL") }},
		{"fleet on sqlite", "FN_DATABASE_URL", func(d *deployment) { env(d, fleet, "relay-2")["FN_DATABASE_URL"] = "sqlite:/data/r.db" }},
		{"replica count", "FN_RELAY_REPLICAS", func(d *deployment) { env(d, fleet, "relay-1")["FN_RELAY_REPLICAS"] = "3" }},
		{"compose grace", "drain", func(d *deployment) { svc(d, one, "relay")["stop_grace_period"] = "12s" }},
		{"compose grace raised", "drain", func(d *deployment) { env(d, one, "relay")["FN_SHUTDOWN_GRACE"] = "30s" }},
		{"compose nofile", "nofile", func(d *deployment) { svc(d, one, "relay")["ulimits"] = map[string]any{"nofile": 1024} }},
		{"compose probe", "healthcheck", func(d *deployment) {
			svc(d, one, "relay")["healthcheck"] = map[string]any{"test": []any{"CMD", "/relay", "probe", "http://127.0.0.1:8080/live"}}
		}},
		{"compose listen port", "healthcheck", func(d *deployment) { env(d, one, "relay")["FN_LISTEN"] = "0.0.0.0:8081" }},
		{"compose public port", "loopback", func(d *deployment) { svc(d, one, "relay")["ports"] = []any{"8080:8080"} }},
		{"compose writable", "read_only", func(d *deployment) { svc(d, one, "relay")["read_only"] = false }},
		{"lb nofile", "maxconn", func(d *deployment) { svc(d, fleet, "lb")["ulimits"] = map[string]any{"nofile": 65536} }},
		{"lb mount", "mount", func(d *deployment) { svc(d, fleet, "lb")["volumes"] = []any{"./haproxy.cfg:/etc/haproxy.cfg"} }},
		{"lb waits", "healthy", func(d *deployment) { delete(svc(d, fleet, "lb")["depends_on"].(map[string]any), "relay-2") }},
		{"haproxy server timeout", "timeout server", func(d *deployment) { set(d.haproxy["defaults"], "timeout server", "timeout", "server", "60000") }},
		{"haproxy client timeout", "timeout client", func(d *deployment) { set(d.haproxy["defaults"], "timeout client", "timeout", "client", "50s") }},
		{"haproxy check", "/ready", func(d *deployment) {
			set(d.haproxy["backend relays"], "http-check send", "http-check", "send", "meth", "GET", "uri", "/live")
		}},
		{"haproxy server", "relay-2", func(d *deployment) {
			set(d.haproxy["backend relays"], "server relay-2", "server", "relay-2", "relay-2:9090")
		}},
		{"haproxy close", "keep-alive", func(d *deployment) {
			d.haproxy["defaults"] = append(d.haproxy["defaults"], []string{"option", "http-server-close"})
		}},
		{"systemd stop", "TimeoutStopSec", func(d *deployment) { d.unit["Service.TimeoutStopSec"] = []string{"10s"} }},
		{"systemd nofile", "LimitNOFILE", func(d *deployment) { d.unit["Service.LimitNOFILE"] = []string{"1024:1024"} }},
		{"systemd root", "root", func(d *deployment) { delete(d.unit, "Service.DynamicUser") }},
		{"systemd setrlimit", "setrlimit", func(d *deployment) {
			d.unit["Service.SystemCallFilter"] = append(d.unit["Service.SystemCallFilter"], "~@resources")
		}},
		{"systemd database", "state directory", func(d *deployment) { d.unit["Service.Environment"][1] = "FN_DATABASE_URL=sqlite:/tmp/relay.db" }},
		{"systemd kill", "KillSignal", func(d *deployment) { d.unit["Service.KillSignal"] = []string{"SIGKILL"} }},
		{"docker user", "non-root", func(d *deployment) { d.docker = append(d.docker, instruction{"USER", "0"}) }},
		{"docker go", "go.mod", func(d *deployment) { d.docker[0].args = "golang:1.20 AS build" }},
		{"docker key file", "FN_ISSUER_KEY_FILE", func(d *deployment) { d.docker = append(d.docker, instruction{"ENV", "FN_ISSUER_KEY_FILE=/tmp/k"}) }},
		{"docker healthcheck", "HEALTHCHECK", func(d *deployment) { d.docker = append(d.docker, instruction{"ENV", "FN_LISTEN=0.0.0.0:8081"}) }},
		{"dockerignore", "data", func(d *deployment) {
			d.ignore = slices.DeleteFunc(d.ignore, func(s string) bool { return s == "data" })
		}},
		{"k8s replicas", "FN_RELAY_REPLICAS", func(d *deployment) { d.kube["Deployment"]["spec"].(map[string]any)["replicas"] = 3 }},
		{"k8s grace", "drain", func(d *deployment) {
			dig(d.kube["Deployment"], "spec", "template", "spec").(map[string]any)["terminationGracePeriodSeconds"] = 20
		}},
		{"k8s readiness", "readinessProbe", func(d *deployment) {
			dig(d.container(), "readinessProbe", "httpGet").(map[string]any)["path"] = "/live"
		}},
		{"k8s probe port", "livenessProbe", func(d *deployment) {
			dig(d.container(), "livenessProbe", "httpGet").(map[string]any)["port"] = "metrics"
		}},
		{"k8s literal key", "Secret", func(d *deployment) {
			kenv(d, "FN_ISSUER_KEYS")["value"], kenv(d, "FN_ISSUER_KEYS")["valueFrom"] = "abc", nil
		}},
		{"k8s secret key", "no issuer_keys", func(d *deployment) {
			dig(kenv(d, "FN_ISSUER_KEYS"), "valueFrom", "secretKeyRef").(map[string]any)["key"] = "issuer_keys"
		}},
		{"k8s service", "Service", func(d *deployment) { dig(d.kube["Service"], "spec", "selector").(map[string]any)["app"] = "relay" }},
		{"k8s pdb", "drained", func(d *deployment) { d.kube["PodDisruptionBudget"]["spec"] = map[string]any{"minAvailable": 2} }},
		{"k8s escalation", "allowPrivilegeEscalation", func(d *deployment) {
			dig(d.container(), "securityContext").(map[string]any)["allowPrivilegeEscalation"] = true
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := load(t)
			tt.break_(d)
			if p := run(d); !slices.ContainsFunc(p, func(m string) bool { return strings.Contains(m, tt.want) }) {
				t.Errorf("no problem mentions %q: %q", tt.want, p)
			}
		})
	}
}
