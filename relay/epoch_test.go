package relay

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"testing"

	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/store/sqlite"
	"github.com/flamenet/relay/wake/local"
)

// sqliteRelay serves the SQLite database at path with the issuer key key,
// so that tokens outlive a restart; stop shuts it down and closes the
// database.
func sqliteRelay(t *testing.T, path string, key ed25519.PrivateKey, mutate func(*Config)) (h *harness, db *sqlite.DB, stop func()) {
	t.Helper()
	db, err := sqlite.Open(context.Background(), sqlite.Config{Path: path, Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	h = newHarnessWith(t, Deps{Store: db, Hub: local.New(nil)}, func(c *Config) {
		c.IssuerKeys = []ed25519.PublicKey{key.Public().(ed25519.PublicKey)}
		c.IssuerKey = key
		if mutate != nil {
			mutate(c)
		}
	})
	h.key, h.db = key, db
	return h, db, func() {
		h.shutdown()
		h.client.CloseIdleConnections()
		if err := db.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}
}

// TestEpochRestoreResync: a device acknowledged up to seq 5; the database
// is restored from a backup taken at seq 2; new sends bring the device's
// head past 5 again. Polling with its old cursor and epoch, the device
// gets 409 cursor_ahead with the new epoch; it resynchronises (a poll
// without cursor and epoch) and receives every envelope the restored store
// holds, the ones given seqs 3 to 5 anew included. Without the epoch check
// in acknowledge, the old cursor is taken: the poll answers seqs 6 and 7
// only, and 3 to 5 are never seen.
func TestEpochRestoreResync(t *testing.T) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path, backup := filepath.Join(dir, "relay.db"), filepath.Join(dir, "backup.db")

	h, _, stop := sqliteRelay(t, path, key, nil)
	phone, laptop := h.register("home", "phone"), h.register("home", "laptop")
	for i := 1; i <= 2; i++ {
		h.send(laptop, fmt.Sprint("old-", i), []byte("x"), "phone")
	}
	if err := sqlite.Backup(context.Background(), path, backup); err != nil {
		t.Fatal(err)
	}
	for i := 3; i <= 5; i++ {
		h.send(laptop, fmt.Sprint("lost-", i), []byte("x"), "phone")
	}
	p := h.poll(phone, "cursor=0&wait=0")
	if len(p.Envelopes) != 5 || p.Cursor != 5 || len(p.Epoch) != 16 {
		t.Fatalf("first poll: %+v", p)
	}
	old := p.Epoch
	h.must("POST", "/v1/ack", phone, map[string]any{"cursor": 5, "epoch": old}, http.StatusNoContent)
	stop() // writes the acknowledgement

	if err := sqlite.Restore(context.Background(), backup, path); err != nil {
		t.Fatal(err)
	}
	h, db, stop := sqliteRelay(t, path, key, nil)
	defer stop()
	var want []string
	for _, e := range fetchEverything(t, db, "phone") {
		want = append(want, e.ID)
	}
	for i := 3; i <= 7; i++ {
		id := fmt.Sprint("new-", i)
		if seq := h.send(laptop, id, []byte("y"), "phone").Deliveries[0].Seq; seq != int64(i) {
			t.Fatalf("%s given seq %d, want %d: the restore did not bring the head back", id, seq, i)
		}
		want = append(want, id)
	}

	r := h.must("GET", "/v1/poll?cursor=5&wait=0&epoch="+old, phone, nil, http.StatusConflict)
	var body errorBody
	r.json(t, &body)
	if body.Error != codeCursorAhead || body.Head == nil || *body.Head != 7 || body.Epoch == old || len(body.Epoch) != 16 {
		t.Fatalf("poll with the cursor and epoch before the restore: %s", r.body)
	}
	// An ack of the old epoch is refused the same way, and acknowledges
	// nothing.
	r = h.must("POST", "/v1/ack", phone, map[string]any{"cursor": 5, "epoch": old}, http.StatusConflict)
	if r.errCode(t) != codeCursorAhead {
		t.Fatalf("ack of the old epoch: %s", r.body)
	}

	// Resynchronise: no cursor, no epoch; then the answer's.
	var got []string
	p = h.poll(phone, "wait=0")
	for {
		if p.Epoch != body.Epoch {
			t.Fatalf("resync answer's epoch %q, want the 409's %q", p.Epoch, body.Epoch)
		}
		for _, e := range p.Envelopes {
			got = append(got, e.ID)
		}
		if len(p.Envelopes) == 0 {
			break
		}
		p = h.poll(phone, fmt.Sprintf("cursor=%d&epoch=%s&wait=0", p.Cursor, p.Epoch))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("after the resync the device received %v, want %v: every envelope the restored store holds", got, want)
	}
	if p.Cursor != 7 {
		t.Errorf("cursor after the resync = %d, want 7", p.Cursor)
	}
}

// fetchEverything is what the store holds for a device of household home.
func fetchEverything(t *testing.T, st store.Store, dev string) []store.Envelope {
	t.Helper()
	b, err := st.Fetch(context.Background(), store.FetchParams{Household: "home", Device: dev, Limit: 1000})
	if err != nil || b.More {
		t.Fatalf("fetch: %+v, %v", b, err)
	}
	return b.Envelopes
}

