// Package stack is the load tester's throwaway deployment: the relays it
// builds and starts (each under a memory cap, if asked), their database,
// and for a fault campaign a Postgres and a Redis of its own; and the
// faults done to them: a crash and restart, a pause. It reads what its
// relays cost and tears everything down again.
package stack

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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	relayconfig "github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/internal/procstat"
	"github.com/flamenet/relay/loadtest/internal/wait"
	"github.com/flamenet/relay/loadtest/report"
)

// Stack is a throwaway relay deployment the tester booted and owns.
type Stack struct {
	urls []string
	key  ed25519.PrivateKey
	dir  string
	// dropDB removes the throwaway Postgres database, if there is one.
	dropDB func(context.Context) error
	logger *slog.Logger

	// mu guards the slots' processes, which a crash replaces while the
	// meter reads them.
	mu    sync.Mutex
	slots []*slot
}

// slot is one replica: its address, data and settings, which outlive its
// processes, and the process running it now.
type slot struct {
	spec relaySpec
	cap  *MemCap // nil: no memory cap
	cur  *Relay
	// Of this slot's processes that have exited: CPU time, and the
	// highest peak resident memory.
	deadCPU  time.Duration
	deadPeak int64
	stopped  bool
	// exits describes each exit nobody asked for.
	exits []string
}

// relaySpec is how a slot's relay is started, the same on every restart.
type relaySpec struct {
	bin     string
	i       int
	env     []string
	addr    string
	metrics string // its metrics listener's address, when asked for
	workDir string
	logPath string
}

// Relay is one relay child process.
type Relay struct {
	cmd     *exec.Cmd
	url     string
	metrics string // its Prometheus endpoint, when asked for
	logPath string
	done    chan struct{} // closed when the process has exited
	waitErr error         // set before done closes
	// intended is set before the tester stops or kills the process, so
	// that its exit is not taken for a crash.
	intended atomic.Bool
}

// Params are what a stack is booted with.
type Params struct {
	Bin      string // the relay binary
	Store    string // sqlite or postgres
	PG       string // admin URL of the Postgres server
	Replicas int
	Redis    string   // Redis URL, for more than one replica
	Wait     int      // the longest poll wait asked for, in seconds
	Metrics  bool     // give each relay a metrics listener
	Env      []string // added to each relay's environment, last
	Memory   int64    // bytes; 0: no cap
	// MemoryMethod forces how the cap is enforced ([CapRlimitAS]); empty
	// takes the best available.
	MemoryMethod string
}

// FindModuleRoot returns the directory of the go.mod around dir.
func FindModuleRoot(ctx context.Context, dir string) (string, error) {
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

// BuildRelay builds the relay in src into dir and returns the binary.
func BuildRelay(ctx context.Context, src, dir string) (string, error) {
	bin := filepath.Join(dir, "relay")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = src
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build relay in %s: %w\n%s", src, err, out)
	}
	return bin, nil
}

// Boot starts a fresh stack: its own issuer key, temp data dir, free
// loopback ports, and for Postgres its own database. On error everything
// it started is torn down again.
func Boot(ctx context.Context, p Params, logger *slog.Logger) (s *Stack, err error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("issuer key: %w", err)
	}
	dir, err := os.MkdirTemp("", "relay-loadtest-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	s = &Stack{key: priv, dir: dir, logger: logger}
	logger.Info("throwaway stack", "dir", dir, "store", p.Store, "replicas", p.Replicas)
	defer func() {
		if err != nil {
			s.Close(context.WithoutCancel(ctx))
			s = nil
		}
	}()

	var dbURL string
	switch p.Store {
	case "sqlite":
		dbURL = relayconfig.Database{Kind: relayconfig.SQLite, Path: filepath.Join(dir, "relay.db")}.URL()
	case "postgres":
		name := "relay_bench_" + time.Now().UTC().Format("20060102_150405") + "_" + randomHex(3)
		dbURL, s.dropDB, err = createDatabase(ctx, p.PG, name)
		if err != nil {
			return s, err
		}
		logger.Info("throwaway database created", "database", name)
	default:
		return s, fmt.Errorf("unknown store %q", p.Store)
	}

	env := RelayEnv(os.Environ())
	env = append(env, "FN_DATABASE_URL="+dbURL, "FN_RELAY_REPLICAS="+strconv.Itoa(p.Replicas))
	if p.Replicas == 1 {
		// The relay holds the issuer's key, as a self-hoster's does: it
		// mints its own tokens and pairs devices, so the pairing endpoints
		// are there to be flooded.
		keyFile := filepath.Join(dir, "issuer.key")
		if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(priv.Seed())+"\n"), 0o600); err != nil {
			return s, fmt.Errorf("issuer key: %w", err)
		}
		env = append(env, "FN_ISSUER_KEYS=", "FN_ISSUER_KEY_FILE="+keyFile)
	} else {
		env = append(env, "FN_ISSUER_KEYS="+base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)))
	}
	if p.Replicas > 1 {
		env = append(env, "FN_REDIS_URL="+p.Redis)
	}
	if p.Wait > 60 {
		env = append(env, "FN_MAX_WAIT_SECS="+strconv.Itoa(p.Wait))
	}
	if p.Memory > 0 {
		// The runtime's own limit, so that the collector works harder
		// before the kernel's limit is reached.
		env = append(env, "GOMEMLIMIT="+strconv.FormatInt(p.Memory, 10))
	}
	// Last, so that they win over the defaults above (exec keeps the last
	// value of a repeated key).
	env = append(env, p.Env...)
	for i := range p.Replicas {
		sl, err := s.newSlot(p, i, env)
		if err != nil {
			return s, err
		}
		// One after another: each is ready (its migrations applied)
		// before the next starts.
		r, err := startRelay(ctx, sl.spec, sl.cap)
		if r != nil {
			sl.cur = r
		}
		if err != nil {
			return s, err
		}
		s.urls = append(s.urls, r.url)
		logger.Info("relay ready", "url", r.url, "pid", r.cmd.Process.Pid)
	}
	return s, nil
}

