package deploy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// The deployment files, by path from the repository root.
const (
	dockerfile    = "Dockerfile"
	dockerignore  = ".dockerignore"
	composeSingle = "compose.yaml"
	composeFleet  = "compose.replicas.yaml"
	haproxyCfg    = "deploy/haproxy.cfg"
	systemdUnit   = "deploy/relay.service"
	kubeDir       = "deploy/kubernetes"
)

// The least open-file limit a deployment gives the relay: a held poll is
// one file, two with several replicas.
const minNofile = 65536

// drainMargin is the least time a supervisor leaves past FN_SHUTDOWN_GRACE
// before SIGKILL: after the grace the relay still closes its store.
const drainMargin = 5 * time.Second

// files maps a path from the repository root to its content.
type files map[string]string

func loadFiles(tb testing.TB) files {
	tb.Helper()
	f := files{}
	for _, p := range []string{dockerfile, dockerignore, composeSingle, composeFleet, haproxyCfg, systemdUnit} {
		b, err := os.ReadFile(filepath.Join("..", p))
		if err != nil {
			tb.Fatal(err)
		}
		f[p] = string(b)
	}
	kube, err := filepath.Glob(filepath.Join("..", kubeDir, "*.yaml"))
	if err != nil || len(kube) == 0 {
		tb.Fatalf("no manifests in %s: %v", kubeDir, err)
	}
	for _, p := range kube {
		b, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		rel, _ := filepath.Rel("..", p)
		f[filepath.ToSlash(rel)] = string(b)
	}
	return f
}

// problems collects what the checks find, so one run reports all of them.
type problems []string

func (p *problems) add(format string, args ...any) {
	*p = append(*p, fmt.Sprintf(format, args...))
}

// check reads the files it needs and reports what is wrong with them.
type check func(f files, s settings, p *problems)

var checks = map[string]check{
	"dockerfile":  checkDockerfile,
	"compose":     checkComposeSingle,
	"replicas":    checkComposeFleet,
	"systemd":     checkSystemd,
	"kubernetes":  checkKubernetes,
	"environment": checkSettingNames,
}

func runChecks(f files, s settings) problems {
	var p problems
	for _, name := range slices.Sorted(maps.Keys(checks)) {
		checks[name](f, s, &p)
	}
	return p
}

func TestDeployFiles(t *testing.T) {
	f := loadFiles(t)
	s := relaySettings(t)
	for _, name := range slices.Sorted(maps.Keys(checks)) {
		t.Run(name, func(t *testing.T) {
			var p problems
			checks[name](f, s, &p)
			for _, msg := range p {
				t.Error(msg)
			}
		})
	}
}

