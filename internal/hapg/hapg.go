// Package hapg starts a highly available Postgres on this machine, for the
// failover tests and the load tester: a pg_auto_failover monitor and two
// Postgres nodes, a primary and a standby, each on a free loopback port in
// a temp dir of its own, with trust auth and no TLS. The monitor's health
// checks are tuned so that a lost primary is noticed within a few seconds,
// and the manager, never the caller, promotes the standby.
//
// pg_autoctl refuses to run as root; as root the formation runs as the
// postgres account, and only the formation's own directory is given to it.
package hapg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
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

// Mode is how the primary commits.
type Mode string

const (
	// Sync: a commit is acknowledged once the standby has it
	// (replication-quorum true, synchronous_standby_names set by the
	// monitor).
	Sync Mode = "sync"
	// Async: a commit is acknowledged once the primary has it
	// (replication-quorum false, synchronous_standby_names empty).
	Async Mode = "async"
)

// Database is the database the formation creates for the relay.
const Database = "relay"

// Timings the formation runs with: a lost primary is marked unhealthy
// about NodeUnhealthy after its last report, and the standby takes over
// DemoteTimeout later; an isolated primary demotes itself after
// PartitionTimeout without the monitor and the standby. DemoteTimeout
// exceeds PartitionTimeout (plus the keeper's one-second loop), so the
// old primary has stopped taking writes before the standby starts.
const (
	NodeUnhealthy    = 2 * time.Second
	DemoteTimeout    = 3 * time.Second
	PartitionTimeout = 2 * time.Second
)

// monitorSettings tune the monitor (pgautofailover.* GUCs of the
// installed extension; the defaults take about 30 s to fail over).
var monitorSettings = []string{
	"pgautofailover.health_check_period = 1000",
	"pgautofailover.health_check_timeout = 1000",
	"pgautofailover.health_check_max_retries = 1",
	"pgautofailover.health_check_retry_delay = 500",
	fmt.Sprintf("pgautofailover.node_considered_unhealthy_timeout = %d", NodeUnhealthy.Milliseconds()),
	fmt.Sprintf("pgautofailover.primary_demote_timeout = %d", DemoteTimeout.Milliseconds()),
	"pgautofailover.startup_grace_period = 1000",
}

// serverSettings keep every server of a formation small: pg_autoctl sizes
// shared_buffers to a quarter of the machine. fsync is off (a test kills
// processes, not the machine, and what a killed Postgres wrote is in the
// kernel's cache); commits still wait for the WAL and, in Sync, for the
// standby. Dynamic shared memory lives in the data directory, which is
// removed, rather than in /dev/shm, which a killed Postgres would litter.
var serverSettings = []string{
	"shared_buffers = '32MB'",
	"max_connections = 200",
	"fsync = off",
	"dynamic_shared_memory_type = mmap",
	// pg_basebackup asks for a spread checkpoint, which paces its writes
	// over minutes after the relay database's creation; 0 makes it quick.
	"checkpoint_completion_target = 0",
}

// Node is one Postgres of the formation, or its monitor.
type Node struct {
	Name string
	Port int
	// ID is the monitor's node id (0 for the monitor).
	ID  int
	dir string // the node's own directory; its data is dir/pgdata
	// listen is the address Postgres listens on: 127.0.0.1, or in a
	// Partitionable formation an address of its own behind in.
	listen string
	// In a Partitionable formation: in carries what reaches the node at
	// Addr (the monitor's health checks, the standby's replication),
	// toMonitor the keeper's connections to the monitor.
	in, toMonitor *link

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{} // closed when cmd has exited
	killed bool
}

// Addr is the node's host:port as the formation knows it (registered
// with the monitor): behind its link in a Partitionable formation.
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port)) }

// ListenAddr is where the node's Postgres listens, reached directly.
func (n *Node) ListenAddr() string { return net.JoinHostPort(n.listen, strconv.Itoa(n.Port)) }

func (n *Node) pgdata() string { return filepath.Join(n.dir, "pgdata") }

func (n *Node) root() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Killed reports whether the node was killed.
func (n *Node) Killed() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.killed
}

