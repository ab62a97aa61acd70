package relay

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/flamenet/relay/internal/wire"
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

// flippedStore is a real store whose epoch the test replaces, as a
// failover that lost commits would: History and every read name the
// replacement, and acks taken in it reach the store unchecked.
type flippedStore struct {
	store.Store
	mu    sync.Mutex
	epoch string // "": the store's own
}

func (f *flippedStore) flip(epoch string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.epoch = epoch
}

func (f *flippedStore) over(epoch string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.epoch != "" {
		return f.epoch
	}
	return epoch
}

func (f *flippedStore) History(ctx context.Context) (store.History, error) {
	h, err := f.Store.History(ctx)
	h.Epoch = f.over(h.Epoch)
	h.Instance += "/" + h.Epoch
	return h, err
}

func (f *flippedStore) State(ctx context.Context, household, device string) (store.DeviceState, error) {
	st, err := f.Store.State(ctx, household, device)
	st.Epoch = f.over(st.Epoch)
	return st, err
}

func (f *flippedStore) Fetch(ctx context.Context, p store.FetchParams) (store.Batch, error) {
	b, err := f.Store.Fetch(ctx, p)
	b.Epoch = f.over(b.Epoch)
	return b, err
}

func (f *flippedStore) Register(ctx context.Context, p store.RegisterParams) (store.Device, error) {
	d, err := f.Store.Register(ctx, p)
	d.Epoch = f.over(d.Epoch)
	return d, err
}

func (f *flippedStore) Ack(ctx context.Context, p store.AckParams) (store.Position, error) {
	p.Epoch = ""
	pos, err := f.Store.Ack(ctx, p)
	pos.Epoch = f.over(pos.Epoch)
	return pos, err
}

func (f *flippedStore) AckMany(ctx context.Context, acks []store.Ack) (store.AckManyResult, error) {
	for i := range acks {
		acks[i].Epoch = ""
	}
	return f.Store.AckMany(ctx, acks)
}

