package cli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Version and Revision are the binary's stamps, which its main package
// sets (release builds stamp main.version and main.revision). Unstamped,
// the toolchain's record is used.
var Version, Revision string

// versionCmd prints the version.
func versionCmd(args []string, stdout io.Writer) error {
	if err := noFlags("version", "Prints the version.", args, stdout); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "relay", readBuild())
	return nil
}

// build describes this binary: the stamped version, else the module's
// (go install module@version, or go build in a git checkout), else
// "devel"; and the commit when the toolchain recorded one.
type build struct {
	Version  string
	Revision string // full commit hash, "" when unknown
	Modified bool   // built from a tree with uncommitted changes
}

func readBuild() build {
	b := build{Version: Version, Revision: Revision}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Revision == "" {
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					b.Revision = s.Value
				case "vcs.modified":
					b.Modified = s.Value == "true"
				}
			}
		}
		if b.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.Version = bi.Main.Version
		}
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	return b
}

// String returns what `relay version` prints: the version, and the commit when
// it says more than the version does.
func (b build) String() string {
	s := b.Version
	switch {
	case b.Revision != "" && b.Modified:
		s += " (rev " + short(b.Revision) + ", modified)"
	case b.Revision != "":
		s += " (rev " + short(b.Revision) + ")"
	case b.Version == "devel":
		// go run records no commit: say so rather than print a bare word.
		s += " (no commit recorded: go run, or a build outside a git checkout)"
	}
	return s + " " + runtime.Version()
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}

// buildInfoGauge returns fn_build_info: always 1, the build in its labels, so
// dashboards can tell which version each relay runs.
func buildInfoGauge(b build) prometheus.Collector {
	revision := b.Revision
	if revision == "" {
		revision = "unknown"
	} else if b.Modified {
		revision += "-modified"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "fn_build_info",
		Help:        "Always 1; the labels say which build this relay is.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": revision, "go_version": runtime.Version()},
	})
	g.Set(1)
	return g
}