// TestChecksCatchBreakage breaks one value at a time and expects a check to
// say so: each row is a check seen red. A row whose old text is no longer in
// the file fails too, so the table follows the files.
func TestChecksCatchBreakage(t *testing.T) {
	tests := []struct {
		name, file, old, new, want string
	}{
		{"dockerfile single stage", dockerfile, "FROM golang:1.26 AS build", "FROM gcr.io/distroless/static-debian12:nonroot AS build", "golang:1.26"},
		{"dockerfile cgo", dockerfile, "ENV CGO_ENABLED=0", "ENV CGO_ENABLED=1", "CGO_ENABLED=0"},
		{"dockerfile trimpath", dockerfile, "-trimpath ", "", "-trimpath"},
		{"dockerfile root user", dockerfile, "USER 65532:65532", "USER 0", "non-root"},
		{"dockerfile named user", dockerfile, "USER 65532:65532", "USER nonroot", "numeric"},
		{"dockerfile no user", dockerfile, "USER 65532:65532\n", "", "USER"},
		{"dockerfile listen loopback", dockerfile, "FN_LISTEN=0.0.0.0:8080", "FN_LISTEN=127.0.0.1:8080", "0.0.0.0"},
		{"dockerfile expose", dockerfile, "EXPOSE 8080 9090", "EXPOSE 9090", "EXPOSE"},
		{"dockerfile data owner", dockerfile, "--chown=65532:65532 /out/data /data", "/out/data /data", "/data"},
		{"dockerfile cmd", dockerfile, `CMD ["serve"]`, `CMD ["version"]`, "CMD"},
		{"dockerignore git", dockerignore, "\n.git\n", "\n", ".git"},
		{"dockerignore data", dockerignore, "\ndata\n", "\n", "data"},

		{"compose nofile", composeSingle, "soft: 65536", "soft: 1024", "nofile"},
		{"compose no ulimits", composeSingle, "    ulimits:\n      nofile:\n        soft: 65536\n        hard: 65536\n", "", "nofile"},
		{"compose healthcheck path", composeSingle, "probe\", \"http://127.0.0.1:8080/ready", "probe\", \"http://127.0.0.1:8080/live", "/ready"},
		{"compose healthcheck port", composeSingle, "probe\", \"http://127.0.0.1:8080/ready", "probe\", \"http://127.0.0.1:9090/ready", "port"},
		{"compose healthcheck binary", composeSingle, `["CMD", "/relay", "probe"`, `["CMD", "/bin/relay", "probe"`, "ENTRYPOINT"},
		{"compose stop grace", composeSingle, "stop_grace_period: 20s", "stop_grace_period: 10s", "stop_grace_period"},
		{"compose grace raised", composeSingle, "FN_SHUTDOWN_GRACE: 10s", "FN_SHUTDOWN_GRACE: 30s", "stop_grace_period"},
		{"compose build context", composeSingle, "context: .", "context: ./relay", "build"},
		{"compose build file", composeSingle, "dockerfile: Dockerfile", "dockerfile: Dockerfile.dev", "build"},
		{"compose postgres image", composeSingle, "image: postgres:17", "image: postgres:16", "postgres:17"},
		{"compose postgres check", composeSingle, `"pg_isready", `, "", "pg_isready"},
		{"compose depends healthy", composeSingle, "condition: service_healthy", "condition: service_started", "service_healthy"},
		{"compose issuer keys", composeSingle, "FN_ISSUER_KEYS: ${FN_ISSUER_KEYS:?", "FN_ISSUER_KEYS: ${FN_ISSUER_KEYS:-", "FN_ISSUER_KEYS"},
		{"compose port public", composeSingle, "- 127.0.0.1:8080:8080", "- 8080:8080", "127.0.0.1"},
		{"compose listen loopback", composeSingle, "FN_LISTEN: 0.0.0.0:8080", "FN_LISTEN: 127.0.0.1:8080", "0.0.0.0"},
		{"compose named volume", composeSingle, "\nvolumes:\n  postgres:\n", "\n", "named volume"},

		{"replicas one relay", composeFleet, "  relay-2: *relay\n", "", "two relays"},
		{"replicas count", composeFleet, `FN_RELAY_REPLICAS: "2"`, `FN_RELAY_REPLICAS: "3"`, "FN_RELAY_REPLICAS"},
		{"replicas no redis url", composeFleet, "    FN_REDIS_URL: redis://redis:6379/0\n", "", "FN_REDIS_URL"},
		{"replicas redis host", composeFleet, "FN_REDIS_URL: redis://redis:6379/0", "FN_REDIS_URL: redis://cache:6379/0", "FN_REDIS_URL"},
		{"replicas redis image", composeFleet, "image: redis:7", "image: redis:6", "redis:7"},
		{"replicas redis saves", composeFleet, `"--save", "", `, "", "persistence"},
		{"replicas nofile", composeFleet, "  ulimits:\n    nofile:\n      soft: 65536\n      hard: 65536\n", "  ulimits:\n    nofile: 4096\n", "nofile"},
		{"replicas lb waits", composeFleet, "      relay-2:\n        condition: service_healthy\n", "", "relay-2"},
		{"replicas lb config", composeFleet, "./deploy/haproxy.cfg:", "./haproxy.cfg:", "haproxy.cfg"},
		{"lb server timeout", haproxyCfg, "timeout server 90s", "timeout server 30s", "timeout server"},
		{"lb server timeout ms", haproxyCfg, "timeout server 90s", "timeout server 60000", "timeout server"},
		{"lb client timeout", haproxyCfg, "timeout client 90s", "timeout client 50s", "timeout client"},
		{"lb health path", haproxyCfg, "uri /ready", "uri /live", "/ready"},
		{"lb server missing", haproxyCfg, "    server relay-2 relay-2:8080\n", "", "relay-2"},
		{"lb server port", haproxyCfg, "server relay-1 relay-1:8080", "server relay-1 relay-1:9090", "relay-1"},
		{"lb closes upstream", haproxyCfg, "    option redispatch 1\n", "    option redispatch 1\n    option http-server-close\n", "keep-alive"},

		{"systemd nofile", systemdUnit, "LimitNOFILE=65536", "LimitNOFILE=1024", "LimitNOFILE"},
		{"systemd stop timeout", systemdUnit, "TimeoutStopSec=30s", "TimeoutStopSec=5s", "TimeoutStopSec"},
		{"systemd stop timeout min", systemdUnit, "TimeoutStopSec=30s", "TimeoutStopSec=10s", "TimeoutStopSec"},
		{"systemd protect system", systemdUnit, "ProtectSystem=strict", "ProtectSystem=full", "ProtectSystem"},
		{"systemd no new privileges", systemdUnit, "NoNewPrivileges=yes\n", "", "NoNewPrivileges"},
		{"systemd capabilities", systemdUnit, "CapabilityBoundingSet=\n", "CapabilityBoundingSet=CAP_NET_BIND_SERVICE\n", "CapabilityBoundingSet"},
		{"systemd families", systemdUnit, "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX", "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK", "RestrictAddressFamilies"},
		{"systemd setrlimit", systemdUnit, "SystemCallFilter=~@privileged", "SystemCallFilter=~@privileged @resources", "setrlimit"},
		{"systemd database", systemdUnit, "FN_DATABASE_URL=sqlite:/var/lib/relay/relay.db", "FN_DATABASE_URL=sqlite:/tmp/relay.db", "FN_DATABASE_URL"},
		{"systemd key file", systemdUnit, "FN_ISSUER_KEY_FILE=/var/lib/relay/issuer.key", "FN_ISSUER_KEY_FILE=/etc/relay/issuer.key", "FN_ISSUER_KEY_FILE"},
		{"systemd state dir", systemdUnit, "StateDirectory=relay\n", "", "StateDirectory"},
		{"systemd restart", systemdUnit, "Restart=on-failure", "Restart=no", "Restart"},
		{"systemd root", systemdUnit, "DynamicUser=yes", "User=root", "user"},

		{"k8s one replica", kubeDir + "/relay.yaml", "  replicas: 2", "  replicas: 1", "replicas"},
		{"k8s replicas mismatch", kubeDir + "/relay.yaml", "  replicas: 2", "  replicas: 3", "FN_RELAY_REPLICAS"},
		{"k8s readiness path", kubeDir + "/relay.yaml", "path: /ready", "path: /live", "readiness"},
		{"k8s liveness path", kubeDir + "/relay.yaml", "path: /live", "path: /ready", "liveness"},
		{"k8s probe port", kubeDir + "/relay.yaml", "path: /ready\n              port: http", "path: /ready\n              port: metrics", "readiness"},
		{"k8s grace", kubeDir + "/relay.yaml", "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds: 20", "terminationGracePeriodSeconds"},
		{"k8s grace no sleep room", kubeDir + "/relay.yaml", "seconds: 5", "seconds: 20", "terminationGracePeriodSeconds"},
		{"k8s pdb selector", kubeDir + "/relay.yaml", "  maxUnavailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: relay", "  maxUnavailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: relay-api", "PodDisruptionBudget"},
		{"k8s pdb blocks drains", kubeDir + "/relay.yaml", "  maxUnavailable: 1\n", "  minAvailable: 2\n", "PodDisruptionBudget"},
		{"k8s service target", kubeDir + "/relay.yaml", "targetPort: http", "targetPort: metrics", "Service"},
		{"k8s service selector", kubeDir + "/relay.yaml", "spec:\n  selector:\n    app.kubernetes.io/name: relay\n", "spec:\n  selector:\n    app: relay\n", "Service"},
		{"k8s non-root", kubeDir + "/relay.yaml", "        runAsNonRoot: true\n        runAsUser", "        runAsNonRoot: false\n        runAsUser", "runAsNonRoot"},
		{"k8s read-only root", kubeDir + "/relay.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "readOnlyRootFilesystem"},
		{"k8s escalation", kubeDir + "/relay.yaml", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true", "allowPrivilegeEscalation"},
		{"k8s capabilities", kubeDir + "/relay.yaml", `drop: ["ALL"]`, `drop: ["NET_RAW"]`, "capabilities"},
		{"k8s resources", kubeDir + "/relay.yaml", "              memory: 1Gi\n", "", "resources"},
		{"k8s issuer keys literal", kubeDir + "/relay.yaml", "- name: FN_ISSUER_KEYS\n              valueFrom:\n                secretKeyRef:\n                  name: relay\n                  key: issuer-keys", "- name: FN_ISSUER_KEYS\n              value: abc", "FN_ISSUER_KEYS"},
		{"k8s secret key", kubeDir + "/secret.example.yaml", "  database-url:", "  database_url:", "database-url"},
		{"k8s no redis", kubeDir + "/relay.yaml", "            - name: FN_REDIS_URL\n              valueFrom:\n                secretKeyRef:\n                  name: relay\n                  key: redis-url\n", "", "FN_REDIS_URL"},
		{"k8s listen port", kubeDir + "/relay.yaml", "value: 0.0.0.0:8080", "value: 0.0.0.0:8081", "FN_LISTEN"},

		{"unknown setting", composeSingle, "FN_LOG_FORMAT: json", "FN_LOG_FORMATS: json", "FN_LOG_FORMATS"},
	}
	orig := loadFiles(t)
	s := relaySettings(t)
	if p := runChecks(orig, s); len(p) > 0 {
		t.Fatalf("the files as they are fail the checks (see TestDeployFiles): %v", p)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if n := strings.Count(orig[tt.file], tt.old); n != 1 {
				t.Fatalf("%s holds %q %d times, want once", tt.file, tt.old, n)
			}
			f := maps.Clone(orig)
			f[tt.file] = strings.Replace(orig[tt.file], tt.old, tt.new, 1)
			p := runChecks(f, s)
			t.Logf("%q", p)
			if !slices.ContainsFunc(p, func(msg string) bool { return strings.Contains(msg, tt.want) }) {
				t.Errorf("no problem mentioning %q after the change; got %q", tt.want, p)
			}
		})
	}
}

