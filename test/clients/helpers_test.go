package clients

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/internal/servicetest"
)

// tsDir is the TypeScript client's npm package.
const tsDir = "../../client/typescript"

var scratch string // removed after the tests

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "clients-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	scratch = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// need returns the path of an external program, or skips the test when it
// is missing (fails it when FN_TEST_REQUIRE_SERVICES=1).
func need(t *testing.T, name string, candidates ...string) string {
	t.Helper()
	for _, c := range append([]string{name}, candidates...) {
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	if servicetest.Required() {
		t.Fatalf("%s is not installed and FN_TEST_REQUIRE_SERVICES=1", name)
	}
	t.Skipf("%s is not installed; install it to run this test", name)
	return ""
}

var (
	relayOnce sync.Once
	relayBin  string
	relayErr  error
)

// relayBinary builds the relay from this checkout once per test process.
func relayBinary(t *testing.T) string {
	t.Helper()
	relayOnce.Do(func() {
		relayBin, relayErr = servicetest.BuildRelay(scratch)
	})
	if relayErr != nil {
		t.Fatal(relayErr)
	}
	return relayBin
}

// buildTypeScript installs the client's pinned devDependencies (npm ci)
// and compiles it into typescript/dist, once per test process.
func buildTypeScript(t *testing.T) {
	t.Helper()
	servicetest.TypeScriptClient(t)
}

// relayProc is `relay serve` on SQLite in a temporary directory, on a free
// loopback port, trusting a key made by `relay keygen`.
type relayProc struct {
	URL  string
	bin  string
	seed string
}

func startRelay(t *testing.T, env ...string) *relayProc {
	t.Helper()
	bin := relayBinary(t)
	out, err := exec.Command(bin, "keygen").Output()
	if err != nil {
		t.Fatalf("relay keygen: %v", err)
	}
	seed := regexp.MustCompile(`(?m)^private: (\S+)$`).FindSubmatch(out)
	pub := regexp.MustCompile(`(?m)^public: +(\S+)$`).FindSubmatch(out)
	if seed == nil || pub == nil {
		t.Fatalf("relay keygen printed no key pair: %s", out)
	}
	dir := t.TempDir()
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(cleanEnv(),
		"FN_LISTEN=127.0.0.1:0",
		"FN_DATABASE_URL=sqlite:"+filepath.Join(dir, "relay.db"),
		"FN_ISSUER_KEYS="+string(pub[1]),
		"FN_SQLITE_SYNCHRONOUS=NORMAL",
		"FN_SHUTDOWN_GRACE=2s",
	)
	cmd.Env = append(cmd.Env, env...)
	dieWithTest(cmd)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	addr := make(chan string, 1)
	var log strings.Builder
	var logMu sync.Mutex
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		re := regexp.MustCompile(`msg=serving addr=(http://\S+)`)
		for sc.Scan() {
			logMu.Lock()
			log.WriteString(sc.Text() + "\n")
			logMu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
	}()
	select {
	case u := <-addr:
		return &relayProc{URL: u, bin: bin, seed: string(seed[1])}
	case <-exited:
	case <-time.After(30 * time.Second):
	}
	logMu.Lock()
	defer logMu.Unlock()
	t.Fatalf("the relay did not start:\n%s", log.String())
	return nil
}

// token mints a device token with `relay token`.
func (r *relayProc) token(t *testing.T, household, device string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.bin, "token", "-household", household, "-device", device, "-ttl", "1h")
	cmd.Env = append(cleanEnv(), "FN_ISSUER_PRIVATE_KEY="+r.seed) // never on a command line
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("relay token: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// cleanEnv is this process's environment without its FN_* settings.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FN_") {
			env = append(env, kv)
		}
	}
	return env
}
