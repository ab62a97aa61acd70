package hapg

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// What the package's external tests (hapg_test, which starts formations
// through hapgtest) look into.
var (
	Members = members
	Poll    = poll
)

func (f *Formation) Query(ctx context.Context, n *Node, db string, fn func(*pgx.Conn) error) error {
	return f.query(ctx, n, db, fn)
}

func (n *Node) Dir() string { return n.dir }
