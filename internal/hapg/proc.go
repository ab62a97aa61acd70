package hapg

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/flamenet/relay/internal/procstat"
)

// A node's processes cannot be named by a process group or a session:
// pg_autoctl runs Postgres under a child of its own, and every Postgres
// backend is the leader of a session of its own. They are found two ways,
// which a test needs both of: as descendants of the pg_autoctl process
// this package started (while it lives), and by their working directory
// (Postgres runs in its data directory, pg_autoctl where it was started),
// which also finds what a killed test run left behind.

// proc is one process as /proc shows it.
type proc struct {
	pid, ppid int
	state     string
	cwd       string // "" when unreadable (a zombie, another user's)
}

// procs lists every process, with its working directory.
func procs() []proc {
	var out []proc
	for _, p := range procstat.List() {
		cwd, _ := procstat.Cwd(p.PID)
		out = append(out, proc{pid: p.PID, ppid: p.PPID, state: p.State, cwd: cwd})
	}
	return out
}

// members lists the live processes that are roots, their descendants, or
// run in a directory under dir.
func members(roots []int, dir string) []int {
	all := procs()
	in := map[int]bool{}
	for _, r := range roots {
		if r > 1 {
			in[r] = true
		}
	}
	for _, p := range all {
		if p.cwd == dir || strings.HasPrefix(p.cwd, dir+"/") {
			in[p.pid] = true
		}
	}
	// Descendants: repeat until nothing is added (a parent may be listed
	// after its child).
	for grown := true; grown; {
		grown = false
		for _, p := range all {
			if !in[p.pid] && in[p.ppid] {
				in[p.pid], grown = true, true
			}
		}
	}
	var out []int
	for _, p := range all {
		if in[p.pid] && p.state != "Z" && p.state != "X" {
			out = append(out, p.pid)
		}
	}
	return out
}

// killAll ends the processes of members(roots, dir) with SIGKILL, as a
// lost machine ends them: first every one is stopped, again until no new
// one appears (a stopped parent starts no child and reaps none, so no pid
// is reused meanwhile), then every one is killed, so that none sees
// another die and reacts (pg_autoctl restarts a Postgres that exits). It
// returns once none of them is alive, or with an error after limit.
func killAll(roots []int, dir string, limit time.Duration) ([]int, error) {
	stopped := map[int]bool{}
	for {
		added := false
		for _, pid := range members(roots, dir) {
			if !stopped[pid] {
				_ = syscall.Kill(pid, syscall.SIGSTOP) // one that has just exited needs nothing
				stopped[pid], added = true, true
			}
		}
		if !added {
			break
		}
	}
	killed := make([]int, 0, len(stopped))
	for pid := range stopped {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		killed = append(killed, pid)
	}
	slices.Sort(killed)
	return killed, awaitGone(killed, roots, limit)
}

// awaitGone waits until none of pids is alive, reaping those that are
// this process's children (orphans handed to it as a subreaper) except
// owned, whose exec.Cmd waits for them. Zombies of other parents count as
// gone: they hold no port and no memory.
func awaitGone(pids, owned []int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var left []int
		for _, pid := range pids {
			var ws syscall.WaitStatus
			if slices.Contains(owned, pid) {
				// its exec.Cmd reaps it
			} else if got, _ := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); got == pid {
				continue
			}
			if procstat.Alive(pid) {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still alive %s after SIGKILL", left, limit)
		}
		time.Sleep(10 * time.Millisecond) // bounded poll: a killed process's exit has no other signal here
	}
}

// becomeSubreaper makes this process the parent of its descendants'
// orphans, so that a killed node's processes are reaped here instead of
// lingering as zombies under an init that may not reap (a container's).
func becomeSubreaper() {
	const prSetChildSubreaper = 36
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// removeSharedMemory removes the System V shared memory segments that
// creators (killed postmasters) left: Postgres removes its own only when
// it shuts down cleanly, and one killed leaves a segment that outlives its
// data directory.
func removeSharedMemory(creators []int) error {
	segments, err := procstat.SharedMemory()
	if err != nil {
		return nil // no System V IPC to clean
	}
	var errs []error
	for _, s := range segments {
		if s.Attached != 0 || !slices.Contains(creators, s.Creator) {
			continue
		}
		const ipcRMID = 0
		if _, _, e := syscall.Syscall(syscall.SYS_SHMCTL, uintptr(s.ID), ipcRMID, 0); e != 0 {
			errs = append(errs, fmt.Errorf("remove shared memory segment %d: %w", s.ID, e))
		}
	}
	return errors.Join(errs...)
}
