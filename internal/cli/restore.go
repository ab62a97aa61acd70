package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/flamenet/relay/store/sqlite"
)

const restoreUsage = `usage: relay restore [-database-url URL] FILE

Puts the backup FILE in place of the relay's SQLite database.

It refuses while a relay has the database open (stop the relay first) and
refuses a FILE that is not a sound database of this relay; the copy gets
the database's owner and mode 0600, and the old -wal and -shm files are
removed. Devices whose cursors are ahead of the restored database are told
(409 cursor_ahead) and resynchronise. For Postgres use pg_restore.`

func restoreCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	path, file, err := sqliteFileArgs("restore", restoreUsage, args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	if err := sqlite.Restore(ctx, file, path); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "restored %s from %s; start the relay\n", path, file)
	return nil
}
