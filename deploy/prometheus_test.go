package deploy

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/flamenet/relay/internal/servicetest"
	"github.com/flamenet/relay/token"
)

const (
	alertRules     = "prometheus/alerts.yaml"
	alertRuleTests = "prometheus/alerts_test.yaml"
	dashboardFile  = "grafana/relay.json"
)

// tool finds an external program, or skips the test without it (fails
// when FN_TEST_REQUIRE_SERVICES=1).
func tool(t *testing.T, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if servicetest.Required() {
			t.Fatalf("%s not found and FN_TEST_REQUIRE_SERVICES=1 (Debian package %s)", name, pkg)
		}
		t.Skipf("%s not found (Debian package %s); install it to run this test", name, pkg)
	}
	return path
}

// TestAlertRules: Prometheus accepts the rules, and their unit tests pass:
// each alert fires on the relay it should and stays silent on healthy
// relays and on junk traffic.
func TestAlertRules(t *testing.T) {
	promtool := tool(t, "promtool", "prometheus")
	for _, args := range [][]string{{"check", "rules", filepath.Base(alertRules)}, {"test", "rules", filepath.Base(alertRuleTests)}} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Dir = filepath.Dir(alertRules)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatalf("%s: %v", alertRules, err)
	}
	return rf
}

var (
	metricsLogLine  = regexp.MustCompile(`msg=metrics addr=http://(\S+)/metrics`)
	servingLogLine  = regexp.MustCompile(`msg=serving addr=http://(\S+)`)
	docAlertSection = regexp.MustCompile(`(?m)^### (Relay[A-Za-z]+)$`)
	docAlertName    = regexp.MustCompile(`\bRelay[A-Z][A-Za-z]+\b`)
)

// TestAlertsDocumented: every alert has a severity, a summary, and a
// description naming its runbook section in docs/OPERATIONS.md, which
// exists; every alert the docs name is a rule.
func TestAlertsDocumented(t *testing.T) {
	b, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	sections := map[string]bool{}
	for _, m := range docAlertSection.FindAllStringSubmatch(doc, -1) {
		sections[m[1]] = true
	}
	rules := map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = true
			switch r.Labels["severity"] {
			case "critical", "warning", "info":
			default:
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary", r.Alert)
			}
			if want := "Runbook: docs/OPERATIONS.md, section " + r.Alert + "."; !strings.Contains(r.Annotations["description"], want) {
				t.Errorf("%s: the description does not say %q", r.Alert, want)
			}
			if !sections[r.Alert] {
				t.Errorf("%s: docs/OPERATIONS.md has no section \"### %s\"", r.Alert, r.Alert)
			}
		}
	}
	for _, name := range docAlertName.FindAllString(doc, -1) {
		if !rules[name] {
			t.Errorf("docs/OPERATIONS.md names alert %s, which %s does not have", name, alertRules)
		}
	}
}

// family is a metric family the relay exports, with the label names its
// series carry.
type family struct {
	kind   string // counter, gauge, histogram, ...
	labels map[string]bool
}

