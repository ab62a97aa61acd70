// Command elfstatic checks that release binaries are static Linux
// executables for the architecture their name ends with (-amd64, -arm64):
// no program interpreter and no shared libraries, so they run on any Linux
// and on distroless/static. scripts/release.sh runs it.
//
//	go run ./scripts/elfstatic dist/relay-v1.2.3-linux-amd64 ...
package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: elfstatic BINARY...")
		os.Exit(2)
	}
	failed := false
	for _, path := range os.Args[1:] {
		if err := check(path); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			failed = true
			continue
		}
		fmt.Printf("%s: static\n", path)
	}
	if failed {
		os.Exit(1)
	}
}

var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

func check(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC {
		return fmt.Errorf("ELF type %v, want a static executable (ET_EXEC)", f.Type)
	}
	for arch, m := range machines {
		if strings.HasSuffix(path, "-"+arch) && f.Machine != m {
			return fmt.Errorf("machine %v, want %v for %s", f.Machine, m, arch)
		}
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("has a program interpreter (dynamically linked; build with CGO_ENABLED=0)")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return err
	}
	if len(libs) > 0 {
		return fmt.Errorf("needs shared libraries %v", libs)
	}
	return nil
}
