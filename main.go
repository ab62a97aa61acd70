// Command relay stores end-to-end encrypted envelopes until each recipient
// device fetches them. relay help lists its subcommands (internal/cli);
// README.md says how to run it.
package main

import (
	"os"

	"github.com/flamenet/relay/internal/cli"
)

// version and revision are stamped at build time by scripts/release.sh
// (and the Dockerfile): go build -ldflags "-X main.version=v1.2.3
// -X main.revision=<commit>".
var version, revision string

func main() {
	cli.Version, cli.Revision = version, revision
	os.Exit(cli.Main(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}
