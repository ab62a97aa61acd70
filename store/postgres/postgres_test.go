package postgres

import (
	"testing"

	"github.com/flamenet/relay/store"
	"github.com/flamenet/relay/store/storetest"
)

// TestConformance runs the shared suite, each test on a fresh schema with a
// pool of two; the suite closes the store before the schema is dropped.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		url, schema := newSchema(t)
		db, err := Open(testCtx(t), Config{URL: url, Schema: schema, MaxConns: 2, Logger: testLogger(t)})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return db
	})
}
