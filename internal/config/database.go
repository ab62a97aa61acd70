package config

import (
	"errors"
	"strings"
)

// Kind is a store backend.
type Kind string

const (
	SQLite   Kind = "sqlite"
	Postgres Kind = "postgres"
)

// Database is FN_DATABASE_URL read: SQLite's file or Postgres's connection
// string. ParseDatabaseURL is the one reader of that URL.
type Database struct {
	Kind Kind
	Path string // SQLite's file
	DSN  string // Postgres's URL, as given (pgx reads its parameters)
}

// ParseDatabaseURL reads sqlite:PATH, postgres://... or postgresql://....
func ParseDatabaseURL(v string) (Database, error) {
	if path, ok := strings.CutPrefix(v, "sqlite:"); ok {
		if path == "" {
			return Database{}, errors.New("sqlite: needs a path")
		}
		return Database{Kind: SQLite, Path: path}, nil
	}
	if strings.HasPrefix(v, "postgres://") || strings.HasPrefix(v, "postgresql://") {
		return Database{Kind: Postgres, DSN: v}, nil
	}
	return Database{}, errors.New("want sqlite:PATH or a postgres:// URL")
}

// URL returns the database as FN_DATABASE_URL spells it.
func (d Database) URL() string {
	if d.Kind == SQLite {
		return "sqlite:" + d.Path
	}
	return d.DSN
}
