package deploy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// deploy/relay.service, the unit for one household on SQLite.

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
