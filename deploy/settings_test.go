package deploy

import (
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
)

// The relay's settings, which the other checks take defaults and names
// from.

// settings are the relay's FN_* variables and their defaults, from
// README.md's settings table (generated from the relay's own list, and kept
// equal to it by a test of the main package). Reading the file rather than
// importing the relay keeps these checks independent of its code.
type settings map[string]string

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
