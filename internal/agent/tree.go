package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// killWait bounds how long kill keeps killing a tree that keeps forking.
const killWait = 5 * time.Second

// kill kills the session's whole process tree with SIGKILL: its process
// group (its terminal's session, with a tty), and every descendant of its
// main process, even one that made a group or session of its own. It stops
// them all first, finding the tree again until no new process shows up, so
// that none forks or is orphaned (and lost from the tree) meanwhile.
func (ss *session) kill() {
	deadline := time.Now().Add(killWait)
	seen := map[int]bool{}
	for time.Now().Before(deadline) {
		grew := false
		for _, pid := range treeOf(ss.proc.PID(), seen) {
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
	_ = ss.reaper.Signal(ss.proc, syscall.SIGKILL)
	for pid := range seen {
		_ = unix.Kill(pid, syscall.SIGKILL)
	}
	for time.Now().Before(deadline) {
		left := treeOf(ss.proc.PID(), nil)
		if len(left) == 0 && ss.proc.Reaped() {
			return
		}
		for _, pid := range left {
			_ = unix.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ss.log.Warn("session: processes survived the kill", "pids", treeOf(ss.proc.PID(), nil))
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