// Formation is a running monitor and two Postgres nodes.
type Formation struct {
	// Dir holds everything: the nodes' data, configuration and logs.
	Dir     string
	Mode    Mode
	Monitor *Node
	Nodes   []*Node

	autoctl string
	pgctl   string
	user    string // the database superuser, the account Postgres runs as
	cred    *syscall.Credential
	env     []string
}

// Config says how to start a formation.
type Config struct {
	Mode Mode
	// Partitionable puts each data node behind links that Split cuts:
	// its Postgres listens on an address of its own (127.0.0.11, .12),
	// the formation reaches it through a link on 127.0.0.1, and its
	// keeper reaches the monitor through another.
	Partitionable bool
	// Logger hears each step of the start; nil: nothing is logged.
	Logger *slog.Logger
}

// Missing says what this machine lacks to start a formation, or nil.
func Missing() error {
	_, _, err := binaries()
	return err
}

// binaries finds pg_autoctl and the pg_ctl of a Postgres whose lib holds
// the pgautofailover extension.
func binaries() (autoctl, pgctl string, err error) {
	if autoctl, err = exec.LookPath("pg_autoctl"); err != nil {
		return "", "", fmt.Errorf("pg_autoctl (Debian: pg-auto-failover-cli and postgresql-NN-auto-failover): %w", err)
	}
	libs, _ := filepath.Glob("/usr/lib/postgresql/*/lib/pgautofailover.so")
	slices.SortFunc(libs, func(a, b string) int { return version(b) - version(a) })
	for _, lib := range libs {
		bin := filepath.Join(filepath.Dir(filepath.Dir(lib)), "bin", "pg_ctl")
		if _, err := os.Stat(bin); err == nil {
			return autoctl, bin, nil
		}
	}
	if out, err := exec.Command("pg_config", "--bindir", "--pkglibdir").Output(); err == nil {
		if f := strings.Fields(string(out)); len(f) == 2 {
			if _, err := os.Stat(filepath.Join(f[1], "pgautofailover.so")); err == nil {
				return autoctl, filepath.Join(f[0], "pg_ctl"), nil
			}
		}
	}
	return "", "", errors.New("no Postgres with the pgautofailover extension (looked in /usr/lib/postgresql/*/lib and pg_config --pkglibdir)")
}

// version is the NN of /usr/lib/postgresql/NN/lib/x.
func version(lib string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(lib))))
	return v
}

