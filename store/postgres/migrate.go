package postgres

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one numbered file of migrations/, applied once, in order.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations reads the embedded files. A name is NNNN_what.sql; the number
// is the version recorded in schema_version.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []migration
	seen := make(map[int]string)
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		if !ok || path.Ext(name) != ".sql" {
			return nil, fmt.Errorf("migration %q: want NNNN_name.sql", name)
		}
		v, err := strconv.Atoi(num)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %q: bad version %q", name, num)
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %q and %q share version %d", other, name, v)
		}
		seen[v] = name
		body, err := migrationFiles.ReadFile("migrations/" + name)
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", name, err)
		}
		ms = append(ms, migration{version: v, name: name, sql: string(body)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// migrateLockKey names the advisory lock that serialises migrations of one
// schema (search_path), so that replicas starting together take turns while
// tests migrating their own schemas do not wait on each other.
func migrateLockKey(searchPath string) int64 {
	h := fnv.New64a()
	h.Write([]byte("github.com/flamenet/relay/store/postgres migrate\x00" + searchPath))
	return int64(h.Sum64())
}

// migrate applies the migrations that schema_version does not list yet,
// each in its own transaction, holding a session advisory lock on conn for
// the whole run. conn is a connection of its own: the lock must stay on one
// session, and a pooled connection would go back to the pool still holding
// it if the unlock failed. createSchema, when not empty, is created first.
func migrate(ctx context.Context, conn *pgx.Conn, searchPath, createSchema string, log *slog.Logger) (err error) {
	ms, err := migrations()
	if err != nil {
		return err
	}
	key := migrateLockKey(searchPath)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return classify("migrate: lock", err)
	}
	defer func() {
		// A failed unlock is harmless: closing the connection releases it.
		if _, uerr := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", key); uerr != nil && err == nil {
			err = classify("migrate: unlock", uerr)
		}
	}()

	if createSchema != "" {
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{createSchema}.Sanitize()); err != nil {
			return classify("migrate: create schema", err)
		}
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return classify("migrate: schema_version", err)
	}
	rows, err := conn.Query(ctx, "SELECT version FROM schema_version")
	if err != nil {
		return classify("migrate: read versions", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return classify("migrate: read versions", err)
	}
	done := make(map[int]bool, len(applied))
	for _, v := range applied {
		done[v] = true
	}
	for _, m := range ms {
		if done[m.version] {
			continue
		}
		if err := apply(ctx, conn, m); err != nil {
			return err
		}
		log.Info("applied migration", "version", m.version, "name", m.name)
	}
	return nil
}

func apply(ctx context.Context, conn *pgx.Conn, m migration) error {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO schema_version (version, name) VALUES ($1, $2)", m.version, m.name)
		return err
	})
	return classify(fmt.Sprintf("migrate: apply %s", m.name), err)
}