// newSlot picks the slot's ports and directories and makes its memory cap.
func (s *Stack) newSlot(p Params, i int, env []string) (*slot, error) {
	sl := &slot{spec: relaySpec{bin: p.Bin, i: i, env: env}}
	s.mu.Lock()
	s.slots = append(s.slots, sl)
	s.mu.Unlock()
	port, err := freePort()
	if err != nil {
		return sl, err
	}
	sl.spec.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if p.Metrics {
		mport, err := freePort()
		if err != nil {
			return sl, err
		}
		sl.spec.metrics = net.JoinHostPort("127.0.0.1", strconv.Itoa(mport))
	}
	sl.spec.logPath = filepath.Join(s.dir, fmt.Sprintf("relay-%d.log", i))
	sl.spec.workDir = filepath.Join(s.dir, fmt.Sprintf("relay-%d", i))
	if err := os.Mkdir(sl.spec.workDir, 0o700); err != nil {
		return sl, fmt.Errorf("relay dir: %w", err)
	}
	if p.Memory > 0 {
		// Named for this tester and stack, so that a group a killed tester
		// left behind can be told apart and removed.
		name := fmt.Sprintf("relay-loadtest-%d-%s-%d", os.Getpid(), strings.TrimPrefix(filepath.Base(s.dir), "relay-loadtest-"), i)
		c, err := newMemCap(p.Memory, name, p.MemoryMethod)
		if err != nil {
			return sl, err
		}
		sl.cap = c
		if c.warning != "" {
			s.logger.Warn("relay memory cap is weaker than asked", "relay", i, "method", c.method, "warning", c.warning)
		}
	}
	return sl, nil
}

// RelayEnv keeps the parent's environment except its FN_* settings, which
// belong to whatever relay the user runs, not to this throwaway one.
func RelayEnv(parent []string) []string {
	var env []string
	for _, kv := range parent {
		if !strings.HasPrefix(kv, "FN_") {
			env = append(env, kv)
		}
	}
	return env
}

