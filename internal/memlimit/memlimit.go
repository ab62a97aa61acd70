// Package memlimit finds the memory limit of the container (cgroup) a
// process runs in, so that the Go runtime can be given a memory target
// below it: with one, the garbage collector works harder as the limit
// nears, instead of letting the heap grow to twice what is live and the
// kernel end the process.
package memlimit

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/flamenet/relay/internal/procstat"
)

// unlimited: cgroup v1 reports no limit as a huge number.
const unlimited = 1 << 60

// Limit returns the memory limit in bytes of the cgroup this process is
// in, or 0 when there is none (or it cannot be read).
func Limit() int64 {
	cgroups, err := procstat.Cgroups(os.Getpid())
	if err != nil {
		return 0
	}
	return limit(cgroups, "/sys/fs/cgroup")
}

// limit reads the files of the process's cgroups under root: cgroup v2's
// memory.max, or v1's memory.limit_in_bytes. A limit set on the process's
// own group wins; else the hierarchy's root (a container whose cgroup
// namespace makes its group the root).
func limit(cgroups []procstat.Cgroup, root string) int64 {
	var candidates []string
	for _, c := range cgroups {
		switch {
		case c.HierarchyID == 0 && len(c.Controllers) == 0: // v2
			candidates = append(candidates,
				filepath.Join(root, c.Path, "memory.max"),
				filepath.Join(root, "unified", c.Path, "memory.max"),
				filepath.Join(root, "memory.max"))
		case slices.Contains(c.Controllers, "memory"): // v1
			candidates = append(candidates,
				filepath.Join(root, "memory", c.Path, "memory.limit_in_bytes"),
				filepath.Join(root, "memory", "memory.limit_in_bytes"))
		}
	}
	for _, c := range candidates {
		b, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= unlimited {
			continue
		}
		return n
	}
	return 0
}