// settings are the relay's FN_* variables and their defaults, from
// README.md's settings table (generated from the relay's own list, and kept
// equal to it by a test of the main package). Reading the file rather than
// importing the relay keeps these checks independent of its code.
type settings map[string]string

// specOnly are variables that SPEC.md names but the relay's settings table
// does not list yet.
var specOnly = []string{"FN_METRICS_ADDR"}

func relaySettings(tb testing.TB) settings {
	tb.Helper()
	s := settings{}
	row := regexp.MustCompile("^\\| `(FN_[A-Z0-9_]+)` \\| [^|]* \\| (?:`([^`]*)`|\\(empty\\)) \\|")
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(readme), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			s[m[1]] = m[2]
		}
	}
	for _, name := range []string{"FN_LISTEN", "FN_SHUTDOWN_GRACE", "FN_MAX_WAIT_SECS", "FN_RELAY_REPLICAS"} {
		if _, ok := s[name]; !ok {
			tb.Fatalf("README.md's settings table has no %s; the checks rely on it", name)
		}
	}
	for _, name := range specOnly {
		if _, ok := s[name]; !ok {
			s[name] = ""
		}
	}
	return s
}

// grace is FN_SHUTDOWN_GRACE as env sets it, or the relay's default.
func (s settings) grace(env map[string]string) (time.Duration, error) {
	v, ok := env["FN_SHUTDOWN_GRACE"]
	if !ok {
		v = s["FN_SHUTDOWN_GRACE"]
	}
	return relayDuration(v)
}

