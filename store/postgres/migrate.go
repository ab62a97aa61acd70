package postgres

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"log/slog"

	"github.com/flamenet/relay/internal/migrate"
	"github.com/jackc/pgx/v5"
)

// Migrations are numbered files, NNNN_name.sql (internal/migrate's rules).
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

func migrations() ([]migrate.Migration, error) { return migrate.Load(migrationFiles, "migrations") }

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
func migrateSchema(ctx context.Context, conn *pgx.Conn, searchPath, createSchema string, log *slog.Logger) (err error) {
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
	return migrate.Apply(ctx, ms, log, func(ctx context.Context, m migrate.Migration) (bool, error) {
		if done[m.Version] {
			return false, nil
		}
		return true, apply(ctx, conn, m)
	})
}

func apply(ctx context.Context, conn *pgx.Conn, m migrate.Migration) error {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO schema_version (version, name) VALUES ($1, $2)", m.Version, m.Name)
		return err
	})
	return classify(fmt.Sprintf("migrate: apply %s", m.Name), err)
}
