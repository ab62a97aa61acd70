package stack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flamenet/relay/internal/procstat"
)

// Service is a server process a fault campaign owns: Postgres or Redis,
// started by this tool on a free loopback port in a temp dir, never the
// machine's own. A kill or a pause reaches every process it has (Postgres
// has one per connection), and only those.
type Service struct {
	name    string
	argv    []string
	cred    *syscall.Credential // nil: this tool's user
	dir     string
	logPath string
	// stopSig asks for a clean exit at teardown.
	stopSig syscall.Signal
	// ready reports whether the server answers.
	ready func(ctx context.Context) error

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Dir returns the server's directory: its data and its log.
func (s *Service) Dir() string { return s.dir }

// serviceReadyLimit bounds a start: Postgres may first replay its WAL
// after a kill.
const serviceReadyLimit = 60 * time.Second

// Start starts the server and waits until it answers.
func (s *Service) Start(ctx context.Context) error {
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s log: %w", s.name, err)
	}
	defer logFile.Close()
	cmd := exec.Command(s.argv[0], s.argv[1:]...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// SIGKILL when this tool dies, however: a throwaway server must not
	// outlive its campaign. A process group of its own keeps Ctrl-C at the
	// terminal to this tool, which tears down in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: s.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, serviceReadyLimit)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := s.ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited before it answered (%v); log:\n%s", s.name, cmd.ProcessState, tail(s.logPath, 20))
		case <-ctx.Done():
			return fmt.Errorf("%s not answering: %w (last: %v); log:\n%s", s.name, ctx.Err(), err, tail(s.logPath, 20))
		case <-tick.C:
		}
	}
}

// leader is the running server's first process, or 0.
func (s *Service) leader() (int, chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0, nil
	}
	return s.cmd.Process.Pid, s.done
}

// signal sends sig to every process of the server, its children first,
// and returns them all. Postgres makes each child (every backend) the
// leader of a session of its own, so neither a process group nor a
// session holds them: they are the leader's children in /proc. The
// leader is stopped first, so that it starts no child meanwhile, and
// since a stopped parent reaps nothing, no pid listed can be reused by
// another process before it is signalled.
func (s *Service) signal(sig syscall.Signal) ([]int, error) {
	pid, _ := s.leader()
	// Never a process this tool did not start: 0 or -1 would reach many.
	if pid <= 1 {
		return nil, fmt.Errorf("%s is not running", s.name)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("signal %s: %w", s.name, err)
	}
	procs := procstat.Children(pid)
	for _, c := range procs {
		_ = syscall.Kill(c, sig) // one that has just exited needs nothing
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return nil, fmt.Errorf("signal %s: %w", s.name, err)
	}
	return append(procs, pid), nil
}

// Pause stops every process of the server with SIGSTOP.
func (s *Service) Pause() error {
	_, err := s.signal(syscall.SIGSTOP)
	return err
}

// Resume continues every process of the server with SIGCONT.
func (s *Service) Resume() error {
	_, err := s.signal(syscall.SIGCONT)
	return err
}

// Kill ends every process of the server with SIGKILL, as a crash of its
// machine would, and returns once none is left: a Postgres started again
// while a backend of the old one lives refuses to start.
func (s *Service) Kill() error {
	_, done := s.leader()
	procs, err := s.signal(syscall.SIGKILL)
	if err != nil {
		return err
	}
	<-done
	s.mu.Lock()
	s.cmd = nil
	s.mu.Unlock()
	return awaitGone(procs, 10*time.Second)
}

// stop asks the server to exit, and kills it if it does not in time. It is
// safe to call when the server is not running.
func (s *Service) stop() error {
	pid, done := s.leader()
	if pid == 0 {
		return nil
	}
	procs, err := s.signal(syscall.SIGCONT) // a paused server hears nothing else
	if err != nil {
		return err
	}
	// To the leader only: Postgres's postmaster ends its children.
	if err := syscall.Kill(pid, s.stopSig); err != nil {
		return fmt.Errorf("signal %s: %w", s.name, err)
	}
	t := time.NewTimer(15 * time.Second)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		return errors.Join(fmt.Errorf("%s did not exit within 15s of %v", s.name, s.stopSig), s.Kill())
	}
	s.mu.Lock()
	s.cmd = nil
	s.mu.Unlock()
	return awaitGone(procs, 10*time.Second)
}

