package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Deaths: a sandbox whose container ends without the daemon ending it.
//
// A container lives as long as its sandbox process (gVisor's kernel, the
// "sentry"): when that is killed from outside, runs out of memory or
// crashes, every process of the sandbox is gone. The daemon holds a pidfd
// of each running sandbox's sandbox process, polled by Go's netpoller (no
// thread, no runsc call per sandbox while it runs), and learns of the end
// at once. The agent's connection is no sign: it drops and comes back
// around every checkpoint.
//
// The daemon's own stops (a checkpoint that stops the container, a sleep,
// a restore, a delete, a failed create) all run as an operation on the
// sandbox (begin). So a death is judged only once no operation runs on the
// sandbox: if the sandbox was started again meanwhile (a restore, a wake)
// its watch is another one; if it was put to sleep, deleted or marked
// broken, its record says so. Only a sandbox that is still running on the
// process that died is broken, and moved to state error with what
// happened.

// pidRuntime is a runtime that tells the host pid of a container's sandbox
// process, whose end is the container's end.
type pidRuntime interface {
	SandboxPid(ctx context.Context, id string) (int, error)
}

// oomRuntime is a runtime that counts the OOM kills in a container's
// cgroup, to tell a sandbox that ran out of memory from one killed from
// outside (both end with SIGKILL).
type oomRuntime interface {
	OOMKills(id string) (int64, error)
}

// deaths watches the sandbox processes of the Manager's running sandboxes
// and judges their ends. It is a unit of its own because it is the work
// the Manager does in the background: it owns the goroutines that wait on
// the pidfds (each watch's state is its sandbox's live object's), and
// close ends them and waits for them. Judging an end is an operation on
// the sandbox like any other, through the Manager.
type deaths struct {
	m *Manager
	// ctx is cancelled by close; mu orders goBG and close (closed).
	ctx    context.Context
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
	// waiting counts the watches waiting on a process (for tests).
	waiting atomic.Int32
}

// errClosed is the cause the watches are cancelled with.
var errClosed = errors.New("the sandbox manager is closing")

func newDeaths(m *Manager) *deaths {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &deaths{m: m, ctx: ctx, cancel: cancel}
}

// goBG runs f on a goroutine that close waits for; after close it runs
// nothing and returns false.
func (d *deaths) goBG(f func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.wg.Go(f)
	return true
}

// close ends every watch (closing its pidfd) and waits for the goroutines:
// a death that comes after is judged by the next daemon's Recover.
func (d *deaths) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.cancel(errClosed)
	d.m.mu.Lock()
	ls := make([]*live, 0, len(d.m.lives))
	for _, l := range d.m.lives {
		ls = append(ls, l)
	}
	d.m.mu.Unlock()
	for _, l := range ls {
		l.unwatch()
	}
	d.wg.Wait()
}

// deathWatch is the watch on one sandbox process.
type deathWatch struct {
	pid  int
	file *os.File // the pidfd
	// ooms is the cgroup's OOM kill count when the watch began.
	ooms int64
}

