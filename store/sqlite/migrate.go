package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"time"

	"github.com/flamenet/relay/internal/migrate"
)

// Migrations are numbered files, NNNN_name.sql (internal/migrate's rules),
// applied in order, each in one transaction together with its row in
// schema_version.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

func migrations() ([]migrate.Migration, error) { return migrate.Load(migrationFS, "migrations") }

// migrate applies the migrations this file lacks. The version check runs
// inside each migration's IMMEDIATE transaction, so two processes opening
// the same file at once apply each migration exactly once.
func (db *DB) migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return fmt.Errorf("sqlite: %w", err)
	}
	if _, err := db.writer.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version    INTEGER PRIMARY KEY,
		applied_at INTEGER NOT NULL
	)`); err != nil {
		return wrap(ctx, "migrate", err)
	}
	return migrate.Apply(ctx, ms, db.log, func(ctx context.Context, m migrate.Migration) (applied bool, err error) {
		err = db.write(ctx, "migrate "+m.Name, func(tx *sql.Tx) error {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM schema_version WHERE version = ?`, m.Version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version (version, applied_at) VALUES (?, ?)`,
				m.Version, micros(time.Now())); err != nil {
				return err
			}
			applied = true
			return nil
		})
		return applied, err
	})
}

// SchemaVersion reports the highest migration applied to the file.
func (db *DB) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	if err := db.reader.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM schema_version`).Scan(&v); err != nil {
		return 0, wrap(ctx, "schema version", err)
	}
	return v, nil
}
