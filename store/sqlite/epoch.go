package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/flamenet/relay/store"
)

// sqlEpoch reads the store's epoch (migration 0004).
const sqlEpoch = `SELECT epoch FROM store_epoch WHERE id = 1`

// ensureEpoch gives a database its first epoch. It writes only when the
// row is missing, so that a database that cannot be written opens as
// before.
func (db *DB) ensureEpoch(ctx context.Context) error {
	var epoch string
	err := db.writer.QueryRowContext(ctx, sqlEpoch).Scan(&epoch)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return wrap(ctx, "read epoch", err)
	}
	return db.write(ctx, "write epoch", func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO store_epoch (id, epoch) VALUES (1, ?) ON CONFLICT (id) DO NOTHING`, store.NewEpoch())
		return err
	})
}

// epochOf reads the epoch through q, in the caller's transaction.
func epochOf(ctx context.Context, q querier) (string, error) {
	var epoch string
	if err := q.QueryRowContext(ctx, sqlEpoch).Scan(&epoch); err != nil {
		return "", fmt.Errorf("read epoch: %w", err)
	}
	return epoch, nil
}

// History reads the epoch, and names the instance by the database file's
// identity and the epoch: a file put in place of the one opened is
// another instance, even with the same epoch.
func (db *DB) History(ctx context.Context) (store.History, error) {
	epoch, err := epochOf(ctx, db.reader)
	if err != nil {
		return store.History{}, wrap(ctx, "history", err)
	}
	id, err := fileID(db.path)
	if err != nil {
		return store.History{}, fmt.Errorf("sqlite: history: %w: %w", store.ErrUnavailable, err)
	}
	return store.History{Epoch: epoch, Instance: "sqlite:" + id + ":" + epoch}, nil
}

// writeEpoch gives the database file at path a new epoch: a restored copy
// holds an older history than the one relays and clients last saw. A copy
// made before epochs existed has no table yet; it gets one, and its first
// epoch, when it is opened.
func writeEpoch(ctx context.Context, path string) error {
	db, err := sql.Open("sqlite", dsn(path, nil))
	if err != nil {
		return err
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'store_epoch'`).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO store_epoch (id, epoch) VALUES (1, ?)
		ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch`, store.NewEpoch()); err != nil {
		return err
	}
	return db.Close()
}
