package sqlite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/store"
)

var t0 = time.Date(2026, 11, 29, 18, 2, 3, 123456000, time.UTC)

func openTB(tb testing.TB, path string) *DB {
	tb.Helper()
	db, err := Open(context.Background(), Config{Path: path})
	if err != nil {
		tb.Fatalf("Open(%s): %v", path, err)
	}
	return db
}

func tempPath(tb testing.TB) string { return filepath.Join(tb.TempDir(), "relay.db") }

func TestReopenKeepsData(t *testing.T) {
	ctx := t.Context()
	path := tempPath(t)
	db := openTB(t, path)
	push := device.PushTarget{Kind: device.PushFCM, Address: "tok"}
	key := bytes.Repeat([]byte{7}, 32)
	if _, err := db.Register(ctx, store.RegisterParams{Household: "h", Device: "phone", Push: &push, IdentityKey: key, Now: t0}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"laptop", "old"} {
		if _, err := db.Register(ctx, store.RegisterParams{Household: "h", Device: d, Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	send := store.SendParams{Household: "h", Sender: "laptop", To: []string{"phone"}, Now: t0}
	for i := range 3 {
		send.ID, send.Payload = strconv.Itoa(i), []byte("payload "+strconv.Itoa(i))
		if _, err := db.Send(ctx, send); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Ack(ctx, store.AckParams{Household: "h", Device: "phone", Cursor: 1, Now: t0}); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteDevice(ctx, "h", "old", t0); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	db = openTB(t, path)
	defer db.Close()
	ds, err := db.Devices(ctx, store.ListParams{Household: "h"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2 || ds[1].Name != "phone" || ds[1].Push != push || !bytes.Equal(ds[1].IdentityKey, key) ||
		ds[1].Cursor != 1 || ds[1].Head != 3 || !ds[1].RegisteredAt.Equal(t0) {
		t.Fatalf("devices after reopen = %+v", ds)
	}
	b, err := db.Fetch(ctx, store.FetchParams{Household: "h", Device: "phone", Limit: 10, Budget: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Envelopes) != 2 || b.Envelopes[0].Seq != 2 || string(b.Envelopes[1].Payload) != "payload 2" {
		t.Fatalf("envelopes after reopen = %+v", b.Envelopes)
	}
	if at, err := db.RemovedAt(ctx, "h", "old"); err != nil || !at.Equal(t0) {
		t.Fatalf("RemovedAt after reopen = %v, %v", at, err)
	}
	res, err := db.Send(ctx, send)
	if err != nil || !res.Repeat {
		t.Fatalf("repeat after reopen = %+v, %v: dedupe record lost", res, err)
	}
	res, err = db.Send(ctx, store.SendParams{Household: "h", Sender: "laptop", ID: "next", To: []string{"phone"}, Payload: []byte("x"), Now: t0})
	if err != nil || res.Deliveries[0].Seq != 4 {
		t.Fatalf("send after reopen = %+v, %v, want seq 4", res, err)
	}
}

func TestMigrationsIdempotent(t *testing.T) {
	ctx := t.Context()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	latest := ms[len(ms)-1].Version
	path := tempPath(t)

	// Two opens of a fresh file at once: each migration is applied once.
	var wg sync.WaitGroup
	dbs := make([]*DB, 2)
	errs := make([]error, 2)
	for i := range dbs {
		wg.Go(func() { dbs[i], errs[i] = Open(ctx, Config{Path: path}) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Open %d: %v", i, err)
		}
		defer dbs[i].Close()
	}
	db := dbs[0]
	if err := db.migrate(ctx); err != nil {
		t.Fatalf("migrate again: %v", err)
	}
	var rows int
	if err := db.reader.QueryRowContext(ctx, `SELECT count(*) FROM schema_version`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != len(ms) {
		t.Errorf("schema_version has %d rows, want %d: a migration ran twice or not at all", rows, len(ms))
	}
	for _, d := range dbs {
		if v, err := d.SchemaVersion(ctx); err != nil || v != latest {
			t.Errorf("SchemaVersion = %d, %v, want %d", v, err, latest)
		}
	}
	for _, d := range dbs {
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}
	db = openTB(t, path)
	defer db.Close()
	if v, err := db.SchemaVersion(ctx); err != nil || v != latest {
		t.Errorf("SchemaVersion after reopen = %d, %v, want %d", v, err, latest)
	}
}

// TestNeverLocked hammers one file with writers and readers of one DB, plus
// a second DB on the same file standing in for another process. No call may
// fail: a "database is locked" (SQLITE_BUSY) anywhere is a failure.
//
// The guard is the single writer connection with BEGIN IMMEDIATE. Broken on
// purpose once (writer pool of 8 connections, _txlock left at deferred),
// this test went red at once with "database is locked (5) (SQLITE_BUSY)"
// from Send: a deferred transaction that read first cannot upgrade to a
// write lock another connection took, and busy_timeout does not help. With
// 8 writer connections but IMMEDIATE it stayed green, only slower, the
// writers waiting in busy_timeout: one connection means they never wait
// inside SQLite at all.
func TestNeverLocked(t *testing.T) {
	ctx := t.Context()
	path := tempPath(t)
	db := openTB(t, path)
	defer db.Close()
	other := openTB(t, path)
	defer other.Close()

	const writers, sendsEach = 8, 10
	devices := []string{"a", "b", "c", "d"}
	for _, d := range devices {
		if _, err := db.Register(ctx, store.RegisterParams{Household: "h", Device: d, Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	var writersWG, readersWG sync.WaitGroup
	for g := range writers {
		writersWG.Go(func() {
			for i := range sendsEach {
				to := []string{devices[(g+i)%4], devices[(g+i+1)%4]}
				if to[0] > to[1] {
					to[0], to[1] = to[1], to[0]
				}
				if _, err := db.Send(ctx, store.SendParams{Household: "h", Sender: "w" + strconv.Itoa(g), ID: strconv.Itoa(i), To: to, Payload: []byte("x"), Now: t0}); err != nil {
					t.Errorf("Send: %v", err)
					return
				}
				if i%5 == 4 {
					dev := devices[g%4]
					p, err := db.Ack(ctx, store.AckParams{Household: "h", Device: dev, Cursor: -1, Now: t0})
					if err == nil {
						_, err = db.Ack(ctx, store.AckParams{Household: "h", Device: dev, Cursor: p.Head, Now: t0})
					}
					if err != nil {
						t.Errorf("Ack: %v", err)
						return
					}
				}
			}
		})
	}
	// The other handle registers new devices: writes from a second writer
	// connection, waited out by busy_timeout.
	writersWG.Go(func() {
		for i := range 10 {
			if _, err := other.Register(ctx, store.RegisterParams{Household: "h", Device: "x" + strconv.Itoa(i), Now: t0}); err != nil {
				t.Errorf("Register on the second handle: %v", err)
				return
			}
		}
	})
	for g := range 3 {
		readersWG.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				var err error
				switch g % 3 {
				case 0:
					_, err = db.Fetch(ctx, store.FetchParams{Household: "h", Device: devices[g%4], Limit: 50, Budget: 1 << 20})
				case 1:
					_, err = db.Devices(ctx, store.ListParams{Household: "h", Limit: 100})
				default:
					_, err = other.Fetch(ctx, store.FetchParams{Household: "h", Device: devices[g%4], Limit: 50, Budget: 1 << 20})
				}
				if err != nil {
					t.Errorf("read: %v", err)
					return
				}
			}
		})
	}
	writersWG.Wait()
	close(done)
	readersWG.Wait()

	var total int64
	for _, d := range devices {
		p, err := db.Ack(ctx, store.AckParams{Household: "h", Device: d, Cursor: -1, Now: t0})
		if err != nil {
			t.Fatal(err)
		}
		total += p.Head
	}
	if want := int64(writers * sendsEach * 2); total != want {
		t.Errorf("heads add up to %d, want %d", total, want)
	}
}

func TestPrefix(t *testing.T) {
	tests := []struct {
		name   string
		sizes  []int64
		limit  int
		budget int64
		n      int
		more   bool
	}{
		{"nothing", nil, 10, 100, 0, false},
		{"all fit", []int64{10, 10}, 10, 100, 2, false},
		{"limit", []int64{1, 1, 1}, 2, 100, 2, true},
		{"budget", []int64{40, 40, 40}, 10, 100, 2, true},
		{"exact budget", []int64{50, 50}, 10, 100, 2, false},
		{"first over budget", []int64{500, 1}, 10, 100, 1, true},
		{"prefix, not a skip", []int64{60, 60, 1}, 10, 100, 1, true},
		{"no limit", []int64{1, 1, 1}, 0, 100, 3, false},
		{"no budget", []int64{1000, 1000}, 10, 0, 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, more := prefix(tt.sizes, tt.limit, tt.budget)
			if n != tt.n || more != tt.more {
				t.Errorf("prefix(%v, %d, %d) = %d, %v, want %d, %v", tt.sizes, tt.limit, tt.budget, n, more, tt.n, tt.more)
			}
		})
	}
}

// writes reports how many rows the writer connection has changed since it
// opened: the one connection every write goes through.
func writes(tb testing.TB, db *DB) int64 {
	tb.Helper()
	var n int64
	if err := db.writer.QueryRowContext(context.Background(), `SELECT total_changes()`).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// TestAckWritesOnlyWhenNeeded: a poll that moves nothing must not be a
// write, or every held poll would queue behind the single writer.
// Broken on purpose once (the reader fast path removed, every ack taking
// the writer), this test went red at "position only".
func TestAckWritesOnlyWhenNeeded(t *testing.T) {
	ctx := t.Context()
	db := openTB(t, tempPath(t))
	defer db.Close()
	if _, err := db.Register(ctx, store.RegisterParams{Household: "h", Device: "a", Now: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Send(ctx, store.SendParams{Household: "h", Sender: "a", ID: "1", To: []string{"a"}, Payload: []byte("x"), Now: t0}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name   string
		cursor int64
		now    time.Time
		write  bool
	}{
		{"position only", -1, t0.Add(time.Second), false},
		{"cursor not moving", 0, t0.Add(30 * time.Second), false},
		{"cursor moves", 1, t0.Add(40 * time.Second), true},
		{"same cursor again", 1, t0.Add(50 * time.Second), false},
		{"last seen stale", -1, t0.Add(3 * time.Minute), true},
		{"fresh again", -1, t0.Add(3*time.Minute + time.Second), false},
	}
	for _, st := range steps {
		before := writes(t, db)
		if _, err := db.Ack(ctx, store.AckParams{Household: "h", Device: "a", Cursor: st.cursor, Now: st.now}); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if wrote := writes(t, db) > before; wrote != st.write {
			t.Errorf("%s: wrote %v, want %v", st.name, wrote, st.write)
		}
	}
	ds, err := db.Devices(ctx, store.ListParams{Household: "h"})
	if err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(3 * time.Minute); !ds[0].LastSeen.Equal(want) {
		t.Errorf("LastSeen = %v, want %v", ds[0].LastSeen, want)
	}
}

// TestPingOwnConnection: the readiness probe must answer while every reader
// is taken. Broken on purpose once (Ping on the reader pool), it went red
// with a deadline error.
func TestPingOwnConnection(t *testing.T) {
	db, err := Open(t.Context(), Config{Path: tempPath(t), Readers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for range 2 {
		c, err := db.reader.Conn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if err := db.Ping(ctx); err != nil {
		t.Fatalf("Ping with the read pool taken: %v", err)
	}
}

func TestConnections(t *testing.T) {
	ctx := t.Context()
	tests := []struct {
		name, sync string
		want       int // PRAGMA synchronous
	}{
		{"default is FULL", "", 2},
		{"normal", "normal", 1},
		{"extra", "EXTRA", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, err := Open(ctx, Config{Path: tempPath(t), Synchronous: tt.sync})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var sync int
			var mode string
			if err := db.writer.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&sync); err != nil {
				t.Fatal(err)
			}
			if err := db.writer.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
				t.Fatal(err)
			}
			if sync != tt.want || mode != "wal" {
				t.Errorf("synchronous %d journal %s, want %d wal", sync, mode, tt.want)
			}
			if got := db.writer.Stats().MaxOpenConnections; got != 1 {
				t.Errorf("writer pool of %d, want exactly 1", got)
			}
			// Readers cannot write, even by mistake.
			if _, err := db.reader.ExecContext(ctx, `INSERT INTO removals VALUES ('h', 'd', 0)`); err == nil {
				t.Error("a reader connection wrote")
			}
		})
	}
	if _, err := Open(ctx, Config{Path: tempPath(t), Synchronous: "sometimes"}); err == nil {
		t.Error("Open accepted synchronous=sometimes")
	}
	if _, err := Open(ctx, Config{}); err == nil {
		t.Error("Open accepted an empty path")
	}
}

func TestErrors(t *testing.T) {
	t.Run("unopenable file is unavailable", func(t *testing.T) {
		dir := t.TempDir() // a directory is no database file
		_, err := Open(t.Context(), Config{Path: dir})
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("Open(directory) = %v, want ErrUnavailable", err)
		}
	})
	t.Run("not a database is not unavailable", func(t *testing.T) {
		path := tempPath(t)
		if err := os.WriteFile(path, bytes.Repeat([]byte("not sqlite "), 1000), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Open(t.Context(), Config{Path: path})
		if err == nil || errors.Is(err, store.ErrUnavailable) {
			t.Errorf("Open(garbage) = %v, want an error that retrying will not fix", err)
		}
	})

	db := openTB(t, tempPath(t))
	defer db.Close()
	if _, err := db.Register(t.Context(), store.RegisterParams{Household: "h", Device: "a", Now: t0}); err != nil {
		t.Fatal(err)
	}
	send := store.SendParams{Household: "h", Sender: "a", ID: "1", To: []string{"a"}, Payload: []byte("x"), Now: t0}
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := db.Send(ctx, send)
		if !errors.Is(err, context.Canceled) || errors.Is(err, store.ErrUnavailable) {
			t.Errorf("Send with a cancelled context = %v, want context.Canceled only", err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
		defer cancel()
		_, err := db.Fetch(ctx, store.FetchParams{Household: "h", Device: "a", Limit: 1})
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Fetch past its deadline = %v, want ErrUnavailable and DeadlineExceeded", err)
		}
	})
	t.Run("store errors pass through", func(t *testing.T) {
		_, err := db.Send(t.Context(), store.SendParams{Household: "h", Sender: "a", ID: "2", To: []string{"nobody"}, Payload: []byte("x"), Now: t0})
		var ue *store.UnknownDeviceError
		if !errors.As(err, &ue) || ue.Device != "nobody" {
			t.Errorf("Send to nobody = %v", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		db := openTB(t, tempPath(t))
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Errorf("second Close = %v", err)
		}
		if err := db.Ping(t.Context()); err == nil {
			t.Error("Ping of a closed DB succeeded")
		}
	})
}

func Example() {
	dir, _ := os.MkdirTemp("", "relay")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	db, err := Open(ctx, Config{Path: filepath.Join(dir, "relay.db")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	_, _ = db.Register(ctx, store.RegisterParams{Household: "home", Device: "phone", Now: time.Now()})
	res, _ := db.Send(ctx, store.SendParams{Household: "home", Sender: "laptop", ID: "1", To: []string{"phone"}, Payload: []byte("hi"), Now: time.Now()})
	fmt.Println(res.Deliveries[0].Device, res.Deliveries[0].Seq)
	// Output: phone 1
}

// TestOddPath: the DSN is a file: URI, so a path holding URI syntax must
// still name the file it says, and a missing directory is created.
func TestOddPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "my dir?x=1#frag%20", "relay.db")
	db := openTB(t, path)
	defer db.Close()
	if _, err := db.Register(t.Context(), store.RegisterParams{Household: "h", Device: "a", Now: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database not at its path: %v", err)
	}
}