// startRelay starts a relay as spec says, inside mc if there is one, and
// waits until it is ready. Its log is appended to, so that every process a
// slot had is in one file.
func startRelay(ctx context.Context, spec relaySpec, mc *MemCap) (*Relay, error) {
	env := append(append([]string{}, spec.env...), "FN_LISTEN="+spec.addr)
	var metricsURL string
	if spec.metrics != "" {
		env = append(env, "FN_METRICS_ADDR="+spec.metrics)
		metricsURL = "http://" + spec.metrics + "/metrics"
	}
	logFile, err := os.OpenFile(spec.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("relay log: %w", err)
	}
	defer logFile.Close()

	argv := []string{spec.bin, "serve"}
	if mc != nil {
		argv = mc.wrap(argv)
	}
	// Not CommandContext: the relay gets SIGTERM and time to drain, never a
	// bare kill, and Ctrl-C at the terminal reaches only this process (the
	// relay has its own process group) so that teardown stays in order.
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = spec.workDir
	cmd.Env = env
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start relay: %w", err)
	}
	r := &Relay{cmd: cmd, url: "http://" + spec.addr, metrics: metricsURL, logPath: spec.logPath, done: make(chan struct{})}
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
func (r *Relay) awaitReady(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	tick := time.NewTicker(20 * time.Millisecond)
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

// Pid returns the process's id.
func (r *Relay) Pid() int { return r.cmd.Process.Pid }

// Metrics returns the URL of the relay's Prometheus endpoint; "" without
// one.
func (r *Relay) Metrics() string { return r.metrics }

// exited reports whether the process has exited.
func (r *Relay) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// usage is the process's CPU time and peak resident memory: from /proc
// while it runs, from its rusage once it has been reaped.
func (r *Relay) usage() (cpu time.Duration, peak int64, err error) {
	if r.exited() {
		ru, ok := r.cmd.ProcessState.SysUsage().(*syscall.Rusage)
		if !ok {
			return 0, 0, errors.New("no rusage for the exited relay")
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Maxrss * 1024, nil
	}
	pid := r.cmd.Process.Pid
	if cpu, err = procstat.CPUTime(pid); err != nil {
		return 0, 0, err
	}
	// VmHWM is the process's peak resident set, so nothing is missed
	// between samples.
	peak, err = procstat.PeakRSS(pid)
	return cpu, peak, err
}

// stop sends SIGTERM and waits for a graceful exit; a relay that does not
// exit in time is killed, and that is an error.
func (r *Relay) stop(limit time.Duration) error {
	if r.exited() {
		return fmt.Errorf("relay %s had already exited: %v", r.url, r.waitErr)
	}
	r.intended.Store(true)
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

// Relay returns replica i's process now.
func (s *Stack) Relay(i int) *Relay {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slots[i].cur
}

// URLs returns the relays' base URLs, replica 0 first.
func (s *Stack) URLs() []string { return s.urls }

// Key returns the issuer key the relays trust.
func (s *Stack) Key() ed25519.PrivateKey { return s.key }

// Cap returns replica i's memory cap; nil without one.
func (s *Stack) Cap(i int) *MemCap {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slots[i].cap
}

// Replicas returns how many relays the stack has.
func (s *Stack) Replicas() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.slots)
}

// retire accounts for a slot's process that has exited; the caller holds
// mu. An exit the tester did not cause is kept as a crash.
func (sl *slot) retire(r *Relay) {
	if cpu, peak, err := r.usage(); err == nil {
		sl.deadCPU += cpu
		sl.deadPeak = max(sl.deadPeak, peak)
	}
	if !r.intended.Load() {
		sl.exits = append(sl.exits, fmt.Sprintf("relay %d (pid %d) exited on its own: %v", sl.spec.i, r.cmd.Process.Pid, r.waitErr))
	}
}

// Crash kills replica i with SIGKILL, as a crash would, and after down
// starts it again on the same port, data and settings. It returns when the
// process was killed and when the new one first answered /ready with 200.
func (s *Stack) Crash(ctx context.Context, i int, down time.Duration) (killed, ready time.Time, err error) {
	s.mu.Lock()
	sl := s.slots[i]
	old := sl.cur
	s.mu.Unlock()
	if old == nil || old.exited() {
		return time.Time{}, time.Time{}, fmt.Errorf("relay %d is not running, so it cannot be crashed", i)
	}
	old.intended.Store(true)
	killed = time.Now()
	if err := old.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return killed, time.Time{}, fmt.Errorf("kill relay %d: %w", i, err)
	}
	<-old.done
	s.mu.Lock()
	sl.retire(old)
	sl.cur = nil
	s.mu.Unlock()

	if !wait.For(ctx, down) {
		return killed, time.Time{}, ctx.Err()
	}
	r, err := s.restart(ctx, sl)
	if err != nil {
		return killed, time.Time{}, fmt.Errorf("restart relay %d: %w", i, err)
	}
	s.logger.Info("relay restarted", "relay", i, "pid", r.cmd.Process.Pid, "down", time.Since(killed).Round(time.Millisecond))
	return killed, time.Now(), nil
}

// restartLimit bounds how long a supervisor keeps starting a relay that
// exits at boot (its store down, say) before it gives up.
const restartLimit = 60 * time.Second

// restart starts the slot's relay again, and again while it exits before
// it is ready, as a supervisor would, until restartLimit.
func (s *Stack) restart(ctx context.Context, sl *slot) (*Relay, error) {
	deadline := time.Now().Add(restartLimit)
	for attempt := 0; ; attempt++ {
		r, err := startRelay(ctx, sl.spec, sl.cap)
		if r != nil {
			s.mu.Lock()
			sl.cur = r
			s.mu.Unlock()
		}
		if err == nil || r == nil || !r.exited() || ctx.Err() != nil || time.Now().After(deadline) {
			return r, err
		}
		// Exited at boot: the supervisor's business, not a crash.
		r.intended.Store(true)
		s.mu.Lock()
		sl.retire(r)
		sl.cur = nil
		s.mu.Unlock()
		s.logger.Warn("relay exited at boot; starting it again", "relay", sl.spec.i, "err", err)
		wait.For(ctx, min(100*time.Millisecond<<min(attempt, 4), time.Second))
	}
}