// awaitGone waits until none of procs lives. Zombies do not count: they
// hold no port and no shared memory.
func awaitGone(procs []int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for slices.ContainsFunc(procs, procstat.Alive) {
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still alive after %s", slices.DeleteFunc(slices.Clone(procs), func(p int) bool { return !procstat.Alive(p) }), limit)
		}
		// Orphans of the killed leader, not this tool's children: nothing
		// to wait on.
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// Services are a campaign's own Postgres and Redis.
type Services struct {
	PG, Redis *Service
	PGURL     string // admin URL of the cluster
	RedisURL  string
}

// StartServices starts a private Postgres cluster and a private Redis, each
// on a free loopback port in a temp dir of its own. On error whatever
// started is torn down.
func StartServices(ctx context.Context) (_ *Services, err error) {
	sv := &Services{}
	defer func() {
		if err != nil {
			_ = sv.Close()
		}
	}()
	if sv.PG, sv.PGURL, err = newPostgres(ctx); err != nil {
		return sv, err
	}
	if err := sv.PG.Start(ctx); err != nil {
		return sv, err
	}
	if sv.Redis, sv.RedisURL, err = newRedis(); err != nil {
		return sv, err
	}
	if err := sv.Redis.Start(ctx); err != nil {
		return sv, err
	}
	return sv, nil
}

// Close stops both servers and removes their directories.
func (sv *Services) Close() error {
	var errs []error
	for _, s := range []*Service{sv.Redis, sv.PG} {
		if s == nil {
			continue
		}
		errs = append(errs, s.stop(), os.RemoveAll(s.dir))
	}
	return errors.Join(errs...)
}

// postgresBin finds the directory with initdb and postgres: the newest of
// Debian's /usr/lib/postgresql/<version>/bin, else initdb's on PATH.
func postgresBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("no initdb and postgres (looked in /usr/lib/postgresql/*/bin and PATH)")
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// postgresUser is who Postgres runs as: this tool's user, or, for root
// (which initdb and postgres refuse), the postgres account.
func postgresUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, Postgres must run as another user, and there is no postgres account: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("postgres account: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// ServicesMissing says what a campaign needs and this machine lacks, or
// nil.
func ServicesMissing() error {
	var errs []error
	if _, err := postgresBin(); err != nil {
		errs = append(errs, err)
	}
	if _, err := postgresUser(); err != nil {
		errs = append(errs, err)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// newPostgres makes a fresh cluster with initdb, not yet started. fsync is
// off: a campaign kills processes, not the machine, and what a killed
// Postgres wrote is in the kernel's cache either way. Commits stay
// synchronous, so a commit that was answered survives a kill.
func newPostgres(ctx context.Context) (*Service, string, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, "", err
	}
	cred, err := postgresUser()
	if err != nil {
		return nil, "", err
	}
	dir, err := os.MkdirTemp("", "relay-campaign-pg-")
	if err != nil {
		return nil, "", fmt.Errorf("postgres dir: %w", err)
	}
	s := &Service{name: "postgres", cred: cred, dir: dir, logPath: filepath.Join(dir, "postgres.log"), stopSig: syscall.SIGINT}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return s, "", fmt.Errorf("postgres dir: %w", err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"--auth=trust", "--no-sync", "--encoding=UTF8", "--locale=C")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return s, "", fmt.Errorf("initdb: %w\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return s, "", err
	}
	s.argv = []string{filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + dir,
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "shared_buffers=32MB",
		"-c", "max_connections=200", "-c", "logging_collector=off"}
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	s.ready = func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		_, err = conn.Exec(ctx, "SELECT 1")
		return err
	}
	return s, url, nil
}

// newRedis makes a private redis-server, not yet started, without
// persistence: Redis carries only wake-ups, and a restarted one starts
// empty, as the relays must expect.
func newRedis() (*Service, string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", err
	}
	dir, err := os.MkdirTemp("", "relay-campaign-redis-")
	if err != nil {
		return nil, "", fmt.Errorf("redis dir: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return &Service{dir: dir}, "", err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s := &Service{
		name: "redis", dir: dir, logPath: filepath.Join(dir, "redis.log"), stopSig: syscall.SIGTERM,
		argv: []string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir},
		ready: func(ctx context.Context) error {
			var d net.Dialer
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			dl, _ := ctx.Deadline()
			_ = c.SetDeadline(dl)
			if _, err := c.Write([]byte("PING\r\n")); err != nil {
				return err
			}
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return err
			}
			if !strings.HasPrefix(line, "+PONG") {
				return fmt.Errorf("redis answered %q to PING", strings.TrimSpace(line))
			}
			return nil
		},
	}
	return s, "redis://" + addr + "/0", nil
}
