package stack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/flamenet/relay/internal/procstat"
)

// How a relay's memory cap is enforced.
const (
	CapCgroupV2 = "cgroup v2"
	CapCgroupV1 = "cgroup v1"
	CapRlimitAS = "rlimit as"
)

// ASAllowance is added to the cap under RLIMIT_AS. That limit counts
// address space, not resident memory, and a Go process reserves far more
// than it touches (about 600 MiB for the page allocator's summaries alone,
// 8 MiB per thread): a relay under RLIMIT_AS equal to its cap does not
// start at all.
const ASAllowance = 2 << 30

// MemCap is a kernel-enforced memory limit for one relay slot: a cgroup of
// its own, or an address-space limit when no memory cgroup can be made.
// Restarts of the slot run inside the same cap.
type MemCap struct {
	limit  int64  // the cap asked for, bytes
	method string // CapCgroupV2, CapCgroupV1 or CapRlimitAS
	dir    string // the cgroup's directory; empty under RLIMIT_AS
	// warning says why the cap is weaker than asked, if it is.
	warning string
}

// newMemCap makes the cap for one relay. name must be unique on the
// machine. force is "" to take the best method available, or CapRlimitAS.
func newMemCap(limit int64, name, force string) (*MemCap, error) {
	if force == CapRlimitAS {
		return rlimitCap(limit, "asked for"), nil
	}
	var reasons []string
	for _, try := range []func(int64, string) (*MemCap, error){cgroupV2Cap, cgroupV1Cap} {
		m, err := try(limit, name)
		if err == nil {
			return m, nil
		}
		reasons = append(reasons, err.Error())
	}
	return rlimitCap(limit, strings.Join(reasons, "; ")), nil
}

func rlimitCap(limit int64, why string) *MemCap {
	return &MemCap{
		limit:  limit,
		method: CapRlimitAS,
		warning: fmt.Sprintf("no memory cgroup (%s): the relay runs under RLIMIT_AS of the cap plus %d GiB, which bounds address space, not resident memory, so only GOMEMLIMIT holds it near the cap",
			why, ASAllowance>>30),
	}
}

// cgroupV1Cap makes a child of this process's memory cgroup on a v1
// hierarchy and sets its limit.
func cgroupV1Cap(limit int64, name string) (*MemCap, error) {
	parent, err := ownCgroupDir(1)
	if err != nil {
		return nil, fmt.Errorf("cgroup v1: %w", err)
	}
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup v1: %w", err)
	}
	m := &MemCap{limit: limit, method: CapCgroupV1, dir: dir}
	if err := writeFile(filepath.Join(dir, "memory.limit_in_bytes"), limit); err != nil {
		_ = m.remove()
		return nil, fmt.Errorf("cgroup v1: %w", err)
	}
	// Swap counts too where the kernel accounts it; absent without swap
	// accounting, which is fine.
	_ = writeFile(filepath.Join(dir, "memory.memsw.limit_in_bytes"), limit)
	return m, nil
}

// cgroupV2Cap makes a child of this process's cgroup on the unified
// hierarchy, where the memory controller must be delegated to it.
func cgroupV2Cap(limit int64, name string) (*MemCap, error) {
	parent, err := ownCgroupDir(2)
	if err != nil {
		return nil, fmt.Errorf("cgroup v2: %w", err)
	}
	ctrl, err := os.ReadFile(filepath.Join(parent, "cgroup.controllers"))
	if err != nil || !slices.Contains(strings.Fields(string(ctrl)), "memory") {
		return nil, errors.New("cgroup v2: the memory controller is not available here")
	}
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup v2: %w", err)
	}
	m := &MemCap{limit: limit, method: CapCgroupV2, dir: dir}
	if _, err := os.Stat(filepath.Join(dir, "memory.max")); err != nil {
		// Children get the controller only when the parent hands it down,
		// which a cgroup holding processes may not do.
		_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+memory"), 0o644)
	}
	if err := writeFile(filepath.Join(dir, "memory.max"), limit); err != nil {
		_ = m.remove()
		return nil, fmt.Errorf("cgroup v2: memory not delegated to children: %w", err)
	}
	_ = os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0o644)
	return m, nil
}

// Method returns how the cap is enforced: [CapCgroupV2], [CapCgroupV1]
// or [CapRlimitAS].
func (m *MemCap) Method() string { return m.method }

// Warning returns why the cap is weaker than asked; "" when it is not.
func (m *MemCap) Warning() string { return m.warning }

// Dir returns the cap's cgroup directory; "" under RLIMIT_AS.
func (m *MemCap) Dir() string { return m.dir }

