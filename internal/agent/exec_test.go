package agent

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent/account"
	"loam.dev/loam/internal/testenv"
)

func sh(script string) []string { return []string{"sh", "-c", script} }

func TestExec(t *testing.T) {
	c := newTestAgent(t)
	root, err := account.Lookup(account.PasswdFile, account.GroupFile, "root")
	if err != nil {
		t.Fatal(err)
	}
	var seq strings.Builder
	for i := 1; i <= 100000; i++ {
		seq.WriteString(strconv.Itoa(i) + "\n")
	}
	bigStdin := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB

	tests := []struct {
		name           string
		req            api.ExecRequest
		stdin          string
		stdout, stderr string
		code           int
	}{
		{
			name:   "stdout and stderr apart",
			req:    api.ExecRequest{Cmd: sh("echo out; echo err >&2")},
			stdout: "out\n", stderr: "err\n",
		},
		{
			name: "exit code",
			req:  api.ExecRequest{Cmd: sh("exit 3")},
			code: 3,
		},
		{
			name: "killed by a signal is 128+N",
			req:  api.ExecRequest{Cmd: sh("kill -KILL $$")},
			code: 128 + 9,
		},
		{
			name:   "stdin then eof",
			req:    api.ExecRequest{Cmd: []string{"cat"}, Stdin: true},
			stdin:  "hello\nworld",
			stdout: "hello\nworld",
		},
		{
			name:   "large stdin",
			req:    api.ExecRequest{Cmd: []string{"wc", "-c"}, Stdin: true},
			stdin:  bigStdin,
			stdout: strconv.Itoa(len(bigStdin)) + "\n",
		},
		{
			name:   "no stdin reads as /dev/null",
			req:    api.ExecRequest{Cmd: sh("cat; readlink /proc/self/fd/0")},
			stdout: "/dev/null\n",
		},
		{
			name: "environment and dir",
			req: api.ExecRequest{
				Cmd: sh(`echo "$FOO|$PWD|$HOME|$USER|$LOGNAME|$SHELL|$LANG|$TERM|$PATH"`),
				Env: map[string]string{"FOO": "bar"},
				Dir: "/tmp",
			},
			stdout: "bar|/tmp|" + root.Home + "|root|root|" + root.Shell + "|C.UTF-8||" + account.DefaultPath + "\n",
		},
		{
			name:   "the request's env wins",
			req:    api.ExecRequest{Cmd: sh(`echo "$LANG|$HOME"`), Env: map[string]string{"LANG": "fr_FR.UTF-8", "HOME": "/x"}},
			stdout: "fr_FR.UTF-8|/x\n",
		},
		{
			name:   "home is the default dir",
			req:    api.ExecRequest{Cmd: []string{"pwd"}},
			stdout: root.Home + "\n",
		},
		{
			name:   "the request's PATH finds the command",
			req:    api.ExecRequest{Cmd: []string{"sh", "-c", "echo $PATH"}, Env: map[string]string{"PATH": "/bin"}},
			stdout: "/bin\n",
		},
		{
			name:   "all output comes before exit",
			req:    api.ExecRequest{Cmd: []string{"seq", "1", "100000"}},
			stdout: seq.String(),
		},
		{
			// An ignored SIGPIPE would be inherited across execve (the
			// shell could not even reset it); the agent handles SIGPIPE
			// instead, so children get the default: death.
			name: "SIGPIPE is not ignored in children",
			req:  api.ExecRequest{Cmd: sh("kill -PIPE $$; echo survived")},
			code: 128 + 13,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.User = "root"
			s := execute(t, c, tt.req, tt.stdin)
			if got := s.code(); got != tt.code {
				t.Errorf("exit code %d, want %d (stderr %q)", got, tt.code, s.stderr.String())
			}
			if got := s.stdout.String(); got != tt.stdout {
				t.Errorf("stdout %q, want %q", abbrev(got), abbrev(tt.stdout))
			}
			if got := s.stderr.String(); got != tt.stderr {
				t.Errorf("stderr %q, want %q", got, tt.stderr)
			}
		})
	}
}

