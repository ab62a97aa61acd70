package cli

import (
	"context"
	"fmt"
	"io"
)

func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig("migrate", "Applies the store's migrations to FN_DATABASE_URL's database and exits.", args, getenv, stdout,
		"FN_DATABASE_URL", "FN_SQLITE_SYNCHRONOUS", "FN_STORE_LOCK_TIMEOUT", "FN_PG_MAX_CONNECTIONS_PER_LOOP", "FN_LOG_LEVEL", "FN_LOG_FORMAT")
	if err != nil {
		return err
	}
	st, err := openStore(ctx, cfg, newLogger(cfg, stderr))
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "migrations applied")
	return st.Close()
}