// watch starts watching the sandbox process of sandbox id, which has
// just been started, restored or taken back, replacing the watch on the
// process it ran before. A runtime that cannot tell the pid is not
// watched.
func (d *deaths) watch(ctx context.Context, id string) {
	m := d.m
	pr, ok := m.rt.(pidRuntime)
	if !ok {
		return
	}
	pid, err := pr.SandboxPid(ctx, id)
	if err != nil {
		m.log.Warn("not watching the sandbox process", "sandbox", id, "err", err)
		return
	}
	w := &deathWatch{pid: pid}
	if or, ok := m.rt.(oomRuntime); ok {
		w.ooms, _ = or.OOMKills(id)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil && !errors.Is(err, unix.ESRCH) {
		m.log.Warn("not watching the sandbox process", "sandbox", id, "pid", pid, "err", err)
		return
	}
	if err == nil {
		w.file = os.NewFile(uintptr(fd), "pidfd")
	}
	l := m.live(id)
	l.mu.Lock()
	old := l.death
	l.death = w
	l.mu.Unlock()
	if old != nil && old.file != nil {
		old.file.Close()
	}
	// Close ends the watch (closing its pidfd) and waits for it.
	if !d.goBG(func() { d.await(l, w) }) && w.file != nil {
		l.unwatch()
	}
}

// unwatch ends the watch on sandbox id, which is going away.
func (d *deaths) unwatch(id string) {
	if l := d.m.peek(id); l != nil {
		l.unwatch()
	}
}

// unwatch ends the watch on the sandbox's process, if it has one.
func (l *live) unwatch() {
	l.mu.Lock()
	w := l.death
	l.death = nil
	l.mu.Unlock()
	if w != nil && w.file != nil {
		w.file.Close()
	}
}

// watching reports whether w is the sandbox's watch.
func (l *live) watching(w *deathWatch) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.death == w
}

// await waits for w's process to end, then judges the end.
func (d *deaths) await(l *live, w *deathWatch) {
	d.waiting.Add(1)
	defer d.waiting.Add(-1)
	how := "ended"
	if w.file != nil {
		rc, err := w.file.SyscallConn()
		if err != nil {
			return
		}
		// A pidfd is readable once its process has exited. A Read that
		// fails is a watch closed (replaced or unwatched): nothing to judge.
		if err := rc.Read(func(fd uintptr) bool { return exited(int(fd)) }); err != nil {
			return
		}
		_ = rc.Control(func(fd uintptr) { how = exitHow(int(fd), w.pid) })
	}
	if d.ctx.Err() != nil {
		return // the Manager is closing: the next daemon judges it
	}
	d.judge(l, w, how)
}

// exited reports whether the process of pidfd fd has exited.
func exited(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, 0)
	return err == nil && n > 0
}

// exitHow says how process pid, the process of pidfd fd, ended, as its
// parent would see it: from the pidfd (Linux 6.15 and later keep it for
// holders of one once the parent has reaped it) or, while it is a zombie
// its parent has not reaped yet, from /proc (the pidfd is asked again
// after, so the pid was still its). "ended" when neither tells.
func exitHow(fd, pid int) string {
	for range 15 {
		info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_EXIT}
		err := unix.IoctlPidfdInfo(fd, &info)
		if err == nil && info.Mask&unix.PIDFD_INFO_EXIT != 0 {
			return describeExit(syscall.WaitStatus(info.Exit_code))
		}
		if err == nil {
			ws, ok := zombieStatus(pid)
			if ok && unix.IoctlPidfdInfo(fd, &unix.PidfdInfo{}) == nil {
				return describeExit(ws)
			}
		} else if !errors.Is(err, unix.ESRCH) {
			return "ended" // a kernel without PIDFD_GET_INFO
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "ended"
}

// zombieStatus reads the wait status of process pid from /proc while it is
// a zombie (proc(5): exit_code, field 52 of stat).
func zombieStatus(pid int) (syscall.WaitStatus, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:])) // from field 3, the state
	if len(f) < 50 || f[0] != "Z" {
		return 0, false
	}
	code, err := strconv.Atoi(f[49])
	if err != nil {
		return 0, false
	}
	return syscall.WaitStatus(code), true
}

// describeExit says how a process with wait status ws ended.
func describeExit(ws syscall.WaitStatus) string {
	switch {
	case ws.Signaled():
		return fmt.Sprintf("was killed by signal %d (%s)", int(ws.Signal()), unix.SignalName(ws.Signal()))
	case ws.Exited():
		return fmt.Sprintf("exited with status %d", ws.ExitStatus())
	}
	return "ended"
}

