package servicetest

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/flamenet/relay/internal/procstat"
)

var (
	tsOnce sync.Once
	tsDir  string
	tsErr  error
)

// TypeScriptClient installs the TypeScript client's pinned dependencies
// (npm ci) and compiles it (npm run build), once per test process, and
// returns its package directory (client/typescript). A lock file beside
// it keeps test processes that run at once (go test ./...) from building
// it together. Without node or npm the test skips, or fails when services
// are required.
func TypeScriptClient(tb testing.TB) string {
	tb.Helper()
	for _, p := range []string{"node", "npm"} {
		if _, err := exec.LookPath(p); err != nil {
			Unavailable(tb, p, err)
		}
	}
	tsOnce.Do(func() { tsDir, tsErr = buildTypeScript() })
	if tsErr != nil {
		tb.Fatal(tsErr)
	}
	return tsDir
}

func buildTypeScript() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "client", "typescript")
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "relay-typescript-build.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	// One build per go test run: the test processes of one run share the
	// go command as their parent. A second npm ci would delete
	// node_modules under the node and Chromium processes of a package
	// whose build came first.
	// The parent is named by its pid and its start time, which a reused
	// pid does not share; where /proc cannot tell, every process builds.
	stamp := ""
	if started := procstat.StartTime(os.Getppid()); started != "" {
		stamp = filepath.Join(os.TempDir(), fmt.Sprintf("relay-typescript-built-%d-%s-%x", os.Getppid(), started, sha256.Sum256([]byte(dir))))
		if _, err := os.Stat(stamp); err == nil {
			return dir, nil
		}
	}
	for _, args := range [][]string{{"ci", "--no-audit", "--no-fund"}, {"run", "build"}} {
		cmd := exec.Command("npm", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("npm %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	if stamp != "" {
		if err := os.WriteFile(stamp, nil, 0o600); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// BuildRelay builds the relay command into dir, with extra go build flags
// (-ldflags ...), and returns the binary's path.
func BuildRelay(dir string, flags ...string) (string, error) {
	bin := filepath.Join(dir, "relay")
	args := append(append([]string{"build"}, flags...), "-o", bin, "github.com/flamenet/relay")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
}

// Relay builds the relay command into the test's own directory.
func Relay(tb testing.TB) string {
	tb.Helper()
	bin, err := BuildRelay(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	return bin
}

// RunWithRelay builds the relay into a directory of its own, sets *bin to
// it, runs the tests and removes the directory: a TestMain for packages
// whose tests run the binary (os.Exit(servicetest.RunWithRelay(m, &bin))).
func RunWithRelay(m *testing.M, bin *string) int {
	dir, err := os.MkdirTemp("", "relay-bin")
	if err == nil {
		*bin, err = BuildRelay(dir)
		defer os.RemoveAll(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
