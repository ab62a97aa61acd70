// Command capacity renders the tables of docs/CAPACITY.md from the load
// tester's reports in docs/evidence, so that no figure on that page is
// typed by hand.
//
//	go run ./loadtest/capacity          # rewrite the generated section
//	go run ./loadtest/capacity -check   # exit 1 if it is out of date
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/flamenet/relay/loadtest/report"
)

// The generated section lies between these lines; everything outside them
// is prose and stays as written.
const (
	beginMarker = "<!-- BEGIN GENERATED from docs/evidence by `go run ./loadtest/capacity`; do not edit -->"
	endMarker   = "<!-- END GENERATED -->"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "capacity:", err)
		}
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("capacity", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root, _ := moduleRoot(".")
	evidence := fs.String("evidence", filepath.Join(root, "docs", "evidence"), "directory of JSON reports")
	doc := fs.String("doc", filepath.Join(root, "docs", "CAPACITY.md"), "page whose generated section to write")
	check := fs.Bool("check", false, "only check that the page matches the reports")
	if err := fs.Parse(args); err != nil {
		return err
	}
	reports, err := load(*evidence)
	if err != nil {
		return err
	}
	sit, err := loadSitting(sittingDir(*evidence))
	if err != nil {
		return err
	}
	if sit.fanout, err = loadFanout(fanoutDir(*evidence)); err != nil {
		return err
	}
	old, err := os.ReadFile(*doc)
	if err != nil {
		return fmt.Errorf("read page: %w", err)
	}
	updated, err := splice(old, render(reports, sit))
	if err != nil {
		return fmt.Errorf("%s: %w", *doc, err)
	}
	if bytes.Equal(old, updated) {
		fmt.Fprintf(stdout, "%s matches %d reports\n", *doc, len(reports))
		return nil
	}
	if *check {
		return fmt.Errorf("%s does not match the reports in %s; run go run ./loadtest/capacity", *doc, *evidence)
	}
	if err := os.WriteFile(*doc, updated, 0o644); err != nil {
		return fmt.Errorf("write page: %w", err)
	}
	fmt.Fprintf(stdout, "%s rendered from %d reports\n", *doc, len(reports))
	return nil
}

// moduleRoot walks up from dir to the directory holding go.mod.
func moduleRoot(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return dir, err
	}
	for d := abs; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return dir, fmt.Errorf("no go.mod above %s", abs)
		}
	}
}

// entry is one report and the file it came from.
type entry struct {
	file string
	r    *report.Report
}

// load reads every *.json in dir, in a stable order for the tables.
func load(dir string) ([]entry, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []entry
	for _, p := range paths {
		r, err := report.Read(p)
		if err != nil {
			return nil, err
		}
		out = append(out, entry{file: filepath.Base(p), r: r})
	}
	slices.SortStableFunc(out, func(a, b entry) int {
		if c := storeRank(a.r.Store) - storeRank(b.r.Store); c != 0 {
			return c
		}
		if c := a.r.Replicas - b.r.Replicas; c != 0 {
			return c
		}
		if a.r.Config.Herd != b.r.Config.Herd {
			if a.r.Config.Herd {
				return 1
			}
			return -1
		}
		if c := a.r.Config.Pairs - b.r.Config.Pairs; c != 0 {
			return c
		}
		if a.r.Config.Rate != b.r.Config.Rate {
			if a.r.Config.Rate < b.r.Config.Rate {
				return -1
			}
			return 1
		}
		return strings.Compare(a.file, b.file)
	})
	return out, nil
}

func storeRank(s string) int {
	switch s {
	case "sqlite":
		return 0
	case "postgres":
		return 1
	default:
		return 2
	}
}

// splice replaces what lies between the markers in doc with section.
func splice(doc, section []byte) ([]byte, error) {
	begin := bytes.Index(doc, []byte(beginMarker))
	end := bytes.Index(doc, []byte(endMarker))
	if begin < 0 || end < 0 || end < begin {
		return nil, errors.New("generated section markers missing or out of order")
	}
	if bytes.Count(doc, []byte(beginMarker)) != 1 || bytes.Count(doc, []byte(endMarker)) != 1 {
		return nil, errors.New("generated section markers appear more than once")
	}
	var b bytes.Buffer
	b.Write(doc[:begin+len(beginMarker)])
	b.WriteString("\n\n")
	b.Write(section)
	b.WriteString("\n")
	b.Write(doc[end:])
	return b.Bytes(), nil
}
