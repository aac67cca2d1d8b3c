package test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// ptyAttach is a `loam attach` (or another loam command) run on a new
// pseudo-terminal, as a person runs it: the terminal is its controlling
// one, so Ctrl-C typed there is a SIGINT to it.
type ptyAttach struct {
	cmd  *exec.Cmd
	tty  *os.File
	mu   sync.Mutex
	out  bytes.Buffer
	done chan error
	// read is closed once all loam wrote to the terminal was read.
	read chan struct{}
	// mode is the terminal's mode before loam started.
	mode *unix.Termios
}

func startOnPty(t *testing.T, d *harness.Daemon, args ...string) *ptyAttach {
	t.Helper()
	p := &ptyAttach{cmd: exec.Command(harness.LoamBin, args...), done: make(chan error, 1), read: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "LOAM_API_URL="+d.URL, "LOAM_TOKEN="+d.Token, "TERM=dumb")
	// The terminal's mode is read before loam starts: read after, it may
	// be loam's raw mode already.
	tty, sub, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	p.tty = tty
	t.Cleanup(func() {
		if p.cmd.Process != nil {
			_ = p.cmd.Process.Kill()
		}
		tty.Close()
	})
	if err := pty.Setsize(tty, &pty.Winsize{Rows: 24, Cols: 80}); err != nil {
		t.Fatal(err)
	}
	if p.mode, err = unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS); err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = sub, sub, sub
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	err = p.cmd.Start()
	sub.Close() // loam has its own copy
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.read)
		buf := make([]byte, 4096)
		for {
			n, err := tty.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return // EIO once loam has exited and closed the terminal
			}
		}
	}()
	go func() { p.done <- p.cmd.Wait() }()
	return p
}

func (p *ptyAttach) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// wait waits for loam to exit and returns its exit status (-1 when a
// signal ended it).
func (p *ptyAttach) wait(t *testing.T) int {
	t.Helper()
	select {
	case err := <-p.done:
		select {
		case <-p.read:
		case <-time.After(10 * time.Second):
			t.Fatalf("loam's terminal still open 10 s after it exited")
		}
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(30 * time.Second):
		t.Fatalf("loam %s still running 30 s after being asked to leave; its terminal:\n%s", strings.Join(p.cmd.Args[1:], " "), p.output())
		return 0
	}
}

// TestAttachLeave: leaving an attach, on a real terminal, never ends a
// detachable session, with a terminal or without: Ctrl-P Ctrl-Q, Ctrl-C,
// SIGTERM, SIGHUP and SIGKILL to `loam attach` all leave it running, and
// the terminal's mode comes back. Only --sig-proxy passes Ctrl-C on.
func TestAttachLeave(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "att"}); err != nil {
		t.Fatal(err)
	}
	loop := `i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.2; done`
	sessions := map[bool]string{}
	for _, tty := range []bool{false, true} {
		args := []string{"exec", "-d", "att", "--", "sh", "-c", loop}
		if tty {
			args = []string{"exec", "-d", "-t", "att", "--", "sh", "-c", loop}
		}
		out, errOut, code := d.CLI("", args...)
		id := strings.TrimSpace(out)
		if code != 0 || !api.ValidSessionID(id) {
			t.Fatalf("exec -d: %d %q %q", code, out, errOut)
		}
		sessions[tty] = id
	}

	leaves := []struct {
		name  string
		leave func(p *ptyAttach) error
	}{
		{"ctrl-p ctrl-q", func(p *ptyAttach) error { _, err := p.tty.Write([]byte{0x10, 0x11}); return err }},
		{"ctrl-c", func(p *ptyAttach) error { _, err := p.tty.Write([]byte{0x03}); return err }},
		{"sigterm", func(p *ptyAttach) error { return p.cmd.Process.Signal(syscall.SIGTERM) }},
		{"sighup", func(p *ptyAttach) error { return p.cmd.Process.Signal(syscall.SIGHUP) }},
		{"sigkill", func(p *ptyAttach) error { return p.cmd.Process.Kill() }},
	}
	for _, tty := range []bool{false, true} {
		id := sessions[tty]
		for _, l := range leaves {
			if tty && l.name == "ctrl-c" {
				continue // a byte for the session's own terminal, as in docker
			}
			name := l.name + map[bool]string{false: " no tty", true: " tty"}[tty]
			t.Run(name, func(t *testing.T) {
				p := startOnPty(t, d, "attach", "att", id)
				// Output means the attach is live and the terminal set.
				waitFor(t, func() bool { return strings.Contains(p.output(), "tick") })
				if err := l.leave(p); err != nil {
					t.Fatal(err)
				}
				code := p.wait(t)
				if l.name == "sigkill" {
					if code != -1 {
						t.Fatalf("attach exited %d after SIGKILL", code)
					}
				} else {
					if code != 0 || !strings.Contains(p.output(), "detached from "+id) {
						t.Fatalf("attach left by %s: exit %d; terminal:\n%s", l.name, code, p.output())
					}
					mode, err := unix.IoctlGetTermios(int(p.tty.Fd()), unix.TCGETS)
					if err != nil {
						t.Fatal(err)
					}
					if *mode != *p.mode {
						t.Errorf("the terminal's mode after attach is %+v, not %+v as before", *mode, *p.mode)
					}
				}
				s, err := d.C.GetSession(ctx, "att", id)
				if err != nil || s.State != api.SessionRunning {
					t.Fatalf("after leaving by %s the session is %+v (%v), want running", l.name, s, err)
				}
				// And it runs on: a new line comes after the one seen last.
				before := strings.Count(p.output(), "tick")
				p2 := startOnPty(t, d, "logs", "-f", "att", id)
				waitFor(t, func() bool { return strings.Count(p2.output(), "tick") > before+1 })
				_ = p2.cmd.Process.Kill()
			})
		}
	}

	// Without a terminal at all (a script's loam attach), a SIGTERM
	// detaches too.
	t.Run("sigterm without a terminal", func(t *testing.T) {
		id := sessions[false]
		cmd := exec.Command(harness.LoamBin, "attach", "att", id)
		cmd.Env = append(os.Environ(), "LOAM_API_URL="+d.URL, "LOAM_TOKEN="+d.Token)
		var out, errOut harness.SyncBuffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return strings.Contains(out.String(), "tick") })
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil || !strings.Contains(errOut.String(), "detached from "+id) {
			t.Fatalf("attach without a terminal after SIGTERM: %v, stderr %q", err, errOut.String())
		}
		if s, err := d.C.GetSession(ctx, "att", id); err != nil || s.State != api.SessionRunning {
			t.Fatalf("after SIGTERM to attach the session is %+v (%v), want running", s, err)
		}
	})

	// --sig-proxy passes Ctrl-C on, by choice: the command ends with it.
	id := sessions[false]
	p := startOnPty(t, d, "attach", "--sig-proxy", "att", id)
	waitFor(t, func() bool { return strings.Contains(p.output(), "tick") })
	if _, err := p.tty.Write([]byte{0x03}); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 128+2 {
		t.Fatalf("attach --sig-proxy after Ctrl-C: exit %d, want 130; terminal:\n%s", code, p.output())
	}
	s, err := d.C.GetSession(ctx, "att", id)
	if err != nil || s.State != api.SessionExited || s.ExitCode == nil || *s.ExitCode != 128+2 {
		t.Fatalf("after Ctrl-C with --sig-proxy the session is %+v (%v), want exited by SIGINT", s, err)
	}
}