// maxWait is FN_MAX_WAIT_SECS as env sets it, or the relay's default.
func (s settings) maxWait(env map[string]string) (time.Duration, error) {
	v, ok := env["FN_MAX_WAIT_SECS"]
	if !ok {
		v = s["FN_MAX_WAIT_SECS"]
	}
	n, err := strconv.Atoi(v)
	return time.Duration(n) * time.Second, err
}

// relayDuration parses a duration as the relay does: Go syntax or whole
// seconds.
func relayDuration(v string) (time.Duration, error) {
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(v)
}

// listenPort is the port of FN_LISTEN as env sets it, or of the default.
func (s settings) listenPort(env map[string]string) string {
	v, ok := env["FN_LISTEN"]
	if !ok {
		v = s["FN_LISTEN"]
	}
	_, port, _ := net.SplitHostPort(v)
	return port
}

// ---- Dockerfile ----

type instruction struct {
	cmd  string // upper case
	args string
}

type stage struct {
	from, name string
	inst       []instruction
}

func parseDockerfile(src string) []stage {
	var stages []stage
	sc := bufio.NewScanner(strings.NewReader(src))
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{}
			for i := 0; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"):
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					st.name = f[i+1]
					i++
				case st.from == "":
					st.from = f[i]
				}
			}
			stages = append(stages, st)
			return
		}
		if len(stages) > 0 {
			stages[len(stages)-1].inst = append(stages[len(stages)-1].inst, in)
		}
	}
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if body, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	return stages
}

// execForm parses a JSON-array instruction argument, ["a", "b"].
func execForm(args string) ([]string, bool) {
	var out []string
	if err := yaml.Unmarshal([]byte(args), &out); err != nil || !strings.HasPrefix(strings.TrimSpace(args), "[") {
		return nil, false
	}
	return out, true
}

// envInstructions reads ENV k=v pairs (the form the Dockerfile uses).
func envInstructions(st stage) map[string]string {
	env := map[string]string{}
	for _, in := range st.inst {
		if in.cmd != "ENV" {
			continue
		}
		for _, kv := range strings.Fields(in.args) {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = strings.Trim(v, `"`)
			}
		}
	}
	return env
}

// entrypoint is the final stage's ENTRYPOINT, which the compose health
// checks call.
func entrypoint(f files) []string {
	st := parseDockerfile(f[dockerfile])
	if len(st) == 0 {
		return nil
	}
	for _, in := range st[len(st)-1].inst {
		if in.cmd == "ENTRYPOINT" {
			ep, _ := execForm(in.args)
			return ep
		}
	}
	return nil
}

func checkDockerfile(f files, s settings, p *problems) {
	stages := parseDockerfile(f[dockerfile])
	if len(stages) < 2 {
		p.add("Dockerfile: %d stages, want a multi-stage build (builder and final image)", len(stages))
		return
	}
	build, final := stages[0], stages[len(stages)-1]
	if !strings.HasPrefix(build.from, "golang:1.26") {
		p.add("Dockerfile: builder is FROM %q, want golang:1.26", build.from)
	}
	if build.name == "" {
		p.add("Dockerfile: the builder stage has no name for COPY --from")
	}
	cgoOff := envInstructions(build)["CGO_ENABLED"] == "0"
	var built bool
	for _, in := range build.inst {
		if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
			continue
		}
		built = true
		if strings.Contains(in.args, "CGO_ENABLED=0") {
			cgoOff = true
		}
		for _, flag := range []string{"-trimpath", "-s", "-w"} {
			if !slices.Contains(strings.Fields(strings.NewReplacer(`"`, " ", "'", " ").Replace(in.args)), flag) {
				p.add("Dockerfile: go build lacks %s", flag)
			}
		}
	}
	if !built {
		p.add("Dockerfile: the builder stage runs no go build")
	}
	if !cgoOff {
		p.add("Dockerfile: the build does not set CGO_ENABLED=0, so the binary may need libc")
	}
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") && final.from != "scratch" {
		p.add("Dockerfile: final image is %q, want distroless/static or scratch", final.from)
	}

	var user string
	for _, in := range final.inst {
		if in.cmd == "USER" {
			user = in.args
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	switch n, err := strconv.Atoi(uid); {
	case user == "":
		p.add("Dockerfile: the final stage sets no USER")
	case err != nil:
		p.add("Dockerfile: USER %q is not numeric (Kubernetes runAsNonRoot cannot check a name)", user)
	case n == 0:
		p.add("Dockerfile: USER %s is root, want non-root", user)
	}

	ep := entrypoint(f)
	if len(ep) != 1 {
		p.add("Dockerfile: ENTRYPOINT %q, want the binary alone in exec form", ep)
	}
	var copied, dataOwned, volume bool
	var cmd []string
	var exposed []string
	for _, in := range final.inst {
		fields := strings.Fields(in.args)
		switch in.cmd {
		case "COPY":
			dst := fields[len(fields)-1]
			if len(ep) == 1 && dst == ep[0] && slices.Contains(fields, "--from="+build.name) {
				copied = true
			}
			if dst == "/data" && uid != "" && slices.ContainsFunc(fields, func(f string) bool { return strings.HasPrefix(f, "--chown="+uid) }) {
				dataOwned = true
			}
		case "VOLUME":
			volume = strings.Contains(in.args, "/data")
		case "CMD":
			cmd, _ = execForm(in.args)
		case "EXPOSE":
			exposed = append(exposed, fields...)
		}
	}
	if !copied {
		p.add("Dockerfile: the final stage does not copy the built binary to the ENTRYPOINT %q", ep)
	}
	if !volume || !dataOwned {
		p.add("Dockerfile: want VOLUME /data created with --chown=<USER>, so SQLite can write there")
	}
	if !slices.Equal(cmd, []string{"serve"}) {
		p.add("Dockerfile: CMD %q, want [\"serve\"]", cmd)
	}
	env := envInstructions(final)
	if host, _, _ := net.SplitHostPort(env["FN_LISTEN"]); host != "0.0.0.0" {
		p.add("Dockerfile: FN_LISTEN=%q, want 0.0.0.0:PORT (the default listens on loopback only)", env["FN_LISTEN"])
	}
	if port := s.listenPort(env); !slices.Contains(exposed, port) || !slices.Contains(exposed, "9090") {
		p.add("Dockerfile: EXPOSE %q, want the API port %s and the metrics port 9090", exposed, port)
	}
	if db := env["FN_DATABASE_URL"]; db != "" && !strings.HasPrefix(db, "sqlite:/data/") {
		p.add("Dockerfile: FN_DATABASE_URL=%q is outside the /data volume", db)
	}

	var ignored []string
	for line := range strings.Lines(f[dockerignore]) {
		if line = strings.TrimSpace(line); line != "" && line[0] != '#' {
			ignored = append(ignored, line)
		}
	}
	for _, want := range []string{".git", "data"} {
		if !slices.Contains(ignored, want) {
			p.add(".dockerignore: lacks %s (history and local data, which may hold an issuer key, stay out of the image)", want)
		}
	}
}

// ---- compose ----

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

// ---- HAProxy ----

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

// ---- systemd ----

// unitDirectives maps each directive of one section to its values in order.
func unitDirectives(src, section string) map[string][]string {
	d := map[string][]string{}
	var cur string
	for line := range strings.Lines(src) {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			cur = strings.Trim(line, "[]")
		case cur == section:
			k, v, _ := strings.Cut(line, "=")
			d[k] = append(d[k], v)
		}
	}
	return d
}