// wrap returns the command that runs argv inside the cap. A shell puts
// itself in the cgroup (or lowers its own limit) and then execs the relay,
// so the relay is capped from its first allocation and keeps the shell's
// pid.
func (m *MemCap) wrap(argv []string) []string {
	if m.method == CapRlimitAS {
		kib := strconv.FormatInt((m.limit+ASAllowance)>>10, 10)
		return append([]string{"/bin/sh", "-c", `ulimit -v "$1" && shift && exec "$@"`, "sh", kib}, argv...)
	}
	procs := filepath.Join(m.dir, "cgroup.procs")
	return append([]string{"/bin/sh", "-c", `echo $$ > "$1" && shift && exec "$@"`, "sh", procs}, argv...)
}

// applied reads back the limit the kernel enforces on pid: its cgroup's
// limit, or its address-space limit.
func (m *MemCap) applied(pid int) (int64, error) {
	if m.method == CapRlimitAS {
		return procstat.AddressSpaceLimit(pid)
	}
	dir, err := pidCgroupDir(pid, map[string]int{CapCgroupV1: 1, CapCgroupV2: 2}[m.method])
	if err != nil {
		return 0, err
	}
	if dir != m.dir {
		return 0, fmt.Errorf("pid %d is in cgroup %s, not %s", pid, dir, m.dir)
	}
	file := "memory.limit_in_bytes"
	if m.method == CapCgroupV2 {
		file = "memory.max"
	}
	return readInt(filepath.Join(dir, file))
}

// stats returns the cgroup's peak usage (0 when the kernel does not keep
// it, or under RLIMIT_AS) and how many processes the kernel killed in it
// for want of memory.
func (m *MemCap) stats() (peak int64, oomKills int, err error) {
	switch m.method {
	case CapCgroupV1:
		peak, _ = readInt(filepath.Join(m.dir, "memory.max_usage_in_bytes"))
		n, err := keyedInt(filepath.Join(m.dir, "memory.oom_control"), "oom_kill")
		return peak, int(n), err
	case CapCgroupV2:
		peak, _ = readInt(filepath.Join(m.dir, "memory.peak"))
		n, err := keyedInt(filepath.Join(m.dir, "memory.events"), "oom_kill")
		return peak, int(n), err
	}
	return 0, 0, nil
}

// remove deletes the cgroup; its processes must have exited.
func (m *MemCap) remove() error {
	if m.dir == "" {
		return nil
	}
	if err := os.Remove(m.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove cgroup %s: %w", m.dir, err)
	}
	return nil
}

// ownCgroupDir is where this process's cgroup is mounted: version 1 looks
// for the memory controller's hierarchy, version 2 for the unified one.
func ownCgroupDir(version int) (string, error) {
	return pidCgroupDir(os.Getpid(), version)
}

func pidCgroupDir(pid, version int) (string, error) {
	cgroups, err := procstat.Cgroups(pid)
	if err != nil {
		return "", err
	}
	i := slices.IndexFunc(cgroups, func(c procstat.Cgroup) bool {
		switch version {
		case 1:
			return slices.Contains(c.Controllers, "memory")
		case 2:
			return c.HierarchyID == 0 && len(c.Controllers) == 0
		}
		return false
	})
	if i < 0 {
		return "", fmt.Errorf("pid %d has no cgroup v%d memory hierarchy", pid, version)
	}
	path := cgroups[i].Path
	mount, root, err := cgroupMount(version)
	if err != nil {
		return "", err
	}
	rel, ok := strings.CutPrefix(path, root)
	if !ok {
		return "", fmt.Errorf("cgroup %s lies outside the mounted %s", path, root)
	}
	return filepath.Join(mount, rel), nil
}

// cgroupMount finds the hierarchy's mount point and the cgroup path
// mounted there.
func cgroupMount(version int) (mount, root string, err error) {
	mounts, err := procstat.Mounts()
	if err != nil {
		return "", "", err
	}
	for _, m := range mounts {
		_, memory := m.SuperOptions["memory"]
		if (version == 2 && m.FSType == "cgroup2") || (version == 1 && m.FSType == "cgroup" && memory) {
			return m.MountPoint, m.Root, nil
		}
	}
	return "", "", fmt.Errorf("no cgroup v%d memory hierarchy is mounted", version)
}

func writeFile(path string, n int64) error {
	return os.WriteFile(path, []byte(strconv.FormatInt(n, 10)), 0o644)
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// keyedInt reads "key N" from a file of such lines (memory.events,
// memory.oom_control).
func keyedInt(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == key {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", path, key)
}
