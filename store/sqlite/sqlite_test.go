package sqlite_test

import (
	"path/filepath"
	"testing"

	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/store/sqlite"
	"github.com/flamenet/relay/store/storetest"
)

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		db, err := sqlite.Open(t.Context(), sqlite.Config{Path: filepath.Join(t.TempDir(), "relay.db")})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return db
	})
}
