package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"

	"modernc.org/sqlite"
)

// Every statement the store runs stays prepared on its connection.
//
// database/sql prepares a statement for each query it is not given a
// prepared one for, and SQLite parses and plans a statement each time it is
// prepared: on the send path that came to more CPU than the statements' own
// work. The store's statements are a few dozen constant strings, so each
// connection keeps them prepared, keyed by their text, and runs them again
// from there.

// maxCachedStmts bounds the statements one connection keeps. Some are
// built at run time (expiry's DELETE ... IN with one mark per row), so a
// full cache makes room by finalizing one it holds: the store's constant
// statements, run far more often, are soon prepared again and stay.
const maxCachedStmts = 128

// openDB is sql.Open for the SQLite driver, with prepared statements kept.
func openDB(dsn string) (*sql.DB, error) {
	c, err := sqlite.NewConnector(dsn)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(cachingConnector{c}), nil
}

type cachingConnector struct{ driver.Connector }

func (c cachingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	cc, ok := dc.(driverConn)
	if !ok {
		_ = dc.Close()
		return nil, fmt.Errorf("sqlite: the driver's connection (%T) lacks the context methods", dc)
	}
	return &cachingConn{driverConn: cc, stmts: make(map[string]*cachedStmt)}, nil
}

// driverConn is what database/sql uses of the driver's connection. The
// wrapper implements each of these itself: embedding only driver.Conn would
// hide them, and database/sql would fall back to the context-free methods.
type driverConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

// cachingConn is a connection that keeps its statements prepared.
// database/sql uses a connection from one goroutine at a time (a Rows
// closes under the connection's lock), so the map needs no lock of its own.
type cachingConn struct {
	driverConn
	stmts    map[string]*cachedStmt
	prepared int // statements prepared for the cache, for tests
}

type cachedStmt struct {
	ds driver.Stmt
	// busy: rows of this statement are open; the same text run meanwhile
	// (a query inside a loop over its own rows) gets a statement of its
	// own, since a statement runs once at a time.
	busy bool
}

// stmt is query's prepared statement, or nil when the query is to run
// without one.
func (c *cachingConn) stmt(ctx context.Context, query string) *cachedStmt {
	if s, ok := c.stmts[query]; ok {
		if s.busy {
			return nil
		}
		return s
	}
	if len(c.stmts) >= maxCachedStmts && !c.evictOne() {
		return nil
	}
	ds, err := c.driverConn.PrepareContext(ctx, query)
	if err != nil {
		return nil // the run without the cache reports it
	}
	s := &cachedStmt{ds: ds}
	c.stmts[query] = s
	c.prepared++
	return s
}

// evictOne finalizes one statement that no rows hold (whichever the map
// gives first); false if every one is busy.
func (c *cachingConn) evictOne() bool {
	for q, s := range c.stmts {
		if !s.busy {
			_ = s.ds.Close()
			delete(c.stmts, q)
			return true
		}
	}
	return false
}

func (c *cachingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	s := c.stmt(ctx, query)
	if s == nil {
		return c.driverConn.ExecContext(ctx, query, args)
	}
	return s.ds.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (c *cachingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	s := c.stmt(ctx, query)
	if s == nil {
		return c.driverConn.QueryContext(ctx, query, args)
	}
	rows, err := s.ds.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		return nil, err
	}
	s.busy = true
	return &cachedRows{Rows: rows, s: s}, nil
}

// Close finalizes the statements before the connection: SQLite closes a
// connection only once its statements are gone.
func (c *cachingConn) Close() error {
	for q, s := range c.stmts {
		_ = s.ds.Close()
		delete(c.stmts, q)
	}
	return c.driverConn.Close()
}

// cachedRows frees its statement for the next run when closed (the driver
// resets a statement, rather than finalizing it, when its rows close).
type cachedRows struct {
	driver.Rows
	s *cachedStmt
}

func (r *cachedRows) Close() error {
	err := r.Rows.Close()
	r.s.busy = false
	return err
}
