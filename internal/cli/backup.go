package cli

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/flamenet/relay/internal/config"
	"github.com/flamenet/relay/store/sqlite"
)

const backupUsage = `usage: relay backup [-database-url URL] FILE

Writes a consistent copy of the relay's SQLite database to FILE (a new
file, mode 0600) while relays go on using it.

Every envelope accepted before the copy began is in it. Run it as the
relay's user or as root. For Postgres use pg_dump or your provider's
backups.`

// backupCmd and restoreCmd: relay backup FILE, relay restore FILE.
func backupCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	path, file, err := sqliteFileArgs("backup", backupUsage, args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	if err := sqlite.Backup(ctx, path, file); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "backed up %s to %s\n", path, file)
	return nil
}

// sqliteFileArgs reads -database-url (FN_DATABASE_URL) and the one FILE.
func sqliteFileArgs(name, usage string, args []string, getenv func(string) string, stdout, stderr io.Writer) (path, file string, err error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	dbURL := fs.String("database-url", "sqlite:data/relay.db", "the relay's database (env FN_DATABASE_URL)")
	if err := parseFlagsEnv(fs, args, getenv, map[string]string{"database-url": "FN_DATABASE_URL"}, usage, stdout, stderr); err != nil {
		return "", "", err
	}
	if fs.NArg() != 1 {
		return "", "", usageErr("%s: give one FILE", name)
	}
	db, err := config.ParseDatabaseURL(*dbURL)
	if err != nil {
		return "", "", usageErr("%s: -database-url: %w", name, err)
	}
	if db.Kind != config.SQLite {
		return "", "", usageErr("%s: the database is Postgres: use pg_dump and pg_restore, or your provider's backups", name)
	}
	return db.Path, fs.Arg(0), nil
}
