package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// stack is a throwaway relay deployment the tester booted and owns.
type stack struct {
	urls   []string
	key    ed25519.PrivateKey
	dir    string
	relays []*relayProc
	// dropDB removes the throwaway Postgres database, if there is one.
	dropDB func(context.Context) error
	logger *slog.Logger
}

// relayProc is one relay child process.
type relayProc struct {
	cmd     *exec.Cmd
	url     string
	metrics string // its Prometheus endpoint, when asked for
	logPath string
	done    chan struct{} // closed when the process has exited
	waitErr error         // set before done closes
}

type stackParams struct {
	bin      string
	store    string // sqlite or postgres
	pg       string // admin URL of the Postgres server
	replicas int
	redis    string
	wait     int
	metrics  bool // give each relay a metrics listener
}

// findModuleRoot returns the directory of the go.mod around dir.
func findModuleRoot(ctx context.Context, dir string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "env", "GOMOD")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("%s is not inside a Go module; run from the relay checkout or pass -src", dir)
	}
	return filepath.Dir(mod), nil
}

// buildRelay builds the relay in src into dir and returns the binary.
func buildRelay(ctx context.Context, src, dir string) (string, error) {
	bin := filepath.Join(dir, "relay")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = src
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build relay in %s: %w\n%s", src, err, out)
	}
	return bin, nil
}

// bootStack starts a fresh stack: its own issuer key, temp data dir, free
// loopback ports, and for Postgres its own database. On error everything
// it started is torn down again.
func bootStack(ctx context.Context, p stackParams, logger *slog.Logger) (s *stack, err error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("issuer key: %w", err)
	}
	dir, err := os.MkdirTemp("", "relay-loadtest-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	s = &stack{key: priv, dir: dir, logger: logger}
	logger.Info("throwaway stack", "dir", dir, "store", p.store, "replicas", p.replicas)
	defer func() {
		if err != nil {
			s.close(context.WithoutCancel(ctx))
			s = nil
		}
	}()

	var dbURL string
	switch p.store {
	case "sqlite":
		dbURL = "sqlite:" + filepath.Join(dir, "relay.db")
	case "postgres":
		name := "relay_bench_" + time.Now().UTC().Format("20060102_150405") + "_" + randomHex(3)
		dbURL, s.dropDB, err = createDatabase(ctx, p.pg, name)
		if err != nil {
			return s, err
		}
		logger.Info("throwaway database created", "database", name)
	default:
		return s, fmt.Errorf("unknown store %q", p.store)
	}

	env := relayEnv(os.Environ())
	env = append(env,
		"FN_DATABASE_URL="+dbURL,
		"FN_ISSUER_KEYS="+base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)),
		"FN_RELAY_REPLICAS="+strconv.Itoa(p.replicas),
	)
	if p.replicas > 1 {
		env = append(env, "FN_REDIS_URL="+p.redis)
	}
	if p.wait > 60 {
		env = append(env, "FN_MAX_WAIT_SECS="+strconv.Itoa(p.wait))
	}
	for i := range p.replicas {
		// One after another: each is ready (its migrations applied)
		// before the next starts.
		r, err := startRelay(ctx, p.bin, dir, i, env, p.metrics)
		if r != nil {
			s.relays = append(s.relays, r)
		}
		if err != nil {
			return s, err
		}
		s.urls = append(s.urls, r.url)
		logger.Info("relay ready", "url", r.url, "pid", r.cmd.Process.Pid)
	}
	return s, nil
}

// relayEnv keeps the parent's environment except its FN_* settings, which
// belong to whatever relay the user runs, not to this throwaway one.
func relayEnv(parent []string) []string {
	var env []string
	for _, kv := range parent {
		if !strings.HasPrefix(kv, "FN_") {
			env = append(env, kv)
		}
	}
	return env
}