func abbrev(s string) string {
	if len(s) > 200 {
		return s[:100] + "…" + s[len(s)-100:]
	}
	return s
}

// TestExecAsUser runs a command as a user of a passwd file of the test's
// own: the kernel needs no account for a uid, so nothing is created.
func TestExecAsUser(t *testing.T) {
	testenv.Root(t)
	dir := t.TempDir()
	h := NewHandler(Config{Token: testToken, Logger: testLogger()}).(*handler)
	h.passwdPath = writeFile(t, dir, "passwd", "someone:x:4242:4243::/no/such/home:/bin/sh\n")
	h.groupPath = writeFile(t, dir, "group", "main:x:4243:\nextra:x:4244:root,someone\nother:x:4245:root\n")
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := &Client{BaseURL: srv.URL, Token: testToken}

	s := execute(t, c, api.ExecRequest{User: "someone", Cmd: sh(`id -u; id -g; id -G; echo "$USER|$LOGNAME|$HOME"; pwd`)}, "")
	if s.code() != 0 {
		t.Fatalf("exit code %d, stderr %q", s.code(), s.stderr.String())
	}
	// Its own groups, not the agent's (root's); home does not exist, so /.
	want := "4242\n4243\n4243 4244\nsomeone|someone|/no/such/home\n/\n"
	if got := s.stdout.String(); got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
}

func TestExecRefused(t *testing.T) {
	c := newTestAgent(t)
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  api.ExecRequest
		code api.Code
		msg  string
	}{
		{"empty cmd", api.ExecRequest{User: "root"}, api.CodeInvalid, "cmd is empty"},
		{"unknown user", api.ExecRequest{User: "no-such-user-x", Cmd: []string{"true"}}, api.CodeInvalid, `user "no-such-user-x" does not exist`},
		{"command not in PATH", api.ExecRequest{User: "root", Cmd: []string{"no-such-command-x"}}, api.CodeNotFound, `exec: "no-such-command-x": executable file not found in $PATH`},
		{"request PATH is used", api.ExecRequest{User: "root", Cmd: []string{"true"}, Env: map[string]string{"PATH": "/nonexistent"}}, api.CodeNotFound, "not found in $PATH"},
		{"missing file", api.ExecRequest{User: "root", Cmd: []string{"/no/such/file"}}, api.CodeNotFound, "no such file or directory"},
		{"not executable", api.ExecRequest{User: "root", Cmd: []string{plain}}, api.CodeInvalid, "permission denied"},
		{"missing dir", api.ExecRequest{User: "root", Cmd: []string{"true"}, Dir: "/no/such/dir"}, api.CodeInvalid, "does not exist"},
		{"bad env", api.ExecRequest{User: "root", Cmd: []string{"true"}, Env: map[string]string{"A=B": "c"}}, api.CodeInvalid, "not a valid variable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := execute(t, c, tt.req, "")
			if s.err == nil {
				t.Fatalf("no error; exit code %v, stderr %q", s.exitCode, s.stderr.String())
			}
			if s.err.Code != tt.code || !strings.Contains(s.err.Message, tt.msg) {
				t.Errorf("error %v, want code %s with %q", s.err, tt.code, tt.msg)
			}
		})
	}
}

func TestExecSignal(t *testing.T) {
	c := newTestAgent(t)
	tests := []struct {
		signal string
		code   int
		// group: the shell's background child shows whether the signal
		// went to the whole process group. Not for INT: a shell without
		// job control starts background children with SIGINT ignored.
		group bool
	}{
		{"TERM", 128 + 15, true},
		{"INT", 128 + 2, false},
		{"KILL", 128 + 9, true},
		{"SIGHUP", 128 + 1, true},
		{"usr1", 128 + 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.signal, func(t *testing.T) {
			s := startExec(t, c, api.ExecRequest{User: "root", Cmd: sh("sleep 30 & echo $!; wait")})
			child := s.readPID()
			waitExec(t, child, "sleep")
			s.sendControl(api.ExecControl{Type: api.ExecSignal, Signal: tt.signal})
			s.wait()
			if got := s.code(); got != tt.code {
				t.Errorf("exit code %d, want %d", got, tt.code)
			}
			if tt.group {
				waitGone(t, child, 5*time.Second)
			}
		})
	}
}