// runAs is who the formation runs as: this process's user, or for root
// the postgres account.
func runAs() (*syscall.Credential, string, error) {
	if os.Geteuid() != 0 {
		u, err := user.Current()
		if err != nil {
			return nil, "", err
		}
		return nil, u.Username, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, "", fmt.Errorf("running as root, pg_autoctl must run as another user, and there is no postgres account: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, "", fmt.Errorf("postgres account: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, "postgres", nil
}

// dirPrefix names the formations' directories in the temp dir, where a
// later start finds those of a run that was killed.
const dirPrefix = "relay-hapg-"

// Launch starts a formation and waits until the primary commits in mode
// cfg.Mode with the standby in step. On error whatever started is torn
// down. Close ends it.
func Launch(ctx context.Context, cfg Config) (_ *Formation, err error) {
	if cfg.Mode != Sync && cfg.Mode != Async {
		return nil, fmt.Errorf("hapg: mode %q: want sync or async", cfg.Mode)
	}
	autoctl, pgctl, err := binaries()
	if err != nil {
		return nil, err
	}
	cred, name, err := runAs()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	began := time.Now()
	step := func(msg string, args ...any) {
		log.Info(msg, append(args, "elapsed", time.Since(began).Round(time.Millisecond))...)
	}
	CleanStale()
	becomeSubreaper()
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("hapg: %w", err)
	}
	f := &Formation{Dir: dir, Mode: cfg.Mode, autoctl: autoctl, pgctl: pgctl, user: name, cred: cred}
	defer func() {
		if err != nil {
			err = errors.Join(err, f.Close())
		}
	}()
	// The owner's pid and start time: a later start removes the directory
	// of an owner that is gone.
	owner := fmt.Sprintf("%d %s\n", os.Getpid(), procstat.StartTime(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(owner), 0o644); err != nil {
		return f, fmt.Errorf("hapg: %w", err)
	}
	for _, sub := range []string{"", "config", "data", "run", "monitor", "node1", "node2"} {
		if err := f.mkdir(filepath.Join(dir, sub)); err != nil {
			return f, err
		}
	}
	f.env = []string{
		"PATH=" + filepath.Dir(pgctl) + ":/usr/bin:/bin",
		"HOME=" + dir,
		"XDG_CONFIG_HOME=" + filepath.Join(dir, "config"),
		"XDG_DATA_HOME=" + filepath.Join(dir, "data"),
		"XDG_RUNTIME_DIR=" + filepath.Join(dir, "run"),
		"LC_ALL=C",
	}
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = freePort(ports[:i]); err != nil {
			return f, err
		}
	}
	f.Monitor = &Node{Name: "monitor", Port: ports[0], dir: filepath.Join(dir, "monitor"), listen: "127.0.0.1"}
	for i := range 2 {
		n := &Node{Name: fmt.Sprintf("node%d", i+1), Port: ports[i+1], dir: filepath.Join(dir, fmt.Sprintf("node%d", i+1)), listen: "127.0.0.1"}
		f.Nodes = append(f.Nodes, n)
		if !cfg.Partitionable {
			continue
		}
		n.listen = fmt.Sprintf("127.0.0.%d", 11+i)
		if n.in, err = newLink(n.Addr(), n.ListenAddr()); err != nil {
			return f, fmt.Errorf("hapg: link to %s: %w", n.Name, err)
		}
		port, err := freePort(ports)
		if err != nil {
			return f, err
		}
		ports = append(ports, port)
		if n.toMonitor, err = newLink(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), f.Monitor.Addr()); err != nil {
			return f, fmt.Errorf("hapg: link from %s to the monitor: %w", n.Name, err)
		}
	}

	// One initdb for the monitor and the primary, copied: initdb takes
	// seconds, most of them probing shared memory, and pg_autoctl takes an
	// existing data directory as it is.
	step("hapg: initdb", "dir", dir)
	if err := f.initdb(ctx, filepath.Join(dir, "template")); err != nil {
		return f, err
	}
	step("hapg: creating the monitor", "port", f.Monitor.Port)
	for _, n := range []*Node{f.Monitor, f.Nodes[0]} {
		if out, err := exec.CommandContext(ctx, "cp", "-a", filepath.Join(dir, "template"), n.pgdata()).CombinedOutput(); err != nil {
			return f, fmt.Errorf("hapg: copy the template cluster: %w\n%s", err, out)
		}
	}

	if err := appendSettings(f.Nodes[0].pgdata(), serverSettings); err != nil {
		return f, err
	}
	// The monitor is created and run in one go: a create alone stops the
	// Postgres it started, and run starts it again, seconds each.
	m := f.Monitor
	if err := appendSettings(m.pgdata(), append(slices.Clone(serverSettings), monitorSettings...)); err != nil {
		return f, err
	}
	if err := f.start(m, "create", "monitor", "--pgctl", pgctl, "--pgdata", m.pgdata(),
		"--pgport", strconv.Itoa(m.Port), "--hostname", "127.0.0.1", "--listen", "127.0.0.1",
		"--auth", "trust", "--no-ssl", "--run"); err != nil {
		return f, err
	}
	if err := f.waitMonitor(ctx); err != nil {
		return f, err
	}
	step("hapg: monitor up")
	quorum := strconv.FormatBool(cfg.Mode == Sync)
	for i, n := range f.Nodes {
		step("hapg: creating node", "node", n.Name, "port", n.Port)
		if err := f.autoctlRun(ctx, n, "create", "postgres", "--pgctl", pgctl, "--pgdata", n.pgdata(),
			"--pgport", strconv.Itoa(n.Port), "--hostname", "127.0.0.1", "--listen", n.listen,
			"--name", n.Name, "--monitor", f.monitorURLOf(n), "--auth", "trust", "--no-ssl",
			"--dbname", Database, "--replication-quorum", quorum); err != nil {
			return f, err
		}
		// Before the keeper runs: one that starts up as config set
		// signals it to reload dies of the SIGHUP, and pg_autoctl 2.0
		// restarts it into an error loop.
		if err := f.autoctlRun(ctx, n, "config", "set", "--pgdata", n.pgdata(),
			"timeout.network_partition_timeout", strconv.Itoa(int(PartitionTimeout.Seconds()))); err != nil {
			return f, err
		}
		if err := f.start(n, "run", "--pgdata", n.pgdata()); err != nil {
			return f, err
		}
		want := "single"
		if i > 0 {
			want = "secondary"
		}
		if err := f.waitState(ctx, n, want); err != nil {
			return f, err
		}
		step("hapg: node up", "node", n.Name, "state", want)
	}
	if err := f.waitState(ctx, f.Nodes[0], "primary"); err != nil {
		return f, err
	}
	if err := f.checkMode(ctx, f.Nodes[0]); err != nil {
		return f, err
	}
	step("hapg: formation up", "mode", cfg.Mode, "url", f.URL())
	return f, nil
}

