package conformance

import (
	"path/filepath"
	"testing"

	"github.com/flamenet/relay/internal/servicetest"
)

// impl is one client implementation, driven through its command line
// (the send and listen commands of the client CLI contract).
type impl struct {
	name string
	// argv is the command before "send" or "listen". It may skip the test
	// when the implementation is not built (or fail it under
	// FN_TEST_REQUIRE_SERVICES=1).
	argv func(t *testing.T) []string
	// msgpack: the CLI takes -codec msgpack.
	msgpack bool
}

// impls are the implementations every scenario runs against.
var impls = []impl{
	{
		name:    "go",
		argv:    func(*testing.T) []string { return []string{relayBin} },
		msgpack: true,
	},
	{
		name: "typescript",
		argv: func(t *testing.T) []string {
			return []string{"node", filepath.Join(servicetest.TypeScriptClient(t), "dist", "cli.js")}
		},
	},
}