// judge runs once w's process has ended: when no operation of the
// daemon's is left that could have ended it on purpose and the sandbox
// still runs on it, the sandbox is broken. The watch stays in place until
// the judgement is done, for died.
func (d *deaths) judge(l *live, w *deathWatch, how string) {
	m := d.m
	ctx := context.Background()
	id := l.id
	defer func() {
		l.mu.Lock()
		if l.death == w {
			l.death = nil
		}
		l.mu.Unlock()
		if w.file != nil {
			w.file.Close()
		}
	}()
	for {
		// Judged without taking the sandbox first: most ends are the
		// daemon's own, and claiming the sandbox for them would turn
		// a user's next call away as busy.
		l.waitFree()
		if !l.watching(w) {
			return // started again (a restore, a wake), or deleted
		}
		sb, err := m.store.GetSandbox(ctx, "", id)
		if err != nil || sb.State != api.StateRunning {
			// Put to sleep, deleted, or broken for a reason of its own.
			return
		}
		end, err := m.begin(sb, opDeath)
		if err != nil {
			continue // an operation began meanwhile: judge after it
		}
		defer end()
		break
	}
	// Again under the operation: another may have run in between.
	current := l.watching(w)
	sb, err := m.store.GetSandbox(ctx, "", id)
	if !current || err != nil || sb.State != api.StateRunning {
		return
	}
	if sb.Pool != "" {
		m.log.Warn("warm pool: a member's sandbox process died; deleting it", "sandbox", id, "pool", sb.Pool, "how", how)
		m.pools.Lost(ctx, sb)
		return
	}
	if or, ok := m.rt.(oomRuntime); ok {
		if n, err := or.OOMKills(id); err == nil && n > w.ooms {
			how += " when it ran out of memory"
		}
	}
	d.brokeDown(ctx, sb, w.pid, how)
}

// died reports whether the sandbox's sandbox process has ended
// and the daemon has not yet judged it. A process that ended a moment ago
// may not show yet: it waits a little for it.
func (l *live) died() bool {
	l.mu.Lock()
	w := l.death
	l.mu.Unlock()
	if w == nil || w.file == nil {
		return false
	}
	rc, err := w.file.SyscallConn()
	if err != nil {
		return false
	}
	dead := false
	// Control keeps the pidfd open while it is polled.
	_ = rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(p, int(diedWait.Milliseconds()))
		dead = err == nil && n > 0
	})
	return dead
}

// diedWait bounds how long sandboxDied waits for a process to show as
// ended: its sockets close a moment before it does.
const diedWait = 300 * time.Millisecond

// brokeDown marks a running sandbox whose sandbox process (pid) ended
// (how) without the daemon ending it as broken (state error, saying why),
// ends its streams with that reason, and removes what is left of its
// container. Its disk, network and checkpoints stay, for a restore or a
// boot on its disk (Wake). The caller holds the sandbox's operation. The
// state changes last, so that a user who sees it finds the sandbox free
// for a restore or a wake.
func (d *deaths) brokeDown(ctx context.Context, sb *store.Sandbox, pid int, how string) {
	m := d.m
	reason := fmt.Sprintf("its sandbox process (pid %d) %s outside loam's control; restore a checkpoint, or wake it to boot it again on its disk", pid, how)
	m.log.Error("sandbox died", "sandbox", sb.ID, "name", sb.Name, "reason", reason)
	// Its agent's sockets lead nowhere now: without this they would hang.
	// A WebSocket close reason holds 123 bytes: the short form.
	m.closeStreams(sb.ID, "the sandbox died: its sandbox process "+how)
	if m.inside != nil {
		m.inside.Close(sb.ID)
	}
	if err := m.rt.Delete(ctx, sb.ID); err != nil {
		m.log.Warn("removing the container of a dead sandbox", "sandbox", sb.ID, "err", err)
	}
	if err := m.setState(ctx, sb, api.StateError, reason); err != nil {
		m.log.Error("marking a dead sandbox broken", "sandbox", sb.ID, "err", err)
	}
}