// initdb makes a cluster at pgdata, without syncing it to disk (see
// serverSettings on fsync).
func (f *Formation) initdb(ctx context.Context, pgdata string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(filepath.Dir(f.pgctl), "initdb"), "-D", pgdata, "-U", f.user,
		"--auth=trust", "--no-sync", "--encoding=UTF8", "--locale=C")
	cmd.Dir, cmd.Env = f.Dir, f.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: f.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hapg: initdb: %w\n%s", err, out)
	}
	return nil
}

// mkdir makes a directory the formation's account owns; never anything
// above the formation's own directory.
func (f *Formation) mkdir(path string) error {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	if f.cred != nil {
		if err := os.Chown(path, int(f.cred.Uid), int(f.cred.Gid)); err != nil {
			return fmt.Errorf("hapg: %w", err)
		}
	}
	return nil
}

// freePort is a free loopback port other than taken.
func freePort(taken []int) (int, error) {
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("hapg: free port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !slices.Contains(taken, p) {
			return p, nil
		}
	}
}

// appendSettings adds lines to a stopped server's postgresql.auto.conf,
// which is read after postgresql.conf and pg_autoctl's include.
func appendSettings(pgdata string, lines []string) error {
	fh, err := os.OpenFile(filepath.Join(pgdata, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	_, err = fh.WriteString("# hapg\n" + strings.Join(lines, "\n") + "\n")
	return errors.Join(err, fh.Close())
}

// command is pg_autoctl with args as the formation's account, in n's
// directory (which is how its processes are found again).
func (f *Formation) command(n *Node, args ...string) *exec.Cmd {
	cmd := exec.Command(f.autoctl, args...)
	cmd.Dir = n.dir
	cmd.Env = f.env
	// A process group of its own keeps a terminal's Ctrl-C away: Close
	// tears the formation down in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: f.cred}
	return cmd
}

// autoctlRun runs a pg_autoctl command that ends (create, config set).
func (f *Formation) autoctlRun(ctx context.Context, n *Node, args ...string) error {
	log := filepath.Join(n.dir, "autoctl.log")
	fh, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	defer fh.Close()
	fmt.Fprintf(fh, "$ pg_autoctl %s\n", strings.Join(args, " "))
	cmd := f.command(n, args...)
	cmd.Stdout, cmd.Stderr = fh, fh
	// Not CommandContext: a cancelled create must end with every process
	// it started, not only pg_autoctl itself.
	if err = cmd.Start(); err == nil {
		pid := cmd.Process.Pid
		stop := context.AfterFunc(ctx, func() { _, _ = killAll([]int{pid}, n.dir, 10*time.Second) })
		err = cmd.Wait()
		stop()
	}
	if err != nil {
		// A create that was cut short may have started Postgres.
		_, kerr := killAll(nil, n.dir, 10*time.Second)
		return errors.Join(fmt.Errorf("hapg: pg_autoctl %s: %w\n%s", strings.Join(args[:2], " "), err, tail(log, 20)), kerr)
	}
	return nil
}

// start runs n's pg_autoctl service (its keeper and Postgres): pg_autoctl
// with args (run, or create with --run).
func (f *Formation) start(n *Node, args ...string) error {
	log := filepath.Join(n.dir, "run.log")
	fh, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	defer fh.Close()
	cmd := f.command(n, args...)
	cmd.Stdout, cmd.Stderr = fh, fh
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("hapg: start %s: %w", n.Name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()
	return nil
}

// MonitorURL is how the nodes reach the monitor.
func (f *Formation) MonitorURL() string {
	return fmt.Sprintf("postgres://autoctl_node@%s/pg_auto_failover?sslmode=disable", f.Monitor.Addr())
}

// monitorURLOf is how n's keeper reaches the monitor: through its link
// in a Partitionable formation.
func (f *Formation) monitorURLOf(n *Node) string {
	if n.toMonitor == nil {
		return f.MonitorURL()
	}
	return fmt.Sprintf("postgres://autoctl_node@%s/pg_auto_failover?sslmode=disable", n.toMonitor.addr)
}

// adminURL is the superuser's URL of database db on node n.
func (f *Formation) adminURL(n *Node, db string) string {
	u := url.URL{Scheme: "postgres", User: url.User(f.user), Host: n.ListenAddr(), Path: "/" + db, RawQuery: "sslmode=disable&connect_timeout=2"}
	return u.String()
}

// URL is the relay's database URL: both nodes, the writable one chosen at
// each connection. In a Partitionable formation it reaches them as the
// formation does, through their links: a split node is cut off from the
// relays too.
func (f *Formation) URL() string { return f.url((*Node).Addr) }

// DirectURL is URL with each node reached where it listens, past any
// split: the relays on both sides of it.
func (f *Formation) DirectURL() string { return f.url((*Node).ListenAddr) }

func (f *Formation) url(addr func(*Node) string) string {
	u := url.URL{Scheme: "postgres", User: url.User(f.user), Path: "/" + Database,
		RawQuery: "sslmode=disable&target_session_attrs=read-write"}
	var hosts []string
	for _, n := range f.Nodes {
		hosts = append(hosts, addr(n))
	}
	u.Host = strings.Join(hosts, ",")
	return u.String()
}

// Split cuts n off from the monitor and the other node (a network split
// between them): its links close every connection and refuse new ones.
// Its Postgres and keeper go on running; Heal joins it again.
func (f *Formation) Split(n *Node) error {
	if n.in == nil {
		return errNoLinks
	}
	n.in.cut()
	n.toMonitor.cut()
	return nil
}

// Heal ends a Split.
func (f *Formation) Heal(n *Node) error {
	if n.in == nil {
		return errNoLinks
	}
	return errors.Join(n.in.restore(), n.toMonitor.restore())
}

// NodeURL is the relay database's URL on one node alone.
func (f *Formation) NodeURL(n *Node) string { return f.adminURL(n, Database) }

// query runs fn on a short connection to database db of node n.
func (f *Formation) query(ctx context.Context, n *Node, db string, fn func(*pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, f.adminURL(n, db))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(conn)
}

func (f *Formation) waitMonitor(ctx context.Context) error {
	return poll(ctx, 60*time.Second, "the monitor answering", func() error {
		return f.query(ctx, f.Monitor, "pg_auto_failover", func(c *pgx.Conn) error {
			_, err := c.Exec(ctx, "SELECT 1 FROM pgautofailover.node LIMIT 1")
			return err
		})
	})
}

// State is one node as the monitor sees it.
type State struct {
	Node     *Node
	Reported string // the state the node's keeper reached
	Goal     string // the state the monitor assigned
	Healthy  bool
}

// States are the data nodes as the monitor sees them now.
func (f *Formation) States(ctx context.Context) ([]State, error) {
	var out []State
	err := f.query(ctx, f.Monitor, "pg_auto_failover", func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, "SELECT nodename, nodeid, reportedstate::text, goalstate::text, health = 1 FROM pgautofailover.node ORDER BY nodeid")
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s State
			var name string
			var id int
			if err := rows.Scan(&name, &id, &s.Reported, &s.Goal, &s.Healthy); err != nil {
				return err
			}
			for _, n := range f.Nodes {
				if n.Name == name {
					n.mu.Lock()
					n.ID = id
					n.mu.Unlock()
					s.Node = n
				}
			}
			if s.Node != nil {
				out = append(out, s)
			}
		}
		return rows.Err()
	})
	return out, err
}

