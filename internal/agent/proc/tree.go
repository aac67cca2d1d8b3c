package proc

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// killWait bounds how long KillTree keeps killing a tree that keeps forking.
const killWait = 5 * time.Second

// KillTree kills p's whole process tree with SIGKILL: its process group
// (its terminal's session, with a tty), and every descendant of p, even one
// that made a group or session of its own. It stops them all first,
// finding the tree again until no new process shows up, so that none forks
// or is orphaned (and lost from the tree) meanwhile. It waits, at most
// killWait, for the tree to be gone and p reaped; log (a session's)
// hears of survivors.
func (r *Reaper) KillTree(p *Process, log *slog.Logger) {
	deadline := time.Now().Add(killWait)
	seen := map[int]bool{}
	for time.Now().Before(deadline) {
		grew := false
		for _, pid := range treeOf(p.PID(), seen) {
			if !seen[pid] {
				seen[pid] = true
				grew = true
				_ = unix.Kill(pid, syscall.SIGSTOP)
			}
		}
		if !grew {
			break
		}
	}
	_ = r.Signal(p, syscall.SIGKILL)
	for pid := range seen {
		_ = unix.Kill(pid, syscall.SIGKILL)
	}
	for time.Now().Before(deadline) {
		left := treeOf(p.PID(), nil)
		if len(left) == 0 && p.Reaped() {
			return
		}
		for _, pid := range left {
			_ = unix.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(5 * time.Millisecond)
	}
	log.Warn("session: processes survived the kill", "pids", treeOf(p.PID(), nil))
}

// treeOf lists the live processes of root's tree, from /proc: root, those
// in root's process group or session, those in also, and the descendants of
// any of them.
func treeOf(root int, also map[int]bool) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	type stat struct{ ppid, pgrp, sid int }
	procs := map[int]stat{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session …; comm may hold anything.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 4 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		sid, _ := strconv.Atoi(f[3])
		procs[pid] = stat{ppid, pgrp, sid}
	}
	in := map[int]bool{}
	for pid, st := range procs {
		if pid == root || also[pid] || st.pgrp == root || st.sid == root {
			in[pid] = true
		}
	}
	for grew := true; grew; {
		grew = false
		for pid, st := range procs {
			if !in[pid] && (in[st.ppid] || st.ppid == root) {
				in[pid] = true
				grew = true
			}
		}
	}
	delete(in, os.Getpid())
	out := make([]int, 0, len(in))
	for pid := range in {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}
