package servicetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/url"
	"os/exec"
	"sync"
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
// for tests that stop and restart it.
type RedisServer struct {
	tb   testing.TB
	port string
	mu   sync.Mutex
	cmd  *exec.Cmd
}

// StartRedis starts a private redis-server. A missing binary skips the
// test, or fails it under FN_TEST_REQUIRE_SERVICES=1.
func StartRedis(tb testing.TB) *RedisServer {
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
	s := &RedisServer{tb: tb, port: port}
	s.Start()
	tb.Cleanup(s.Stop)
	return s
}

// URL is the server's address as a redis:// URL.
func (s *RedisServer) URL() string { return "redis://127.0.0.1:" + s.port + "/0" }

// Start (re)starts the server on its port and waits until it listens.
func (s *RedisServer) Start() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := exec.Command("redis-server", "--port", s.port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("start redis-server: %v", err)
	}
	s.cmd = cmd
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+s.port, time.Second)
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
