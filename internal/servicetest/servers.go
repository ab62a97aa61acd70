package servicetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresDatabase creates a throwaway database on the test server and
// returns its URL; it is dropped when the test ends.
func PostgresDatabase(tb testing.TB) string {
	tb.Helper()
	admin := PostgresURL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		Unavailable(tb, "FN_TEST_DATABASE_URL", err)
	}
	defer conn.Close(ctx)
	name := "relay_test_" + randomHex(6)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("create database: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			tb.Errorf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			tb.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		tb.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// KeyPrefix is a Redis key prefix unique to one test.
func KeyPrefix() string { return "fntest:" + randomHex(6) + ":" }

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// RedisServer is a redis-server of the test's own on a free loopback port,
// for tests that stop, pause and restart it.
type RedisServer struct {
	tb   testing.TB
	port string
	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
}

// StartRedis starts a private redis-server; args are added to its command
// line (e.g. "--requirepass", "secret"). A missing binary skips the test,
// or fails it under FN_TEST_REQUIRE_SERVICES=1.
func StartRedis(tb testing.TB, args ...string) *RedisServer {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		Unavailable(tb, "redis-server on PATH", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	s := &RedisServer{tb: tb, port: port, args: args}
	s.Start()
	tb.Cleanup(s.Stop)
	return s
}

// URL is the server's address as a redis:// URL.
func (s *RedisServer) URL() string { return "redis://127.0.0.1:" + s.port + "/0" }

// Addr is the server's host:port.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + s.port }

// Start (re)starts the server on its port and waits until it listens.
func (s *RedisServer) Start() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	args := append([]string{"--port", s.port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}, s.args...)
	cmd := exec.Command("redis-server", args...)
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("start redis-server: %v", err)
	}
	s.cmd = cmd
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("redis-server on port %s not listening after 10s: %v", s.port, err)
		}
		time.Sleep(10 * time.Millisecond) // bounded poll for the listener
	}
}

// Stop kills the server; it is safe to call when it is not running.
func (s *RedisServer) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Pause stops the server's process (SIGSTOP) without closing its sockets:
// connections stay open and nothing is answered, as with a Redis stuck in
// a long command or a paused VM. Resume continues it.
func (s *RedisServer) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *RedisServer) Resume() { s.signal(syscall.SIGCONT) }

func (s *RedisServer) signal(sig syscall.Signal) {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.tb.Fatalf("redis-server on port %s is not running", s.port)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.tb.Fatalf("signal redis-server: %v", err)
	}
}

// RedisCluster is a Redis Cluster of the test's own: masters (and
// replicas) on loopback ports, each a RedisServer with cluster mode on.
type RedisCluster struct {
	Nodes []*RedisServer // masters first, in the order redis-cli made them
}

// StartRedisCluster starts masters x (1 + replicas) cluster-enabled
// redis-servers in a temp dir, joins them with redis-cli --cluster create
// (slots split evenly over the masters) and waits until every node says
// cluster_state:ok. A missing redis-server or redis-cli skips the test, or
// fails it under FN_TEST_REQUIRE_SERVICES=1.
func StartRedisCluster(tb testing.TB, masters, replicas int) *RedisCluster {
	tb.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			Unavailable(tb, "PATH (redis-server and redis-cli, for a test cluster)", err)
		}
	}
	dir := tb.TempDir()
	c := &RedisCluster{}
	n := masters * (1 + replicas)
	for range n {
		port := clusterPort(tb)
		s := &RedisServer{tb: tb, port: port, args: []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes-"+port+".conf"),
			"--cluster-node-timeout", "1000",
			// A replica may take over however long its link was down:
			// the test's data is not worth a cluster without a master.
			"--cluster-replica-validity-factor", "0",
			"--dir", dir,
		}}
		s.Start()
		tb.Cleanup(s.Stop)
		c.Nodes = append(c.Nodes, s)
	}
	args := []string{"--cluster", "create"}
	for _, s := range c.Nodes {
		args = append(args, s.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	c.WaitOK(tb, 30*time.Second)
	c.waitReplicas(tb, 30*time.Second)
	return c
}

// waitReplicas waits until every replica's link to its master is up, so
// that a test may fail a master over at once.
func (c *RedisCluster) waitReplicas(tb testing.TB, d time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for _, s := range c.Nodes {
		for {
			info, err := exec.Command("redis-cli", "-p", s.port, "info", "replication").Output()
			if err == nil && (strings.Contains(string(info), "role:master") || strings.Contains(string(info), "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("redis cluster node %s: replication link not up after %v", s.Addr(), d)
			}
			time.Sleep(50 * time.Millisecond) // bounded poll of INFO replication
		}
	}
}

// clusterPort is a free loopback port whose cluster bus port (+10000) is
// free too.
func clusterPort(tb testing.TB) string {
	tb.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("listen: %v", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		if p+10000 > 65535 {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+10000))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		return strconv.Itoa(p)
	}
	tb.Fatal("no free port pair for a cluster node")
	return ""
}

// URL is a cluster URL for wake/redis.NewClient naming every node as a
// seed.
func (c *RedisCluster) URL() string {
	u := "redis://" + c.Nodes[0].Addr() + "?cluster=true"
	for _, s := range c.Nodes[1:] {
		u += "&addr=" + s.Addr()
	}
	return u
}

// CLI runs redis-cli against the node at addr and returns its output.
func (c *RedisCluster) CLI(tb testing.TB, addr string, args ...string) string {
	tb.Helper()
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redis-cli -p %s %s: %v\n%s", port, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// WaitOK polls CLUSTER INFO on every running node until each says
// cluster_state:ok with all slots served, or fails the test after d.
func (c *RedisCluster) WaitOK(tb testing.TB, d time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for {
		ok := true
		for _, s := range c.Nodes {
			s.mu.Lock()
			running := s.cmd != nil
			s.mu.Unlock()
			if !running {
				continue
			}
			info, err := exec.Command("redis-cli", "-p", s.port, "cluster", "info").Output()
			if err != nil || !strings.Contains(string(info), "cluster_state:ok") || !strings.Contains(string(info), "cluster_slots_ok:16384") {
				ok = false
				break
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redis cluster not ok after %v", d)
		}
		time.Sleep(50 * time.Millisecond) // bounded poll of CLUSTER INFO
	}
}

// WaitFailover waits until the other nodes agree that the node at dead has
// failed and every slot is served again (by a promoted replica).
func (c *RedisCluster) WaitFailover(tb testing.TB, dead string, d time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for {
		done := true
		for _, s := range c.Nodes {
			if s.Addr() == dead {
				continue
			}
			nodes, err1 := exec.Command("redis-cli", "-p", s.port, "cluster", "nodes").Output()
			info, err2 := exec.Command("redis-cli", "-p", s.port, "cluster", "info").Output()
			if err1 != nil || err2 != nil || !strings.Contains(string(info), "cluster_state:ok") || !failedIn(string(nodes), dead) {
				done = false
				break
			}
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redis cluster: no failover of %s after %v", dead, d)
		}
		time.Sleep(50 * time.Millisecond) // bounded poll of CLUSTER NODES
	}
}

// failedIn reports whether CLUSTER NODES output marks addr as failed
// ("fail", not the unconfirmed "fail?") and serving no slots.
func failedIn(nodes, addr string) bool {
	for line := range strings.SplitSeq(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) >= 8 && strings.HasPrefix(f[1], addr+"@") {
			return strings.Contains(","+f[2]+",", ",fail,") && len(f) == 8
		}
	}
	return false
}