// TestExecSignalPastFullStdin checks that control messages still get
// through while the process does not read its stdin.
func TestExecSignalPastFullStdin(t *testing.T) {
	c := newTestAgent(t)
	s := startExec(t, c, api.ExecRequest{User: "root", Cmd: []string{"sleep", "30"}, Stdin: true})
	s.waitStarted()
	killLater(t, s.pid)
	// More than the pipe holds (64 KiB), less than the pipe and the
	// agent's queue hold together.
	s.sendStdin(strings.Repeat("x", 256<<10))
	s.sendControl(api.ExecControl{Type: api.ExecSignal, Signal: "TERM"})
	s.wait()
	if got := s.code(); got != 128+15 {
		t.Errorf("exit code %d, want %d", got, 128+15)
	}
}

func TestExecTTY(t *testing.T) {
	c := newTestAgent(t)
	tests := []struct {
		name       string
		req        api.ExecRequest
		stdin      string
		wantStdout *regexp.Regexp
		code       int
	}{
		{"tty", api.ExecRequest{Cmd: []string{"tty"}}, "", regexp.MustCompile(`^/dev/pts/\d+\r\n$`), 0},
		{"size", api.ExecRequest{Cmd: []string{"stty", "size"}, Rows: 40, Cols: 100}, "", regexp.MustCompile(`^40 100\r\n$`), 0},
		{"default size", api.ExecRequest{Cmd: []string{"stty", "size"}}, "", regexp.MustCompile(`^24 80\r\n$`), 0},
		{"stderr on the terminal", api.ExecRequest{Cmd: sh("echo err >&2")}, "", regexp.MustCompile(`^err\r\n$`), 0},
		{"TERM", api.ExecRequest{Cmd: sh("echo $TERM")}, "", regexp.MustCompile(`^xterm-256color\r\n$`), 0},
		{"exit code", api.ExecRequest{Cmd: sh("exit 5")}, "", regexp.MustCompile(`^$`), 5},
		{"eof is ^D", api.ExecRequest{Cmd: []string{"cat"}, Stdin: true}, "hi\n", regexp.MustCompile(`^hi\r\nhi\r\n`), 0},
		// ^C reaches the command only if the terminal is its controlling
		// terminal and its group is the foreground one.
		{"^C interrupts", api.ExecRequest{Cmd: sh("echo ready; exec sleep 30")}, "", regexp.MustCompile(`^ready\r\n(\^C)?$`), 128 + 2}, // gVisor does not echo ^C
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.User, tt.req.TTY = "root", true
			s := startExec(t, c, tt.req)
			s.waitStarted()
			killLater(t, s.pid)
			if tt.stdin != "" {
				s.sendStdin(tt.stdin)
				s.sendControl(api.ExecControl{Type: api.ExecEOF})
			}
			if strings.HasPrefix(tt.name, "^C") {
				s.readLine()
				// Type ^C once sleep runs: the shell's child, between
				// fork and exec, would catch SIGINT with the shell's
				// handler and lose it.
				waitExec(t, s.pid, "sleep")
				s.sendStdin("\x03")
			}
			s.wait()
			if got := s.code(); got != tt.code {
				t.Errorf("exit code %d, want %d", got, tt.code)
			}
			if got := s.stdout.String(); !tt.wantStdout.MatchString(got) {
				t.Errorf("stdout %q, want %v", got, tt.wantStdout)
			}
			if s.stderr.Len() != 0 {
				t.Errorf("stderr %q on a terminal", s.stderr.String())
			}
		})
	}
}

func TestExecTTYResize(t *testing.T) {
	c := newTestAgent(t)
	s := startExec(t, c, api.ExecRequest{User: "root", TTY: true, Stdin: true, Cmd: sh("stty size; read x; stty size")})
	if got := s.readLine(); got != "24 80" {
		t.Fatalf("first size %q, want 24 80", got)
	}
	s.sendControl(api.ExecControl{Type: api.ExecResize, Rows: 50, Cols: 132})
	s.sendStdin("\n")
	s.wait()
	if got := s.stdout.String(); !strings.HasSuffix(got, "50 132\r\n") {
		t.Errorf("stdout %q, want it to end with the new size", got)
	}
}