// unitEnvironment reads Environment= assignments (double quotes allowed).
func unitEnvironment(values []string) map[string]string {
	env := map[string]string{}
	for _, v := range values {
		var words []string
		var cur strings.Builder
		quoted := false
		for _, r := range v + " " {
			switch {
			case r == '"':
				quoted = !quoted
			case r == ' ' && !quoted:
				if cur.Len() > 0 {
					words = append(words, cur.String())
				}
				cur.Reset()
			default:
				cur.WriteRune(r)
			}
		}
		for _, w := range words {
			if k, val, ok := strings.Cut(w, "="); ok {
				env[k] = val
			}
		}
	}
	return env
}

// systemdSpan parses a systemd time span: "30", "30s", "1min 30s", "500ms".
func systemdSpan(v string) (time.Duration, error) {
	units := map[string]time.Duration{"": time.Second, "ms": time.Millisecond, "s": time.Second, "sec": time.Second, "m": time.Minute, "min": time.Minute, "h": time.Hour}
	var total time.Duration
	re := regexp.MustCompile(`^(\d+)\s*([a-z]*)$`)
	for _, part := range strings.Fields(v) {
		m := re.FindStringSubmatch(part)
		if m == nil {
			return 0, fmt.Errorf("cannot read %q", v)
		}
		unit, ok := units[m[2]]
		if !ok {
			return 0, fmt.Errorf("unknown unit in %q", v)
		}
		n, _ := strconv.Atoi(m[1])
		total += time.Duration(n) * unit
	}
	if total == 0 {
		return 0, fmt.Errorf("no time span in %q", v)
	}
	return total, nil
}