// TestEpochChangeWakesHeldPolls: a poll held with the store's epoch, in
// its handler or parked, answers 409 cursor_ahead with the new epoch soon
// after the store's epoch changes, not when its wait runs out; the change
// is counted. Without the watch waking every held poll, each waits out its
// 30 s.
func TestEpochChangeWakesHeldPolls(t *testing.T) {
	for _, park := range []bool{false, true} {
		t.Run(fmt.Sprintf("park=%v", park), func(t *testing.T) {
			db, err := sqlite.Open(context.Background(), sqlite.Config{Path: filepath.Join(t.TempDir(), "relay.db"), Synchronous: "NORMAL"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			f := &flippedStore{Store: db}
			h := newHarnessWith(t, Deps{Store: f, Hub: local.New(nil)}, func(c *Config) { c.ParkPolls = park })
			phone := h.register("home", "phone")
			p := h.poll(phone, "wait=0")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			answer := make(chan reply, 1)
			go func() {
				r, err := h.do(ctx, "GET", fmt.Sprintf("/v1/poll?cursor=%d&epoch=%s&wait=30", p.Cursor, p.Epoch), phone, nil)
				if err != nil {
					t.Errorf("held poll: %v", err)
				}
				answer <- r
			}()
			eventually(t, "the poll held", func() bool {
				held := h.srv.HeldPolls() == 1
				if park {
					held = held && h.srv.parking != nil && h.srv.parking.Parked.Load() == 1
				}
				return held
			})
			const next = "BBBBBBBBBBBBBBBB"
			f.flip(next)
			r := <-answer
			var body errorBody
			if r.status != http.StatusConflict {
				t.Fatalf("held poll after the epoch changed: %d %s, want 409", r.status, r.body)
			}
			r.json(t, &body)
			if body.Error != codeCursorAhead || body.Epoch != next {
				t.Fatalf("held poll after the epoch changed: %s", r.body)
			}
			if n := testutil.ToFloat64(h.srv.metrics.epochChanges); n != 1 {
				t.Errorf("fn_store_epoch_changes_total = %v, want 1", n)
			}
			if n := testutil.ToFloat64(h.srv.metrics.memoryDrops); n < 1 {
				t.Errorf("fn_store_memory_drops_total = %v, want at least 1", n)
			}
		})
	}
}

// TestEpochOnTheWire: the epoch in both codecs (register's and poll's
// answers, an ack's body, cursor_ahead's body), and a malformed epoch is a
// 400 naming the field, in the query and in the body.
func TestEpochOnTheWire(t *testing.T) {
	h := newHarness(t, nil)
	phone := h.token("home", "phone")
	mp := []string{"Accept", wire.ContentMsgpack, "Content-Type", wire.ContentMsgpack}

	var reg registerResponse
	r := h.must("POST", "/v1/register", phone, msgpackBody(t, map[string]any{}), http.StatusOK, mp...)
	if err := msgpack.Unmarshal(r.body, &reg); err != nil || len(reg.Epoch) != 16 {
		t.Fatalf("register in MessagePack: %+v, %v", reg, err)
	}
	cur, err := h.db.History(context.Background())
	if err != nil || reg.Epoch != cur.Epoch {
		t.Fatalf("register's epoch %q, the store's %+v, %v", reg.Epoch, cur, err)
	}
	h.send(phone, "1", []byte("x"), "phone")
	var p pollResponse
	r = h.must("GET", "/v1/poll?wait=0&epoch="+reg.Epoch, phone, nil, http.StatusOK, mp...)
	if err := msgpack.Unmarshal(r.body, &p); err != nil || p.Epoch != reg.Epoch || len(p.Envelopes) != 1 {
		t.Fatalf("poll in MessagePack: %+v, %v", p, err)
	}
	h.must("POST", "/v1/ack", phone, msgpackBody(t, map[string]any{"cursor": 1, "epoch": reg.Epoch}), http.StatusNoContent, mp...)
	r = h.must("POST", "/v1/ack", phone, msgpackBody(t, map[string]any{"cursor": 1, "epoch": "AAAAAAAAAAAAAAAA"}), http.StatusConflict, mp...)
	var body errorBody
	if err := msgpack.Unmarshal(r.body, &body); err != nil || body.Error != codeCursorAhead || body.Epoch != reg.Epoch || body.Head == nil || *body.Head != 1 {
		t.Fatalf("cursor_ahead in MessagePack: %+v, %v", body, err)
	}

	for _, bad := range []string{"", "has%20space", "dot.ted", "x" + strings.Repeat("y", 32), "%C3%A9"} {
		r := h.must("GET", "/v1/poll?wait=0&epoch="+bad, phone, nil, http.StatusBadRequest)
		if r.errCode(t) != codeBadRequest || !strings.Contains(string(r.body), "epoch") {
			t.Errorf("poll with epoch %q: %s", bad, r.body)
		}
	}
	for _, bad := range []any{"", "dot.ted", strings.Repeat("y", 33), 7, true} {
		r := h.must("POST", "/v1/ack", phone, map[string]any{"cursor": 1, "epoch": bad}, http.StatusBadRequest)
		if r.errCode(t) != codeBadRequest {
			t.Errorf("ack with epoch %v: %s", bad, r.body)
		}
		if _, isString := bad.(string); isString && !strings.Contains(string(r.body), "epoch") {
			t.Errorf("ack with epoch %v: %s does not name the field", bad, r.body)
		}
	}
	// Absent: not checked; an epoch of 32 characters is well formed (and
	// not the current one).
	h.must("POST", "/v1/ack", phone, `{"cursor":1}`, http.StatusNoContent)
	h.must("POST", "/v1/ack", phone, map[string]any{"cursor": 1, "epoch": strings.Repeat("y", 32)}, http.StatusConflict)
}
