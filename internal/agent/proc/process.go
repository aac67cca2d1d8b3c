package proc

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Reaper is the one collector of exit statuses in this process. Inside a
// sandbox the agent is PID 1, so every orphan of the sandbox becomes its
// child and only a wait4(-1) collects them all; outside (tests, development)
// it makes the process a child subreaper so that it is the same code path.
//
// Because wait4(-1) takes any child, nothing else in a process that runs the
// agent may start children through os/exec or os.StartProcess: their Wait
// would find the child already reaped.
//
// The race between a child exiting and its pid being registered is closed by
// one lock: Start holds it across fork and registration, and reap holds it
// across wait4 and dispatch. A pid that reap finds unregistered is therefore
// an orphan nobody waits for, never a child of Start that is not registered
// yet, and no status is kept for later. Holding the lock across wait4 also
// means a pid is never reused between its reaping and its dispatch.
type Reaper struct {
	log *slog.Logger

	mu    sync.Mutex
	procs map[int]*Process // started and not yet reaped
}

// Process is a child started by the reaper.
type Process struct {
	pid  int
	done chan struct{} // closed once the process is reaped
	// status is the wait status; it is set before done is closed.
	status unix.WaitStatus
}

// PID is the process's id.
func (p *Process) PID() int { return p.pid }

// Done is closed once the process is reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Status is the process's wait status, once Done is closed.
func (p *Process) Status() unix.WaitStatus { return p.status }

// Reaped reports whether the process has been reaped.
func (p *Process) Reaped() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

var (
	reaperOnce sync.Once
	theReaper  *Reaper
)

// StartReaper starts the process's reaper the first time it is called and
// returns it. It also makes the process fit to own children:
//   - outside PID 1 it becomes a child subreaper, so orphans of its
//     children come to it as they come to PID 1 in a sandbox;
//   - it handles SIGPIPE, so that a write to a closed stdout or stderr
//     (init's stdio may be the pipes of a runsc command that has gone) fails
//     with EPIPE instead of killing the agent. It uses Notify, not Ignore,
//     because an ignored signal stays ignored across execve and every user
//     process would inherit it, while a handled one is reset to default.
func StartReaper(log *slog.Logger) *Reaper {
	reaperOnce.Do(func() {
		r := &Reaper{log: log, procs: make(map[int]*Process)}
		if os.Getpid() != 1 {
			if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
				log.Warn("cannot become a child subreaper; orphans will not be reaped", "err", err)
			}
		}
		signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
		// SIGCHLD signals coalesce; each one makes reap collect every
		// child that has exited, so none is missed.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGCHLD)
		go func() {
			r.reap() // children that exited before Notify
			for range sigs {
				r.reap()
			}
		}()
		theReaper = r
	})
	return theReaper
}

// reap collects every exited child and hands each status to its process.
func (r *Reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			// ECHILD (no children) or 0 (none exited yet).
			return
		}
		p, ok := r.procs[pid]
		if !ok {
			r.log.Debug("reaped an orphan", "pid", pid, "status", ExitCode(ws))
			continue
		}
		delete(r.procs, pid)
		p.status = ws
		close(p.done)
	}
}

// Start forks and executes argv0 with attr and registers the child.
func (r *Reaper) Start(argv0 string, argv []string, attr *syscall.ProcAttr) (*Process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// syscall.ForkExec, not os.StartProcess: os.Process would wait through a
	// pidfd of its own, which the reaper's wait4 would race.
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return nil, err
	}
	p := &Process{pid: pid, done: make(chan struct{})}
	r.procs[pid] = p
	return p, nil
}

// ErrExited is returned when signalling a process that has been reaped.
var ErrExited = errors.New("process has exited")

// Signal sends sig to p's process group, or to p alone if p has left the
// group it was started in. It never signals a reaped process: its pid (and
// so its group id) may belong to another process by then. The reaper's lock
// keeps p from being reaped while the signal is sent.
func (r *Reaper) Signal(p *Process, sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-p.done:
		return ErrExited
	default:
	}
	err := unix.Kill(-p.pid, sig)
	if errors.Is(err, unix.ESRCH) {
		err = unix.Kill(p.pid, sig)
	}
	if err != nil {
		return fmt.Errorf("sending %s to process %d: %w", unix.SignalName(sig), p.pid, err)
	}
	return nil
}

// ExitCode is the exit code of a wait status as a shell reports it: the
// exit status, or 128+N for a process killed by signal N.
func ExitCode(ws unix.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	default:
		return 255
	}
}