// waitState waits until the monitor says n reached state.
func (f *Formation) waitState(ctx context.Context, n *Node, state string) error {
	err := f.pollState(ctx, n, state)
	if err != nil && !errors.As(err, new(stopError)) {
		err = fmt.Errorf("%w; %s's log:\n%s\nthe monitor's events:\n%s", err, n.Name, tail(filepath.Join(n.dir, "run.log"), 20), f.events(ctx))
	}
	return err
}

// events are the monitor's last events, for error messages.
func (f *Formation) events(ctx context.Context) string {
	var out []string
	err := f.query(context.WithoutCancel(ctx), f.Monitor, "pg_auto_failover", func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, "SELECT eventtime::text || ' ' || description FROM pgautofailover.event ORDER BY eventid DESC LIMIT 15")
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return err.Error()
	}
	slices.Reverse(out)
	return strings.Join(out, "\n")
}

func (f *Formation) pollState(ctx context.Context, n *Node, state string) error {
	return poll(ctx, 90*time.Second, n.Name+" in state "+state, func() error {
		if n.root() != 0 {
			select {
			case <-n.done:
				return errStop(fmt.Errorf("pg_autoctl of %s exited; log:\n%s", n.Name, tail(filepath.Join(n.dir, "run.log"), 20)))
			default:
			}
		}
		states, err := f.States(ctx)
		if err != nil {
			return err
		}
		for _, s := range states {
			if s.Node == n && s.Reported == state && s.Goal == state {
				return nil
			}
		}
		return fmt.Errorf("monitor: %v", states)
	})
}

