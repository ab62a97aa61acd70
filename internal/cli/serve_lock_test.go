//go:build unix

package cli

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSecondRelayRefused: relay serve on a SQLite database another relay
// serves stops at start, on one line naming the file and the other
// relay's pid: it would accept sends the first relay's held polls never
// see. Backup still runs beside the relay (TestBackupUnderLoad), and so
// does migrate, a deploy step.
func TestSecondRelayRefused(t *testing.T) {
	db := filepath.Join(t.TempDir(), "relay.db")
	k := newKeyed(t, map[string]string{"FN_LISTEN": "127.0.0.1:0", "FN_DATABASE_URL": "sqlite:" + db})
	p := start(t, k.vars)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stderr strings.Builder
	err := run(ctx, []string{"serve"}, env(k.vars), io.Discard, &stderr)
	want := fmt.Sprintf("FN_DATABASE_URL: sqlite: %s is in use by another relay (pid %d)", db, p.cmd.Process.Pid)
	if err == nil || err.Error() != want {
		t.Fatalf("a second relay on the database: %v, want %q\n%s", err, want, stderr.String())
	}
	if err := run(context.Background(), []string{"migrate"}, env(k.vars), io.Discard, io.Discard); err != nil {
		t.Errorf("migrate beside the relay: %v", err)
	}
}
