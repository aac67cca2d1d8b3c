package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
)

// The tests run the agent's handler in the test process. NewHandler makes
// the test process a child subreaper with a wait4(-1) reaper, as the agent
// is in a sandbox, so the tests must start no process through os/exec:
// they read /proc instead.

const testToken = "test-token"

func testLogger() *slog.Logger {
	if os.Getenv("LOAM_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// newTestAgent serves an agent on httptest and returns a client for it.
// env is the sandbox's environment.
func newTestAgent(t *testing.T, env ...string) *Client {
	t.Helper()
	srv := httptest.NewServer(NewHandler(Config{Token: testToken, Env: env, Logger: testLogger()}))
	t.Cleanup(srv.Close)
	return &Client{BaseURL: srv.URL, Token: testToken}
}

// execSession is a test's side of an exec socket. It checks the protocol
// as it reads: "started" first, nothing after "exit" or "error".
type execSession struct {
	t    *testing.T
	ctx  context.Context
	conn *websocket.Conn

	pid            int
	session        string
	offsets        []api.ExecControl // the "offset" messages of an attach
	stdout, stderr bytes.Buffer
	exitCode       *int
	err            *api.Error
	closeStatus    websocket.StatusCode
	ended          bool
}

// startExec opens an exec socket and sends req.
func startExec(t *testing.T, c *Client, req api.ExecRequest) *execSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	conn, err := c.DialExec(ctx)
	if err != nil {
		t.Fatalf("DialExec: %v", err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatalf("writing the exec request: %v", err)
	}
	return &execSession{t: t, ctx: ctx, conn: conn}
}

// execute runs req to its end, sending stdin (then "eof") if it is not empty.
func execute(t *testing.T, c *Client, req api.ExecRequest, stdin string) *execSession {
	t.Helper()
	s := startExec(t, c, req)
	if stdin != "" {
		s.sendStdin(stdin)
		s.sendControl(api.ExecControl{Type: api.ExecEOF})
	}
	s.wait()
	return s
}

// next reads one message; false once the socket has ended.
func (s *execSession) next() bool {
	s.t.Helper()
	if s.ended {
		return false
	}
	typ, b, err := s.conn.Read(s.ctx)
	if err != nil {
		s.ended = true
		s.closeStatus = websocket.CloseStatus(err)
		if s.closeStatus == -1 {
			s.t.Errorf("exec socket ended without a close frame: %v", err)
		}
		return false
	}
	if s.exitCode != nil || s.err != nil {
		s.t.Errorf("message after exit or error: %q", b)
	}
	if typ == websocket.MessageBinary {
		switch {
		case s.pid == 0:
			s.t.Errorf("output before started: %q", b)
		case len(b) == 0:
			s.t.Errorf("empty binary message")
		case b[0] == api.StreamStdout:
			s.stdout.Write(b[1:])
		case b[0] == api.StreamStderr:
			s.stderr.Write(b[1:])
		default:
			s.t.Errorf("output on unknown stream %d", b[0])
		}
		return true
	}
	var c api.ExecControl
	if err := json.Unmarshal(b, &c); err != nil {
		s.t.Errorf("control message %q: %v", b, err)
		return true
	}
	switch c.Type {
	case api.ExecStarted:
		if s.pid != 0 || c.PID <= 0 {
			s.t.Errorf("started twice or without a pid: %q", b)
		}
		s.pid = c.PID
		s.session = c.Session
	case api.ExecOffset:
		s.offsets = append(s.offsets, c)
	case api.ExecExit:
		if s.pid == 0 || c.ExitCode == nil {
			s.t.Errorf("exit before started or without a code: %q", b)
		}
		s.exitCode = c.ExitCode
	case api.ExecError:
		if s.pid != 0 || c.Error == nil {
			s.t.Errorf("error after started or without an error: %q", b)
		}
		s.err = c.Error
	default:
		s.t.Errorf("unknown control message %q", b)
	}
	return true
}

// wait reads to the end and checks the socket closed normally.
func (s *execSession) wait() {
	s.t.Helper()
	for s.next() {
	}
	if s.closeStatus != websocket.StatusNormalClosure {
		s.t.Errorf("exec socket closed with %d, want %d", s.closeStatus, websocket.StatusNormalClosure)
	}
}

// waitStarted reads until "started".
func (s *execSession) waitStarted() {
	s.t.Helper()
	for s.pid == 0 && s.next() {
	}
	if s.pid == 0 {
		s.t.Fatalf("exec ended before started (error %v)", s.err)
	}
}

// readLine reads until stdout holds a full line and returns the first one,
// trimmed.
func (s *execSession) readLine() string {
	s.t.Helper()
	for !strings.Contains(s.stdout.String(), "\n") && s.next() {
	}
	line, _, ok := strings.Cut(s.stdout.String(), "\n")
	if !ok {
		s.t.Fatalf("no line on stdout: %q (stderr %q)", s.stdout.String(), s.stderr.String())
	}
	return strings.TrimSpace(line)
}

// readPID reads a line of stdout that holds a pid, and kills that process
// when the test ends.
func (s *execSession) readPID() int {
	s.t.Helper()
	line := s.readLine()
	pid, err := strconv.Atoi(line)
	if err != nil || pid <= 0 {
		s.t.Fatalf("want a pid on stdout, got %q", line)
	}
	killLater(s.t, pid)
	return pid
}

func (s *execSession) code() int {
	s.t.Helper()
	if s.exitCode == nil {
		s.t.Fatalf("no exit code (error %v, stdout %q, stderr %q)", s.err, s.stdout.String(), s.stderr.String())
	}
	return *s.exitCode
}

// sendStdin sends data in messages of at most 32 KiB.
func (s *execSession) sendStdin(data string) {
	s.t.Helper()
	for len(data) > 0 {
		n := min(len(data), 32<<10)
		msg := append([]byte{api.StreamStdin}, data[:n]...)
		if err := s.conn.Write(s.ctx, websocket.MessageBinary, msg); err != nil {
			s.t.Fatalf("sending stdin: %v", err)
		}
		data = data[n:]
	}
}

func (s *execSession) sendControl(c api.ExecControl) {
	s.t.Helper()
	b, _ := json.Marshal(c)
	if err := s.conn.Write(s.ctx, websocket.MessageText, b); err != nil {
		s.t.Fatalf("sending %s: %v", c.Type, err)
	}
}

// procStat reads a process's state letter and parent pid from /proc; ok is
// false once the process is gone (reaped).
func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid …; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 2 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(fields[1])
	return fields[0][0], ppid, true
}

// killLater kills pid when the test ends if it is still a child of the test
// process (so that a reused pid is never killed).
func killLater(t *testing.T, pid int) {
	t.Cleanup(func() {
		if _, ppid, ok := procStat(pid); ok && ppid == os.Getpid() {
			unix.Kill(pid, unix.SIGKILL)
		}
	})
}

// waitGone waits until pid is reaped; it fails the test after timeout,
// telling whether the process was left a zombie.
func waitGone(t *testing.T, pid int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		state, _, ok := procStat(pid)
		if !ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still there after %v, state %c", pid, timeout, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitExec waits until pid runs the program named comm.
func waitExec(t *testing.T, pid int, comm string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && strings.TrimSpace(string(b)) == comm {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d does not run %s: %q, %v", pid, comm, b, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