// checkMode verifies that the primary commits as the mode says: with the
// standby named in synchronous_standby_names (Sync) or with none (Async).
func (f *Formation) checkMode(ctx context.Context, primary *Node) error {
	names, err := f.SyncStandbyNames(ctx, primary)
	if err != nil {
		return err
	}
	if (f.Mode == Sync) != (names != "") {
		return fmt.Errorf("hapg: %s formation, but the primary's synchronous_standby_names is %q", f.Mode, names)
	}
	return nil
}

// SyncStandbyNames is n's synchronous_standby_names, which the monitor
// sets: empty when commits do not wait for a standby.
func (f *Formation) SyncStandbyNames(ctx context.Context, n *Node) (string, error) {
	var names, commit string
	err := f.query(ctx, n, Database, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit')").Scan(&names, &commit)
	})
	if err != nil {
		return "", fmt.Errorf("hapg: %s: %w", n.Name, err)
	}
	if names != "" && commit != "on" && commit != "remote_write" && commit != "remote_apply" {
		return "", fmt.Errorf("hapg: %s names standbys %q but synchronous_commit is %s", n.Name, names, commit)
	}
	return names, nil
}

// Primary is the node the monitor has as the primary now (primary or
// wait_primary, reached and assigned).
func (f *Formation) Primary(ctx context.Context) (*Node, error) {
	states, err := f.States(ctx)
	if err != nil {
		return nil, fmt.Errorf("hapg: monitor: %w", err)
	}
	for _, s := range states {
		if isPrimary(s.Reported) && s.Goal == s.Reported {
			return s.Node, nil
		}
	}
	return nil, fmt.Errorf("hapg: no primary now: %v", states)
}

func isPrimary(state string) bool {
	return state == "primary" || state == "wait_primary" || state == "single"
}

// Standby is a data node other than n.
func (f *Formation) Standby(n *Node) *Node {
	for _, o := range f.Nodes {
		if o != n {
			return o
		}
	}
	return nil
}

// Kill ends every process of n with SIGKILL, its keeper and its Postgres
// at once, as the loss of its machine would.
func (f *Formation) Kill(n *Node) error {
	n.mu.Lock()
	n.killed = true
	n.mu.Unlock()
	root := n.root()
	killed, err := killAll([]int{root}, n.dir, 10*time.Second)
	if root != 0 {
		<-n.done
	}
	return errors.Join(err, removeSharedMemory(killed))
}

// KillPrimary kills the current primary (see Kill) and returns it.
func (f *Formation) KillPrimary(ctx context.Context) (*Node, error) {
	p, err := f.Primary(ctx)
	if err != nil {
		return nil, err
	}
	return p, f.Kill(p)
}

// WaitPrimary waits until the manager has promoted a node other than old
// and that node takes writes, and returns it.
func (f *Formation) WaitPrimary(ctx context.Context, old *Node) (*Node, error) {
	var got *Node
	err := poll(ctx, time.Minute, "a new primary", func() error {
		p, err := f.Primary(ctx)
		if err != nil {
			return err
		}
		if p == old {
			return fmt.Errorf("%s is still the primary", p.Name)
		}
		var ro bool
		if err := f.query(ctx, p, Database, func(c *pgx.Conn) error {
			return c.QueryRow(ctx, "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'").Scan(&ro)
		}); err != nil {
			return err
		}
		if ro {
			return fmt.Errorf("%s does not take writes yet", p.Name)
		}
		got = p
		return nil
	})
	return got, err
}