func checkSystemd(f files, s settings, p *problems) {
	d := unitDirectives(f[systemdUnit], "Service")
	last := func(k string) (string, bool) {
		v := d[k]
		if len(v) == 0 {
			return "", false
		}
		return v[len(v)-1], true
	}
	for k, want := range map[string]string{
		"NoNewPrivileges":        "yes",
		"ProtectSystem":          "strict",
		"ProtectHome":            "yes",
		"PrivateTmp":             "yes",
		"PrivateDevices":         "yes",
		"ProtectKernelTunables":  "yes",
		"ProtectKernelModules":   "yes",
		"ProtectKernelLogs":      "yes",
		"LockPersonality":        "yes",
		"MemoryDenyWriteExecute": "yes",
		"Restart":                "on-failure",
		"KillSignal":             "SIGTERM",
		"StateDirectory":         "relay",
		"WorkingDirectory":       "/var/lib/relay",
		"CapabilityBoundingSet":  "",
	} {
		if v, ok := last(k); !ok || v != want {
			p.add("%s: %s=%q, want %s=%s", systemdUnit, k, v, k, want)
		}
	}
	// An empty CapabilityBoundingSet= only resets; a later value would add
	// capabilities back.
	if slices.ContainsFunc(d["CapabilityBoundingSet"], func(v string) bool { return v != "" }) {
		p.add("%s: CapabilityBoundingSet grants %q, want it empty", systemdUnit, d["CapabilityBoundingSet"])
	}
	if fams, _ := last("RestrictAddressFamilies"); !sameSet(strings.Fields(fams), []string{"AF_INET", "AF_INET6", "AF_UNIX"}) {
		p.add("%s: RestrictAddressFamilies=%q, want AF_INET AF_INET6 AF_UNIX", systemdUnit, fams)
	}
	filters := d["SystemCallFilter"]
	if !slices.Contains(filters, "@system-service") {
		p.add("%s: SystemCallFilter %q lacks @system-service", systemdUnit, filters)
	}
	for _, v := range filters {
		if strings.HasPrefix(v, "~") && (strings.Contains(v, "@resources") || strings.Contains(v, "setrlimit")) {
			p.add("%s: SystemCallFilter=%s denies setrlimit, which the relay needs to raise its open-file limit", systemdUnit, v)
		}
	}
	if dyn, _ := last("DynamicUser"); dyn != "yes" {
		if u, _ := last("User"); u == "" || u == "root" || u == "0" {
			p.add("%s: runs as user %q, want DynamicUser=yes or a dedicated user", systemdUnit, u)
		}
	}
	nofile, _ := last("LimitNOFILE")
	if n, err := strconv.Atoi(nofile); err != nil || n < minNofile {
		p.add("%s: LimitNOFILE=%q, want at least %d", systemdUnit, nofile, minNofile)
	}
	exec, _ := last("ExecStart")
	if args := strings.Fields(exec); len(args) < 2 || args[1] != "serve" {
		p.add("%s: ExecStart=%q, want the relay with serve", systemdUnit, exec)
	}

	env := unitEnvironment(d["Environment"])
	if env["FN_DATABASE_URL"] != "sqlite:/var/lib/relay/relay.db" {
		p.add("%s: FN_DATABASE_URL=%q, want sqlite:/var/lib/relay/relay.db (the state directory)", systemdUnit, env["FN_DATABASE_URL"])
	}
	if !strings.HasPrefix(env["FN_ISSUER_KEY_FILE"], "/var/lib/relay/") {
		p.add("%s: FN_ISSUER_KEY_FILE=%q, want it in the state directory /var/lib/relay", systemdUnit, env["FN_ISSUER_KEY_FILE"])
	}
	grace, err := s.grace(env)
	if err != nil {
		p.add("%s: FN_SHUTDOWN_GRACE: %v", systemdUnit, err)
	}
	stop, _ := last("TimeoutStopSec")
	if d, err := systemdSpan(stop); err != nil || d < grace+drainMargin {
		p.add("%s: TimeoutStopSec=%q, want at least FN_SHUTDOWN_GRACE (%v) + %v before SIGKILL", systemdUnit, stop, grace, drainMargin)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestSystemdAnalyze runs systemd's own checks on the unit where
// systemd-analyze is installed: verify (unknown keys, bad values) and the
// security exposure score.
func TestSystemdAnalyze(t *testing.T) {
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	src, err := os.ReadFile(filepath.Join("..", systemdUnit))
	if err != nil {
		t.Fatal(err)
	}
	// verify wants ExecStart to exist: stand this test binary in for the
	// relay.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(t.TempDir(), "relay.service")
	body := strings.Replace(string(src), "ExecStart=/usr/local/bin/relay ", "ExecStart="+self+" ", 1)
	if body == string(src) {
		t.Fatal("ExecStart=/usr/local/bin/relay not found in the unit")
	}
	if err := os.WriteFile(unit, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	// verify exits 0 on unknown keys and unreadable values; it only warns.
	out, err := exec.CommandContext(ctx, tool, "verify", "--man=no", unit).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// Exposure is scored 0 (best) to 10; the threshold is in tenths.
	out, err = exec.CommandContext(ctx, tool, "security", "--offline=yes", "--threshold=20", unit).CombinedOutput()
	switch {
	case err == nil:
	case bytes.Contains(out, []byte("Overall exposure level")):
		t.Errorf("systemd-analyze security: exposure above 2.0\n%s", out)
	default:
		t.Skipf("systemd-analyze security --offline unsupported here: %v\n%s", err, out)
	}
}

// ---- Kubernetes ----

type k8sMeta struct {
	Name      string            `yaml:"name"`
	Namespace string            `yaml:"namespace"`
	Labels    map[string]string `yaml:"labels"`
}

type k8sObject struct {
	file       string
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Metadata   k8sMeta           `yaml:"metadata"`
	Spec       yaml.Node         `yaml:"spec"`
	StringData map[string]string `yaml:"stringData"`
	Data       map[string]string `yaml:"data"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

// intOrString is a port, a PDB count, and the like: a number or a name.
type intOrString string

func (v *intOrString) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a number or a name", n.Line)
	}
	*v = intOrString(n.Value)
	return nil
}

type deploymentSpec struct {
	Replicas *int          `yaml:"replicas"`
	Selector labelSelector `yaml:"selector"`
	Template struct {
		Metadata k8sMeta `yaml:"metadata"`
		Spec     podSpec `yaml:"spec"`
	} `yaml:"template"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               k8sSecurity    `yaml:"securityContext"`
	Containers                    []k8sContainer `yaml:"containers"`
}

type k8sSecurity struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	Capabilities             struct {
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
}

type k8sContainer struct {
	Name  string          `yaml:"name"`
	Image string          `yaml:"image"`
	Ports []containerPort `yaml:"ports"`
	Env   []struct {
		Name      string  `yaml:"name"`
		Value     *string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	Lifecycle      struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext k8sSecurity `yaml:"securityContext"`
}

type containerPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type servicePort struct {
	Port       int         `yaml:"port"`
	TargetPort intOrString `yaml:"targetPort"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string      `yaml:"path"`
		Port intOrString `yaml:"port"`
	} `yaml:"httpGet"`
}

type serviceSpec struct {
	Selector map[string]string `yaml:"selector"`
	Ports    []servicePort     `yaml:"ports"`
}

type pdbSpec struct {
	MinAvailable   *intOrString  `yaml:"minAvailable"`
	MaxUnavailable *intOrString  `yaml:"maxUnavailable"`
	Selector       labelSelector `yaml:"selector"`
}

func parseManifests(f files, p *problems) []k8sObject {
	var objs []k8sObject
	for _, name := range slices.Sorted(maps.Keys(f)) {
		if !strings.HasPrefix(name, kubeDir+"/") {
			continue
		}
		dec := yaml.NewDecoder(strings.NewReader(f[name]))
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				p.add("%s: %v", name, err)
				break
			}
			if o.Kind == "" {
				continue
			}
			o.file = name
			objs = append(objs, o)
		}
	}
	return objs
}

// subset reports whether every label of sel is in labels (and sel selects
// something).
func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func checkKubernetes(f files, s settings, p *problems) {
	objs := parseManifests(f, p)
	byKind := map[string][]k8sObject{}
	for _, o := range objs {
		byKind[o.Kind] = append(byKind[o.Kind], o)
	}
	for _, kind := range []string{"Deployment", "Service", "PodDisruptionBudget", "Secret"} {
		if len(byKind[kind]) != 1 {
			p.add("%s: %d objects of kind %s, want one", kubeDir, len(byKind[kind]), kind)
			return
		}
	}
	dep := byKind["Deployment"][0]
	var spec deploymentSpec
	if err := dep.Spec.Decode(&spec); err != nil {
		p.add("%s: Deployment: %v", dep.file, err)
		return
	}
	where := dep.file + ": Deployment " + dep.Metadata.Name
	pod := spec.Template.Spec
	podLabels := spec.Template.Metadata.Labels
	if !subset(spec.Selector.MatchLabels, podLabels) {
		p.add("%s: selector %v does not select its own pods %v", where, spec.Selector.MatchLabels, podLabels)
	}
	if len(pod.Containers) != 1 {
		p.add("%s: %d containers, want the relay alone", where, len(pod.Containers))
		return
	}
	c := pod.Containers[0]
	env := map[string]string{}
	secretRefs := map[string][2]string{}
	for _, e := range c.Env {
		switch {
		case e.Value != nil:
			env[e.Name] = *e.Value
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "(secret)"
			secretRefs[e.Name] = [2]string{e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key}
		}
	}

	replicas := 1
	if spec.Replicas != nil {
		replicas = *spec.Replicas
	}
	if replicas < 2 {
		p.add("%s: replicas %d, want two or more for a fleet", where, replicas)
	}
	if env["FN_RELAY_REPLICAS"] != strconv.Itoa(replicas) {
		p.add("%s: FN_RELAY_REPLICAS=%q, want %d, the Deployment's replicas", where, env["FN_RELAY_REPLICAS"], replicas)
	}
	if env["FN_REDIS_URL"] == "" {
		p.add("%s: no FN_REDIS_URL; several replicas wake each other through Redis", where)
	}
	secret := byKind["Secret"][0]
	for _, name := range []string{"FN_DATABASE_URL", "FN_ISSUER_KEYS"} {
		ref, ok := secretRefs[name]
		if !ok {
			p.add("%s: %s is not read from a Secret", where, name)
			continue
		}
		_, inString := secret.StringData[ref[1]]
		_, inData := secret.Data[ref[1]]
		if ref[0] != secret.Metadata.Name || (!inString && !inData) {
			p.add("%s: %s reads Secret %s key %s, which %s does not define", where, name, ref[0], ref[1], secret.file)
		}
	}

	// Ports: the API port is FN_LISTEN's, and probes and the Service aim
	// at it by name or number.
	if host, _, _ := net.SplitHostPort(env["FN_LISTEN"]); host != "0.0.0.0" {
		p.add("%s: FN_LISTEN=%q, want 0.0.0.0:PORT so the kubelet and Service reach it", where, env["FN_LISTEN"])
	}
	apiPort := s.listenPort(env)
	var declared bool
	isAPIPort := func(v intOrString) bool {
		for _, cp := range c.Ports {
			if (string(v) == cp.Name || string(v) == strconv.Itoa(cp.ContainerPort)) && strconv.Itoa(cp.ContainerPort) == apiPort {
				return true
			}
		}
		return false
	}
	for _, cp := range c.Ports {
		declared = declared || strconv.Itoa(cp.ContainerPort) == apiPort
	}
	if !declared {
		p.add("%s: no containerPort for FN_LISTEN's port %s", where, apiPort)
	}
	if _, mport, _ := net.SplitHostPort(env["FN_METRICS_ADDR"]); mport != "" && !slices.ContainsFunc(c.Ports, func(cp containerPort) bool {
		return strconv.Itoa(cp.ContainerPort) == mport
	}) {
		p.add("%s: no containerPort for FN_METRICS_ADDR's port %s", where, mport)
	}
	for _, pr := range []struct {
		name, path string
		probe      *k8sProbe
	}{{"readiness", "/ready", c.ReadinessProbe}, {"liveness", "/live", c.LivenessProbe}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			p.add("%s: no %s probe, want an HTTP GET of %s on the API port %s", where, pr.name, pr.path, apiPort)
			continue
		}
		if get := pr.probe.HTTPGet; get.Path != pr.path || !isAPIPort(get.Port) {
			p.add("%s: %s probe GETs %s on port %s, want %s on the API port %s", where, pr.name, get.Path, get.Port, pr.path, apiPort)
		}
	}

	grace, err := s.grace(env)
	if err != nil {
		p.add("%s: FN_SHUTDOWN_GRACE: %v", where, err)
	}
	var sleep time.Duration
	if ps := c.Lifecycle.PreStop; ps != nil && ps.Sleep != nil {
		sleep = time.Duration(ps.Sleep.Seconds) * time.Second
	}
	// The countdown starts before preStop; the drain starts after it.
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < sleep+grace+drainMargin {
		p.add("%s: terminationGracePeriodSeconds %v, want at least the preStop sleep (%v) + FN_SHUTDOWN_GRACE (%v) + %v", where, derefInt(g), sleep, grace, drainMargin)
	}

	nonRoot := (pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot) ||
		(c.SecurityContext.RunAsNonRoot != nil && *c.SecurityContext.RunAsNonRoot)
	for _, sc := range []k8sSecurity{pod.SecurityContext, c.SecurityContext} {
		if sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot || sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			nonRoot = false
		}
	}
	if !nonRoot {
		p.add("%s: want runAsNonRoot: true and no runAsUser 0", where)
	}
	if v := c.SecurityContext.ReadOnlyRootFilesystem; v == nil || !*v {
		p.add("%s: want readOnlyRootFilesystem: true", where)
	}
	if v := c.SecurityContext.AllowPrivilegeEscalation; v == nil || *v {
		p.add("%s: want allowPrivilegeEscalation: false", where)
	}
	if !slices.Contains(c.SecurityContext.Capabilities.Drop, "ALL") {
		p.add("%s: capabilities drop %q, want ALL", where, c.SecurityContext.Capabilities.Drop)
	}
	for _, r := range []string{"cpu", "memory"} {
		if c.Resources.Requests[r] == "" || c.Resources.Limits[r] == "" {
			p.add("%s: resources want a %s request and limit", where, r)
		}
	}

	svc := byKind["Service"][0]
	var ss serviceSpec
	if err := svc.Spec.Decode(&ss); err != nil {
		p.add("%s: Service: %v", svc.file, err)
	} else {
		if !subset(ss.Selector, podLabels) {
			p.add("%s: Service %s selects %v, not the relay pods %v", svc.file, svc.Metadata.Name, ss.Selector, podLabels)
		}
		if len(ss.Ports) == 0 || !slices.ContainsFunc(ss.Ports, func(sp servicePort) bool {
			return isAPIPort(sp.TargetPort)
		}) {
			p.add("%s: Service %s targets no port that is the relay's API port %s", svc.file, svc.Metadata.Name, apiPort)
		}
	}

	pdb := byKind["PodDisruptionBudget"][0]
	var ps pdbSpec
	if err := pdb.Spec.Decode(&ps); err != nil {
		p.add("%s: PodDisruptionBudget: %v", pdb.file, err)
		return
	}
	where = pdb.file + ": PodDisruptionBudget " + pdb.Metadata.Name
	if !subset(ps.Selector.MatchLabels, podLabels) {
		p.add("%s: selects %v, not the relay pods %v", where, ps.Selector.MatchLabels, podLabels)
	}
	switch {
	case (ps.MinAvailable == nil) == (ps.MaxUnavailable == nil):
		p.add("%s: want exactly one of minAvailable and maxUnavailable", where)
	case ps.MinAvailable != nil:
		// minAvailable equal to the replicas blocks every node drain.
		if n, err := strconv.Atoi(string(*ps.MinAvailable)); err != nil || n < 1 || n >= replicas {
			p.add("%s: minAvailable %q, want from 1 to replicas-1 (%d)", where, *ps.MinAvailable, replicas-1)
		}
	default:
		if n, err := strconv.Atoi(string(*ps.MaxUnavailable)); err != nil || n < 1 || n >= replicas {
			p.add("%s: maxUnavailable %q, want from 1 to replicas-1 (%d)", where, *ps.MaxUnavailable, replicas-1)
		}
	}

	ns := dep.Metadata.Namespace
	for _, o := range objs {
		if o.Metadata.Namespace != ns {
			p.add("%s: %s %s is in namespace %q, the Deployment in %q", o.file, o.Kind, o.Metadata.Name, o.Metadata.Namespace, ns)
		}
	}
}

func derefInt(p *int) any {
	if p == nil {
		return "unset"
	}
	return *p
}

// ---- settings ----

// checkSettingNames wants every FN_* variable the files set to be one the
// relay reads, so a typo does not silently leave a default in place.
func checkSettingNames(f files, s settings, p *problems) {
	name := regexp.MustCompile(`\bFN_[A-Z0-9_]+`)
	for _, file := range slices.Sorted(maps.Keys(f)) {
		if file == dockerignore {
			continue
		}
		for i, line := range strings.Split(f[file], "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			for _, n := range name.FindAllString(line, -1) {
				// ${FN_ISSUER_KEYS:?...} in compose is the caller's
				// environment, named like the setting it fills.
				if _, ok := s[n]; !ok {
					p.add("%s:%d: %s is not a relay setting", file, i+1, n)
				}
			}
		}
	}
}