func startRelay(ctx context.Context, bin, dir string, i int, env []string, metrics bool) (*relayProc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	env = append(append([]string{}, env...), "FN_LISTEN="+addr)
	var metricsURL string
	if metrics {
		mport, err := freePort()
		if err != nil {
			return nil, err
		}
		maddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mport))
		env = append(env, "FN_METRICS_ADDR="+maddr)
		metricsURL = "http://" + maddr + "/metrics"
	}
	logPath := filepath.Join(dir, fmt.Sprintf("relay-%d.log", i))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("relay log: %w", err)
	}
	defer logFile.Close()
	workDir := filepath.Join(dir, fmt.Sprintf("relay-%d", i))
	if err := os.Mkdir(workDir, 0o700); err != nil {
		return nil, fmt.Errorf("relay dir: %w", err)
	}

	// Not CommandContext: the relay gets SIGTERM and time to drain, never a
	// bare kill, and Ctrl-C at the terminal reaches only this process (the
	// relay has its own process group) so that teardown stays in order.
	cmd := exec.Command(bin, "serve")
	cmd.Dir = workDir
	cmd.Env = env
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start relay: %w", err)
	}
	r := &relayProc{cmd: cmd, url: "http://" + addr, metrics: metricsURL, logPath: logPath, done: make(chan struct{})}
	go func() {
		r.waitErr = cmd.Wait()
		close(r.done)
	}()
	if err := r.awaitReady(ctx, 60*time.Second); err != nil {
		return r, err
	}
	return r, nil
}

// awaitReady polls GET /ready until it answers 200, the process exits, or
// the limit passes.
func (r *relayProc) awaitReady(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url+"/ready", nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-r.done:
			return fmt.Errorf("relay exited before it was ready (%v); log:\n%s", r.waitErr, tail(r.logPath, 20))
		case <-ctx.Done():
			return fmt.Errorf("relay at %s not ready: %w; log:\n%s", r.url, ctx.Err(), tail(r.logPath, 20))
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM and waits for a graceful exit; a relay that does not
// exit in time is killed, and that is an error.
func (r *relayProc) stop(limit time.Duration) error {
	select {
	case <-r.done:
		return fmt.Errorf("relay %s had already exited: %v", r.url, r.waitErr)
	default:
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal relay: %w", err)
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-r.done:
		if r.waitErr != nil {
			return fmt.Errorf("relay %s exited after SIGTERM: %w", r.url, r.waitErr)
		}
		return nil
	case <-t.C:
		_ = r.cmd.Process.Kill()
		<-r.done
		return fmt.Errorf("relay %s did not exit within %s of SIGTERM; killed", r.url, limit)
	}
}

// stopRelays stops every relay and joins their errors.
func (s *stack) stopRelays() error {
	var errs []error
	for _, r := range s.relays {
		if err := r.stop(20 * time.Second); err != nil {
			errs = append(errs, err)
			s.logger.Error("relay stop", "err", err, "log_tail", tail(r.logPath, 10))
		}
	}
	s.relays = nil
	return errors.Join(errs...)
}

// close tears everything down: relays, database, temp dir. It is safe to
// call after stopRelays.
func (s *stack) close(ctx context.Context) error {
	errs := []error{s.stopRelays()}
	if s.dropDB != nil {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		errs = append(errs, s.dropDB(ctx))
		cancel()
		s.dropDB = nil
	}
	errs = append(errs, os.RemoveAll(s.dir))
	return errors.Join(errs...)
}

// createDatabase creates name on the server at admin and returns its URL
// and how to drop it.
func createDatabase(ctx context.Context, admin, name string) (string, func(context.Context) error, error) {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", nil, fmt.Errorf("connect to %s: %w", redactURL(admin), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(admin)
	if err != nil {
		return "", nil, fmt.Errorf("postgres URL: %w", err)
	}
	u.Path = "/" + name
	drop := func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		// FORCE: a relay that was killed may leave sessions behind.
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		return nil
	}
	return u.String(), drop, nil
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before the relay binds; the relay then fails to start and says so.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