// TestExecHangup checks that closing the socket before the command exits
// hangs it up: SIGHUP to its whole process group.
func TestExecHangup(t *testing.T) {
	c := newTestAgent(t)
	for _, tty := range []bool{false, true} {
		t.Run("tty="+strconv.FormatBool(tty), func(t *testing.T) {
			mark := filepath.Join(t.TempDir(), "hup")
			s := startExec(t, c, api.ExecRequest{
				User: "root",
				TTY:  tty,
				Env:  map[string]string{"MARK": mark},
				Cmd:  sh(`trap 'echo hup > "$MARK"; exit 0' HUP; sleep 30 & echo $!; wait`),
			})
			child := s.readPID()
			killLater(t, s.pid)
			// Hang up only once the child runs sleep: a signal that
			// comes between fork and exec is caught by the shell's trap
			// handler, which the child still has, and lost.
			waitExec(t, child, "sleep")
			s.conn.Close(1000, "")
			waitGone(t, s.pid, 5*time.Second)
			waitGone(t, child, 5*time.Second)
			b, err := os.ReadFile(mark)
			if err != nil || string(b) != "hup\n" {
				t.Errorf("the shell did not see SIGHUP: %q, %v", b, err)
			}
		})
	}
}

// TestExecDetached checks that a process that detached itself keeps running
// after the command returns, as with docker exec.
func TestExecDetached(t *testing.T) {
	c := newTestAgent(t)
	for _, tty := range []bool{false, true} {
		t.Run("tty="+strconv.FormatBool(tty), func(t *testing.T) {
			// The command returns only once the child ignores SIGHUP:
			// on a terminal, the kernel hangs up the foreground group
			// when the shell exits, and a child still on its way to
			// nohup's SIG_IGN would die of it.
			mark := filepath.Join(t.TempDir(), "pid")
			s := startExec(t, c, api.ExecRequest{
				User: "root",
				TTY:  tty,
				Env:  map[string]string{"MARK": mark},
				Cmd: sh(`nohup sh -c 'echo $$ > "$MARK"; exec sleep 30' >/dev/null 2>&1 </dev/null &
					while [ ! -s "$MARK" ]; do sleep 0.01; done; cat "$MARK"`),
			})
			child := s.readPID()
			s.wait()
			if s.code() != 0 {
				t.Fatalf("exit code %d", s.code())
			}
			for range 30 {
				if state, _, ok := procStat(child); !ok || state == 'Z' {
					t.Fatalf("the detached sleep died after the command exited (state %c)", state)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestExecBackgroundHoldsOutput checks that a background child holding
// the output open does not keep the exec from ending.
func TestExecBackgroundHoldsOutput(t *testing.T) {
	c := newTestAgent(t)
	for _, tty := range []bool{false, true} {
		t.Run("tty="+strconv.FormatBool(tty), func(t *testing.T) {
			start := time.Now()
			s := startExec(t, c, api.ExecRequest{User: "root", TTY: tty, Cmd: sh("sleep 30 & echo $!")})
			s.readPID()
			s.wait()
			if s.code() != 0 {
				t.Errorf("exit code %d", s.code())
			}
			// A hang check, not a timing: the sleep holds the output for 30 s.
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("exec took %v: it waited for the background child", d)
			}
		})
	}
}

// TestExecReapsOrphans checks that an orphan (reparented to the agent, as to
// PID 1 in a sandbox) is reaped, not left a zombie.
func TestExecReapsOrphans(t *testing.T) {
	c := newTestAgent(t)
	s := execute(t, c, api.ExecRequest{User: "root", Cmd: sh("sleep 1 & echo $!; exec true")}, "")
	if s.code() != 0 {
		t.Fatalf("exit code %d", s.code())
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(s.stdout.String()))
	if err != nil {
		t.Fatalf("stdout %q: %v", s.stdout.String(), err)
	}
	killLater(t, orphan)
	if state, ppid, ok := procStat(orphan); ok && state != 'Z' && ppid != os.Getpid() {
		t.Fatalf("orphan %d has parent %d, want the agent (%d)", orphan, ppid, os.Getpid())
	}
	waitGone(t, orphan, 5*time.Second)
}

// TestExecBackpressure checks that a client that does not read stops the
// process (its pipe fills) instead of the agent buffering its output.
func TestExecBackpressure(t *testing.T) {
	c := newTestAgent(t)
	const size = 32 << 20 // far more than socket and pipe buffers hold
	s := startExec(t, c, api.ExecRequest{User: "root", Cmd: []string{"head", "-c", strconv.Itoa(size), "/dev/zero"}})
	s.waitStarted()
	killLater(t, s.pid)
	time.Sleep(500 * time.Millisecond)
	if state, _, ok := procStat(s.pid); !ok || state == 'Z' {
		t.Errorf("head finished while nobody read its output: the agent buffered %d bytes", size)
	}
	s.wait()
	if s.code() != 0 || s.stdout.Len() != size {
		t.Errorf("exit code %d, %d bytes of stdout, want 0 and %d", s.code(), s.stdout.Len(), size)
	}
}

// TestExecEnvFromSandbox checks which of the sandbox's environment reaches
// a process: not LOAM_AGENT_*, and not the variables that name the user.
func TestExecEnvFromSandbox(t *testing.T) {
	c := newTestAgent(t, "LOAM_AGENT_TOKEN=leak", "LOAM_AGENT_LISTEN=:1", "SANDBOX_VAR=yes", "HOME=/wrong", "PATH=/usr/bin:/bin")
	s := execute(t, c, api.ExecRequest{User: "root", Cmd: []string{"env"}}, "")
	env := strings.Split(s.stdout.String(), "\n")
	for _, want := range []string{"SANDBOX_VAR=yes", "PATH=/usr/bin:/bin", "HOME=/root"} {
		if !slices.Contains(env, want) {
			t.Errorf("env lacks %s: %q", want, env)
		}
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "LOAM_AGENT_") {
			t.Errorf("env has %s", kv)
		}
	}
}

// TestExecImageDefaults: an agent told a default user and directory (an
// image's USER and WORKDIR) runs requests that name neither as that user
// there; a request's own user and dir still win.
func TestExecImageDefaults(t *testing.T) {
	testenv.Root(t)
	dir := t.TempDir()
	// Not under t.TempDir, whose parent only root may enter.
	work, err := os.MkdirTemp("", "loam-workdir-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	h := NewHandler(Config{Token: testToken, Logger: testLogger(), User: "app", Dir: work}).(*handler)
	h.passwdPath = writeFile(t, dir, "passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:4242:4242::/no/such/home:/bin/sh\n")
	h.groupPath = writeFile(t, dir, "group", "app:x:4242:\n")
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := &Client{BaseURL: srv.URL, Token: testToken}

	for _, tc := range []struct {
		req  api.ExecRequest
		want string
	}{
		{api.ExecRequest{Cmd: sh(`id -u; pwd`)}, "4242\n" + work + "\n"},
		{api.ExecRequest{User: "root", Cmd: sh(`id -u; pwd`)}, "0\n" + work + "\n"},
		{api.ExecRequest{Dir: "/", Cmd: sh(`id -u; pwd`)}, "4242\n/\n"},
	} {
		s := execute(t, c, tc.req, "")
		if got := s.stdout.String(); s.code() != 0 || got != tc.want {
			t.Errorf("%+v: code %d, stdout %q, want %q", tc.req, s.code(), got, tc.want)
		}
	}
}

func TestSignalByName(t *testing.T) {
	tests := []struct {
		name string
		want int
	}{
		{"TERM", 15}, {"SIGTERM", 15}, {"term", 15}, {" INT ", 2}, {"KILL", 9},
		{"HUP", 1}, {"USR1", 10}, {"WINCH", 28}, {"9", 9},
		{"NOPE", 0}, {"", 0}, {"0", 0}, {"99", 0}, {"-1", 0},
	}
	for _, tt := range tests {
		if got := int(signalByName(tt.name)); got != tt.want {
			t.Errorf("signalByName(%q) = %d, want %d", tt.name, got, tt.want)
		}
	}
}