// Pause stops replica i with SIGSTOP for hold, as a stalled VM or a long
// collection would, then continues it. It is continued whatever happens.
func (s *Stack) Pause(ctx context.Context, i int, hold time.Duration) error {
	r := s.Relay(i)
	if r == nil || r.exited() {
		return fmt.Errorf("relay %d is not running, so it cannot be paused", i)
	}
	if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause relay %d: %w", i, err)
	}
	wait.For(ctx, hold)
	if err := r.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("continue relay %d: %w", i, err)
	}
	return nil
}

// Usage sums the relays' CPU time, each slot's peak resident memory (the
// highest any of its processes reached) and their resident memory now.
func (s *Stack) Usage() (cpu time.Duration, peak, rss int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, sl := range s.slots {
		cpu += sl.deadCPU
		slotPeak := sl.deadPeak
		if r := sl.cur; r != nil {
			c, p, err := r.usage()
			if err != nil {
				errs = append(errs, err)
			}
			cpu += c
			slotPeak = max(slotPeak, p)
			if !r.exited() {
				if b, err := procstat.RSS(r.cmd.Process.Pid); err == nil {
					rss += b
				}
			}
		}
		peak += slotPeak
	}
	return cpu, peak, rss, errors.Join(errs...)
}

// UnexpectedExits lists the relay exits the tester did not cause, including
// a relay found dead at the end.
func (s *Stack) UnexpectedExits() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, sl := range s.slots {
		out = append(out, sl.exits...)
	}
	return out
}

// StopRelays stops every relay and joins their errors. It may be called
// again; a relay already stopped is left alone.
func (s *Stack) StopRelays() error {
	s.mu.Lock()
	slots := slices.Clone(s.slots)
	s.mu.Unlock()
	var errs []error
	for _, sl := range slots {
		s.mu.Lock()
		r, stopped := sl.cur, sl.stopped
		sl.stopped = true
		s.mu.Unlock()
		if r == nil || stopped {
			continue
		}
		err := r.stop(20 * time.Second)
		if err != nil {
			errs = append(errs, err)
			s.logger.Error("relay stop", "err", err, "log_tail", tail(r.logPath, 10))
		}
		<-r.done
		s.mu.Lock()
		sl.retire(r)
		sl.cur = nil
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Memory reports the relays' memory caps, after [Stack.StopRelays]: the limit
// read back from the kernel at start, the peaks and the OOM kills.
func (s *Stack) Memory(limit int64, applied int64) *report.Memory {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := &report.Memory{LimitBytes: limit, AppliedBytes: applied, GoMemLimit: strconv.FormatInt(limit, 10)}
	for _, sl := range s.slots {
		m.PeakRSSBytes = max(m.PeakRSSBytes, sl.deadPeak)
		if sl.cap == nil {
			continue
		}
		m.Enforced = sl.cap.method
		if sl.cap.warning != "" {
			m.Warning = sl.cap.warning
		}
		peak, kills, err := sl.cap.stats()
		if err != nil {
			m.Warning = strings.TrimPrefix(m.Warning+"; ", "; ") + "OOM kills unknown: " + err.Error()
		}
		m.CgroupPeakBytes = max(m.CgroupPeakBytes, peak)
		m.OOMKills += kills
	}
	// Under RLIMIT_AS the kernel kills nothing: the Go runtime dies of a
	// failed allocation, and says so.
	for _, sl := range s.slots {
		if sl.cap != nil && sl.cap.method == CapRlimitAS && len(sl.exits) > 0 &&
			strings.Contains(tail(sl.spec.logPath, 200), "out of memory") {
			m.OOMKills++
		}
	}
	m.OOMKilled = m.OOMKills > 0
	return m
}

// AppliedLimit reads back from the kernel the memory limit replica 0's
// process runs under.
func (s *Stack) AppliedLimit() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.slots) == 0 || s.slots[0].cap == nil || s.slots[0].cur == nil {
		return 0, errors.New("no capped relay")
	}
	return s.slots[0].cap.applied(s.slots[0].cur.cmd.Process.Pid)
}

// Close tears everything down: relays, memory cgroups, database, temp
// dir. It is safe to call after [Stack.StopRelays].
func (s *Stack) Close(ctx context.Context) error {
	errs := []error{s.StopRelays()}
	s.mu.Lock()
	for _, sl := range s.slots {
		if sl.cap != nil {
			errs = append(errs, sl.cap.remove())
		}
	}
	s.mu.Unlock()
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
		return "", nil, fmt.Errorf("connect to %s: %w", RedactURL(admin), err)
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

// RedactURL returns raw with its password hidden, for messages.
func RedactURL(raw string) string {
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