// WaitNotWritable waits until n no longer takes writes: it refuses
// connections or is read-only (demoted).
func (f *Formation) WaitNotWritable(ctx context.Context, n *Node, limit time.Duration) error {
	return poll(ctx, limit, n.Name+" to stop taking writes", func() error {
		var ro bool
		err := f.query(ctx, n, Database, func(c *pgx.Conn) error {
			return c.QueryRow(ctx, "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'").Scan(&ro)
		})
		if err != nil || ro {
			return nil
		}
		return fmt.Errorf("%s takes writes", n.Name)
	})
}

// CutReplication stops (SIGSTOP) the primary's WAL sender, so that what the
// primary commits from now on stays on the primary. In Async, killed then,
// the primary's last commits are lost at promotion. In Sync every commit
// waits for the standby meanwhile, as on a primary cut off from it (the
// connection stays open, so nothing tells the monitor). The sender is
// killed with its primary; resume continues it otherwise.
func (f *Formation) CutReplication(ctx context.Context) (resume func() error, err error) {
	p, err := f.Primary(ctx)
	if err != nil {
		return nil, err
	}
	var pids []int
	if err := f.query(ctx, p, Database, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, "SELECT pid FROM pg_stat_replication")
		if err != nil {
			return err
		}
		pids, err = pgx.CollectRows(rows, pgx.RowTo[int])
		return err
	}); err != nil {
		return nil, fmt.Errorf("hapg: %w", err)
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("hapg: %s has no WAL sender", p.Name)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return nil, fmt.Errorf("hapg: stop WAL sender %d: %w", pid, err)
		}
	}
	return func() error {
		var errs []error
		for _, pid := range pids {
			if procstat.Alive(pid) {
				errs = append(errs, syscall.Kill(pid, syscall.SIGCONT))
			}
		}
		return errors.Join(errs...)
	}, nil
}

// Close kills every process of the formation and removes its directory.
// It is safe to call more than once.
func (f *Formation) Close() error {
	for _, n := range f.Nodes {
		for _, l := range []*link{n.in, n.toMonitor} {
			if l != nil {
				l.close()
			}
		}
	}
	var roots []int
	for _, n := range append([]*Node{f.Monitor}, f.Nodes...) {
		if n != nil {
			if r := n.root(); r != 0 {
				roots = append(roots, r)
			}
		}
	}
	killed, err := killAll(roots, f.Dir, 10*time.Second)
	for _, n := range append([]*Node{f.Monitor}, f.Nodes...) {
		if n != nil && n.root() != 0 {
			<-n.done
		}
	}
	err = errors.Join(err, removeSharedMemory(killed))
	if err == nil && os.Getenv("FN_TEST_HAPG_KEEP") == "1" {
		// The logs, for reading after a failure; CleanStale removes it.
		return nil
	}
	if err == nil {
		err = os.RemoveAll(f.Dir)
	}
	return err
}

// CleanStale removes the formations whose owner process is gone (a test
// run that was killed), their processes first.
func CleanStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue // being made; its owner writes this first
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil || (procstat.Alive(pid) && procstat.StartTime(pid) == f[1]) {
			continue
		}
		killed, err := killAll(nil, dir, 10*time.Second)
		if err == nil && removeSharedMemory(killed) == nil {
			_ = os.RemoveAll(dir)
		}
	}
}

// errStop ends a poll at once.
type stopError struct{ error }

func errStop(err error) error { return stopError{err} }

// poll calls try until it succeeds, returns an errStop, ctx ends or limit
// passes.
func poll(ctx context.Context, limit time.Duration, what string, try func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := try()
		if err == nil {
			return nil
		}
		if errors.As(err, new(stopError)) {
			return fmt.Errorf("hapg: waiting for %s: %w", what, err)
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("hapg: waiting for %s: %w (last: %v)", what, errors.Join(ctx.Err(), errors.New("timed out")), err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond): // bounded poll of the monitor
		}
	}
}

// tail is the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
