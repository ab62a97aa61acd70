package postgres

import (
	"errors"
	"testing"
	"time"

	"github.com/flamenet/relay/store"
)

// TestStaleRegisterWaitsForRemoval holds a removal open, as DeleteDevice
// makes it (the name's lock, the device's row deleted, the removal
// recorded), while a registration with a credential issued before it
// starts: once the removal commits, the registration must be refused and
// the device stay removed. In READ COMMITTED the registration's statement
// would otherwise judge the removal from a snapshot taken before it
// committed, then insert once the deleted row's lock is free.
//
// Broken on purpose once (Register without sqlLockName), this test failed:
// the registration succeeded and the removed device was listed again.
func TestStaleRegisterWaitsForRemoval(t *testing.T) {
	db := openDB(t, 4)
	register(t, db, "home", "a")
	ctx := testCtx(t)
	removed := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

	conn := schemaConn(t, db)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rollback(ctx, tx)
	for _, q := range []string{sqlLockName, sqlDeleteDevice} {
		if _, err := tx.Exec(ctx, q, "home", "a"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec(ctx, sqlRecordRemoval, "home", "a", removed); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	go func() {
		_, err := db.Register(ctx, store.RegisterParams{Household: "home", Device: "a", Now: removed.Add(time.Second), IssuedAt: removed.Add(-time.Second)})
		done <- err
	}()
	blockedBy(t, db, conn.PgConn().PID())
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, store.ErrRemoved) {
		t.Errorf("stale Register across the removal's commit = %v, want ErrRemoved", err)
	}
	if ds, err := db.Devices(ctx, store.ListParams{Household: "home"}); err != nil || len(ds) != 0 {
		t.Errorf("after the removal the directory holds %+v, %v; want nothing", ds, err)
	}
}

// TestRemovalTakesNameLock: DeleteDevice waits for a registration that
// holds the name (sqlLockName), so that the registration's check and
// insert are never split by a removal. Broken on purpose once (DeleteDevice
// without the lock), this test failed: nobody waited for the held lock.
func TestRemovalTakesNameLock(t *testing.T) {
	db := openDB(t, 4)
	register(t, db, "home", "a")
	ctx := testCtx(t)

	conn := schemaConn(t, db)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rollback(ctx, tx)
	if _, err := tx.Exec(ctx, sqlLockName, "home", "a"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- db.DeleteDevice(ctx, "home", "a", time.Now()) }()
	blockedBy(t, db, conn.PgConn().PID())
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("DeleteDevice after the lock was released: %v", err)
	}
}
