// Package migrate reads a store backend's migrations, numbered files
// NNNN_name.sql, and applies in order those a database lacks. Each backend
// says how one is applied (its transaction, its record in schema_version,
// how concurrent openers take turns); the files' rules and the order are
// here, once.
package migrate

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Migration is one file: applied once, in version order, never edited once
// released (a change is a new file).
type Migration struct {
	Version int
	Name    string // the file's name, NNNN_name.sql
	SQL     string
}

// Load returns the migrations in dir of fsys, in version order. Every file
// there must be NNNN_name.sql with a positive NNNN that no other file has.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []Migration
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
		body, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", name, err)
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(body)})
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("no migrations in %s", dir)
	}
	slices.SortFunc(ms, func(a, b Migration) int { return a.Version - b.Version })
	return ms, nil
}

// Apply applies ms in order with apply, which reports whether it applied
// one (false: the database had it already), and logs each one applied. It
// stops at the first error.
func Apply(ctx context.Context, ms []Migration, log *slog.Logger, apply func(context.Context, Migration) (bool, error)) error {
	for _, m := range ms {
		applied, err := apply(ctx, m)
		if err != nil {
			return err
		}
		if applied {
			log.Info("applied migration", "version", m.Version, "name", m.Name)
		}
	}
	return nil
}
