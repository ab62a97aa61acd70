package client_test

import (
	"context"
	"crypto/ed25519"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/relay"
	"github.com/flamenet/relay/store/sqlite"
)

// TestListenAfterRestore, through the real relay: the phone handled m1 to
// m5 (cursor 5), then the relay's database is restored from a backup taken
// after m3, and the laptop sends n4 and n5, which take seqs 4 and 5 again.
// The phone's cursor 5 is not above the head, so only the epoch it kept
// with it tells the relay that it names m4 and m5, not n4 and n5: the
// relay answers 409 cursor_ahead, Listen resynchronises, and n4 and n5 are
// handed over, not skipped. The restored store never saw the phone's
// acknowledgements, so m1 to m3 come again too, as the protocol allows.
func TestListenAfterRestore(t *testing.T) {
	dir := t.TempDir()
	db, bak := filepath.Join(dir, "relay.db"), filepath.Join(t.TempDir(), "backup.db")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := startRelay(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	phoneTok, laptopTok := r.token("h", "phone"), r.token("h", "laptop")
	send := func(url string, ids ...string) {
		t.Helper()
		laptop := newClient(t, url, laptopTok)
		for _, id := range ids {
			if _, err := laptop.Send(ctx, id, []string{"phone"}, []byte(id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := newClient(t, r.URL, phoneTok).Register(ctx); err != nil {
		t.Fatal(err)
	}
	send(r.URL, "m1", "m2", "m3")
	if err := sqlite.Backup(ctx, db, bak); err != nil {
		t.Fatal(err)
	}
	send(r.URL, "m4", "m5")
	cursors := client.FileCursor(filepath.Join(t.TempDir(), "phone.cursor"))
	var log stateLog
	got, err := listenUntil(t, newClient(t, r.URL, phoneTok, client.WithWait(2), client.WithStateFunc(log.add)), cursors, 5, 20*time.Second)
	if err != nil || len(got) != 5 {
		t.Fatalf("before the restore: %v, %v", seqs(got), err)
	}
	before, _ := cursors.Load(ctx)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	if err := sqlite.Restore(ctx, bak, db); err != nil {
		t.Fatal(err)
	}
	// The tokens stay good: the relay trusts the first one's key.
	r2, err := startRelay(dir, func(c *relay.Config) { c.IssuerKeys = []ed25519.PublicKey{r.key.Public().(ed25519.PublicKey)} })
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r2.stop(); err != nil {
			t.Error(err)
		}
	}()
	send(r2.URL, "n4", "n5")
	phone := newClient(t, r2.URL, phoneTok, client.WithWait(2), client.WithStateFunc(log.add))
	got, err = listenUntil(t, phone, cursors, 5, 20*time.Second)
	var ids []string
	for _, e := range got {
		ids = append(ids, e.ID)
	}
	if err != nil || !slices.Equal(ids, []string{"m1", "m2", "m3", "n4", "n5"}) {
		t.Fatalf("after the restore, handed over %v (%v), want m1 m2 m3 n4 n5", ids, err)
	}
	after, _ := cursors.Load(ctx)
	if before.Epoch == "" || after.Epoch == "" || after.Epoch == before.Epoch || after.Cursor != 5 {
		t.Errorf("position %+v before the restore, %+v after", before, after)
	}
	if rs := log.resyncs(); len(rs) != 1 || rs[0].Position.Epoch != after.Epoch {
		t.Errorf("resyncs reported: %+v", rs)
	}
}
