package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flamenet/relay/store"
)

// codeDeadlock is the SQLSTATE of a deadlock, which the lock order of
// docs/FANOUT.md rules out; tests look for it by name.
const codeDeadlock = "40P01"

// classify wraps a driver error for the caller: anything that means "the
// database cannot answer right now" (unreachable, busy, locked, read-only,
// not set up) becomes store.ErrUnavailable, so the client is told to come
// back (503 with Retry-After) rather than that the relay failed (keeping
// the cause, so errors.Is also finds context errors and errors.As finds the
// *pgconn.PgError), everything else is wrapped as it is.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	if unavailable(err) {
		return fmt.Errorf("postgres: %s: %w: %w", op, store.ErrUnavailable, err)
	}
	return fmt.Errorf("postgres: %s: %w", op, err)
}

func unavailable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"): // connection exception
			return true
		case pgErr.Code == "57P01", // admin_shutdown
			pgErr.Code == "57P02", // crash_shutdown
			pgErr.Code == "57P03", // cannot_connect_now (starting up, recovering)
			pgErr.Code == "57014", // query_canceled: our ctx ended, or statement_timeout
			pgErr.Code == "53300", // too_many_connections
			pgErr.Code == "53000", // insufficient_resources
			pgErr.Code == "25P03", // idle_in_transaction_session_timeout
			pgErr.Code == "55P03", // lock_not_available: lock_timeout, someone holds the row
			pgErr.Code == "40001", // serialization_failure
			pgErr.Code == codeDeadlock,
			pgErr.Code == "25006", // read_only_sql_transaction: a standby after failover
			pgErr.Code == "42P01", // undefined_table: a database recreated empty
			pgErr.Code == "42883", // undefined_function: the same
			pgErr.Code == "3F000", // invalid_schema_name: the same
			pgErr.Code == "3D000", // invalid_catalog_name: the database is gone
			pgErr.Code == "57P04", // database_dropped
			pgErr.Code == "53100", // disk_full
			pgErr.Code == "53200": // out_of_memory
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connectErr),
		errors.As(err, &netErr),
		pgconn.Timeout(err),
		pgconn.SafeToRetry(err),
		errors.Is(err, pgconn.ErrConnClosed),
		errors.Is(err, net.ErrClosed),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF):
		return true
	}
	return false
}
