package deploy

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestSystemdAnalyze runs a tool; nothing it starts may outlive the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	for _, p := range []string{dockerfile, dockerignore, composeSingle, composeFleet, haproxyCfg, systemdUnit, caddySample, nginxSample} {
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
	"proxies":     checkProxySamples,
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

		{"nginx read timeout", nginxSample, "proxy_read_timeout 90s;", "proxy_read_timeout 60s;", "proxy_read_timeout"},
		{"nginx no read timeout", nginxSample, "        proxy_read_timeout 90s;\n", "", "proxy_read_timeout"},
		{"nginx read timeout minutes", nginxSample, "proxy_read_timeout 90s;", "proxy_read_timeout 1m;", "proxy_read_timeout"},
		{"nginx buffering", nginxSample, "        proxy_buffering off;\n", "", "proxy_buffering"},
		{"nginx http 1.0 upstream", nginxSample, "        proxy_http_version 1.1;\n", "", "proxy_http_version"},
		{"nginx closes upstream", nginxSample, "        proxy_set_header Connection \"\";\n", "", "Connection"},
		{"nginx no upstream keepalive", nginxSample, "    keepalive 256;\n", "", "keepalive"},
		{"nginx no forwarded for", nginxSample, "        proxy_set_header X-Forwarded-For $remote_addr;\n", "", "X-Forwarded-For"},
		{"nginx upstream port", nginxSample, "server 127.0.0.1:8080;", "server 127.0.0.1:9090;", "FN_LISTEN"},
		{"nginx plain http", nginxSample, "listen 443 ssl http2;", "listen 443;", "ssl"},
		{"caddy flush", caddySample, "\t\tflush_interval -1\n", "", "flush_interval"},
		{"caddy header timeout", caddySample, "response_header_timeout 90s", "response_header_timeout 30s", "response_header_timeout"},
		{"caddy buffers", caddySample, "\t\tflush_interval -1\n", "\t\tflush_interval -1\n\t\tbuffer_responses\n", "buffer"},
		{"caddy upstream port", caddySample, "{$RELAY_UPSTREAM:127.0.0.1:8080}", "{$RELAY_UPSTREAM:127.0.0.1:9090}", "FN_LISTEN"},

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