// relayFamilies starts the relay binary as a fleet member (Postgres, a
// Redis of its own), sends it traffic so that labelled series exist, and
// returns the families its metrics listener serves.
func relayFamilies(t *testing.T) map[string]*family {
	t.Helper()
	db := servicetest.PostgresDatabase(t)
	rds := servicetest.StartRedis(t)
	bin := servicetest.Relay(t)
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve")
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"FN_LISTEN=127.0.0.1:0", "FN_METRICS_ADDR=127.0.0.1:0",
		"FN_DATABASE_URL=" + db, "FN_RELAY_REPLICAS=2", "FN_REDIS_URL=" + rds.URL(),
		"FN_ISSUER_KEYS=" + base64.StdEncoding.EncodeToString(pub),
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	addrs := make(chan [2]string, 1)
	go func() {
		defer close(exited)
		var metrics string
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := metricsLogLine.FindStringSubmatch(sc.Text()); m != nil {
				metrics = m[1]
			}
			if m := servingLogLine.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- [2]string{m[1], metrics}
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	var api, metrics string
	select {
	case a := <-addrs:
		api, metrics = a[0], a[1]
	case <-exited:
		t.Fatal("the relay exited before serving")
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not start")
	}

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	do := func(method, path, device, body string) int {
		t.Helper()
		tok := "junk"
		if device != "" {
			if tok, err = token.Mint(key, token.Claims{Household: "home", Device: device, IssuedAt: time.Now(), Expires: time.Now().Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
		}
		req, err := http.NewRequest(method, "http://"+api+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, d := range []string{"phone", "laptop"} {
		if code := do("POST", "/v1/register", d, ""); code != 200 {
			t.Fatalf("register %s: %d", d, code)
		}
	}
	if code := do("POST", "/v1/send", "laptop", `{"id":"m1","to":["phone"],"payload":"eA=="}`); code != 202 {
		t.Fatalf("send: %d", code)
	}
	if code := do("GET", "/v1/poll?wait=1", "phone", ""); code != 200 {
		t.Fatalf("poll: %d", code)
	}
	if code := do("POST", "/v1/ack", "phone", `{"cursor":1}`); code != 204 {
		t.Fatalf("ack: %d", code)
	}
	if code := do("GET", "/v1/poll?wait=0", "", ""); code != 401 {
		t.Fatalf("poll with a junk token: %d", code)
	}

	resp, err := client.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	fams := map[string]*family{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			f := strings.Fields(rest)
			fams[f[0]] = &family{kind: f[1], labels: map[string]bool{}}
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, _ := strings.Cut(strings.Fields(line)[0], "{")
		f := fams[familyOf(name, fams)]
		if f == nil {
			t.Fatalf("series %s before its # TYPE line", name)
		}
		for _, kv := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
			if k, _, ok := strings.Cut(kv, "="); ok {
				f.labels[k] = true
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(fams) < 40 || fams["fn_redis_healthy"] == nil {
		t.Fatalf("the scrape has %d families, without the Redis hub's: not a fleet member's", len(fams))
	}
	return fams
}

// familyOf is the family a series name belongs to: a histogram's or
// summary's _bucket, _sum and _count series belong to it.
func familyOf(name string, fams map[string]*family) string {
	if _, ok := fams[name]; ok {
		return name
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f := fams[base]; f != nil && (f.kind == "histogram" || f.kind == "summary") {
				return base
			}
		}
	}
	return ""
}

// synthetic are series Prometheus makes itself, not the relay.
var synthetic = map[string]bool{"up": true}

// checkQueried fails for a metric expr reads that the relay does not
// export, or a label its matchers use that the family's series lack (job
// and instance come from the scrape).
func checkQueried(t *testing.T, where, expr string, fams map[string]*family) (checked int) {
	t.Helper()
	for _, s := range promSelectors(expr) {
		if synthetic[s.metric] {
			continue
		}
		checked++
		name := familyOf(s.metric, fams)
		if name == "" {
			t.Errorf("%s reads %s, which the relay does not export", where, s.metric)
			continue
		}
		for _, l := range s.labels {
			if l != "job" && l != "instance" && l != "le" && !fams[name].labels[l] {
				t.Errorf("%s matches label %s of %s, which its series do not have", where, l, s.metric)
			}
		}
	}
	return checked
}

// TestQueriedMetricsExist: every metric the alert rules and the dashboard
// query is one a running relay exports.
func TestQueriedMetricsExist(t *testing.T) {
	fams := relayFamilies(t)
	t.Run("alerts", func(t *testing.T) {
		n := 0
		for _, g := range loadRules(t).Groups {
			for _, r := range g.Rules {
				n += checkQueried(t, fmt.Sprintf("%s: %s", alertRules, r.Alert), r.Expr, fams)
			}
		}
		if n < 30 {
			t.Fatalf("only %d metrics read by the rules: the extraction is broken", n)
		}
	})
	t.Run("dashboard", func(t *testing.T) {
		n := 0
		for _, q := range dashboardQueries(t) {
			n += checkQueried(t, dashboardFile+": "+q.panel, q.expr, fams)
		}
		if n < 20 {
			t.Fatalf("only %d metrics read by the dashboard: the extraction is broken", n)
		}
	})
}
