package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// attach opens an attach socket to session id from the given offsets.
func attach(t *testing.T, c *Client, id string, stdout, stderr *int64) *execSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	conn, err := c.DialAttach(ctx, id, api.AttachParams{Offset: stdout, StderrOffset: stderr})
	if err != nil {
		t.Fatalf("DialAttach: %v", err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	return &execSession{t: t, ctx: ctx, conn: conn}
}

func ptr(n int64) *int64 { return &n }

func TestSessionDetachAndAttach(t *testing.T) {
	c := newTestAgent(t)
	ctx := context.Background()
	// Started on an exec socket that goes away at once: it runs on.
	s := startExec(t, c, api.ExecRequest{User: "root", Cmd: sh(`for i in 0 1 2 3 4; do echo $i; sleep 0.05; done; echo err >&2; exit 3`), Detachable: true})
	s.waitStarted()
	if !api.ValidSessionID(s.session) {
		t.Fatalf("started carries session %q, not a session id", s.session)
	}
	s.conn.Close(websocket.StatusNormalClosure, "")

	done, err := c.WaitSession(ctx, s.session)
	if err != nil {
		t.Fatal(err)
	}
	if done.State != api.SessionExited || done.ExitCode == nil || *done.ExitCode != 3 || !done.Detachable || done.PID != s.pid {
		t.Fatalf("waited session = %+v, want exited with 3", done)
	}

	tests := []struct {
		name             string
		stdout, stderr   *int64
		wantOut, wantErr string
	}{
		{"everything", nil, nil, "0\n1\n2\n3\n4\n", "err\n"},
		{"from an offset", ptr(4), ptr(0), "2\n3\n4\n", "err\n"},
		{"past stderr", ptr(8), ptr(4), "4\n", ""},
		{"past the end", ptr(100), nil, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := attach(t, c, s.session, tt.stdout, tt.stderr)
			a.wait()
			if a.code() != 3 || a.stdout.String() != tt.wantOut || a.stderr.String() != tt.wantErr {
				t.Fatalf("attach got %d, %q, %q; want 3, %q, %q", a.code(), a.stdout.String(), a.stderr.String(), tt.wantOut, tt.wantErr)
			}
		})
	}
}

func TestSessionBufferWraps(t *testing.T) {
	c := newTestAgent(t)
	ctx := context.Background()
	ss, err := c.CreateSession(ctx, api.ExecRequest{User: "root", Cmd: sh(`printf 0123456789abcdefghij`), BufferSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitSession(ctx, ss.ID); err != nil {
		t.Fatal(err)
	}
	a := attach(t, c, ss.ID, ptr(0), nil)
	a.wait()
	if a.stdout.String() != "cdefghij" {
		t.Fatalf("attach from 0 after a wrap got %q, want the last 8 bytes", a.stdout.String())
	}
	if len(a.offsets) != 1 || a.offsets[0].Offset != 12 || a.offsets[0].Dropped != 12 || a.offsets[0].Stream != api.StreamStdout {
		t.Fatalf("offset messages %+v, want one saying stdout starts at 12 with 12 dropped", a.offsets)
	}
}

func TestSessionStdinAndSignal(t *testing.T) {
	c := newTestAgent(t)
	ctx := context.Background()
	ss, err := c.CreateSession(ctx, api.ExecRequest{User: "root", Cmd: sh(`trap 'echo term; exit 7' TERM; read x; echo got $x; while :; do sleep 0.05; done`), Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	// Two clients at once: both see the output, either one's stdin counts.
	a := attach(t, c, ss.ID, nil, nil)
	b := attach(t, c, ss.ID, nil, nil)
	a.waitStarted()
	b.waitStarted()
	a.sendStdin("hello\n")
	if a.readLine() != "got hello" || b.readLine() != "got hello" {
		t.Fatalf("got %q and %q", a.stdout.String(), b.stdout.String())
	}
	if err := c.SignalSession(ctx, ss.ID, "TERM"); err != nil {
		t.Fatal(err)
	}
	a.wait()
	b.wait()
	if a.code() != 7 || !strings.Contains(a.stdout.String(), "term") {
		t.Fatalf("after TERM: %d %q", a.code(), a.stdout.String())
	}
	if err := c.SignalSession(ctx, ss.ID, "TERM"); !isAgentStatus(err, http.StatusConflict) {
		t.Fatalf("signalling an exited session: %v, want 409", err)
	}
	if err := c.SignalSession(ctx, "s-nosuchsession", "TERM"); !isAgentStatus(err, http.StatusNotFound) {
		t.Fatalf("signalling no session: %v, want 404", err)
	}
}

func isAgentStatus(err error, status int) bool {
	var ae *Error
	return errors.As(err, &ae) && ae.Status == status
}

func TestSessionDeleteKillsTree(t *testing.T) {
	c := newTestAgent(t)
	ctx := context.Background()
	// A child in the group, and one that left it (setsid): both die.
	ss, err := c.CreateSession(ctx, api.ExecRequest{User: "root", Cmd: sh(`sleep 1000 & echo $!; setsid sleep 1001 & echo $!; wait`)})
	if err != nil {
		t.Fatal(err)
	}
	a := attach(t, c, ss.ID, nil, nil)
	for strings.Count(a.stdout.String(), "\n") < 2 && a.next() {
	}
	var p1, p2 int
	if _, err := fmt.Sscan(a.stdout.String(), &p1, &p2); err != nil {
		t.Fatalf("want two pids, got %q", a.stdout.String())
	}
	killLater(t, p1)
	killLater(t, p2)
	waitExec(t, p2, "sleep")
	if err := c.DeleteSession(ctx, ss.ID); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{ss.PID, p1, p2} {
		waitGone(t, pid, 5*time.Second)
	}
	if _, err := c.GetSession(ctx, ss.ID); !isAgentStatus(err, http.StatusNotFound) {
		t.Fatalf("a deleted session: %v, want 404", err)
	}
}

func TestSessionNotDetachable(t *testing.T) {
	c := newTestAgent(t)
	ctx := context.Background()
	s := startExec(t, c, api.ExecRequest{User: "root", Cmd: sh(`echo hi; sleep 1000`)})
	s.waitStarted()
	if s.readLine() != "hi" {
		t.Fatal("no output")
	}
	got, err := c.GetSession(ctx, s.session)
	if err != nil || got.State != api.SessionRunning || got.Detachable {
		t.Fatalf("the exec's session: %+v, %v", got, err)
	}
	if _, err := c.DialAttach(ctx, s.session, api.AttachParams{}); !isAgentStatus(err, http.StatusConflict) {
		t.Fatalf("attaching to a non-detachable session: %v, want 409", err)
	}
	// Its socket closing hangs it up; it stays listed as exited.
	s.conn.Close(websocket.StatusNormalClosure, "")
	done, err := c.WaitSession(ctx, s.session)
	if err != nil || done.ExitCode == nil || *done.ExitCode != 128+1 {
		t.Fatalf("after hangup: %+v, %v; want exited by SIGHUP", done, err)
	}
	list, err := c.ListSessions(ctx)
	if err != nil || len(list) == 0 || list[len(list)-1].ID != s.session {
		t.Fatalf("list %+v, %v; want %s last", list, err, s.session)
	}
}

func TestSessionsPruned(t *testing.T) {
	c := newTestAgent(t)
	ctx := context.Background()
	var first string
	for i := range api.MaxExitedSessions + 3 {
		ss, err := c.CreateSession(ctx, api.ExecRequest{User: "root", Cmd: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = ss.ID
		}
		if _, err := c.WaitSession(ctx, ss.ID); err != nil {
			t.Fatal(err)
		}
	}
	list, err := c.ListSessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != api.MaxExitedSessions {
		t.Fatalf("%d sessions listed, want %d", len(list), api.MaxExitedSessions)
	}
	for _, s := range list {
		if s.ID == first {
			t.Fatalf("the oldest exited session %s is still listed", first)
		}
	}
}

// TestSessionNoFollow: follow=false sends what is buffered and ends, with
// "exit" only once the session has exited.
func TestSessionNoFollow(t *testing.T) {
	c := newTestAgent(t)
	ctx := context.Background()
	ss, err := c.CreateSession(ctx, api.ExecRequest{User: "root", Cmd: sh(`echo one; read x; echo two`), Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	var a *execSession
	for a == nil || a.stdout.String() != "one\n" {
		conn, err := c.DialAttach(ctx, ss.ID, api.AttachParams{NoFollow: true})
		if err != nil {
			t.Fatal(err)
		}
		a = &execSession{t: t, ctx: ctx, conn: conn}
		a.wait()
		if a.exitCode != nil {
			t.Fatalf("exit from a running session: %d", *a.exitCode)
		}
	}
	live := attach(t, c, ss.ID, nil, nil)
	live.sendStdin("\n")
	live.wait()
	conn, err := c.DialAttach(ctx, ss.ID, api.AttachParams{NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	a = &execSession{t: t, ctx: ctx, conn: conn}
	a.wait()
	if a.code() != 0 || a.stdout.String() != "one\ntwo\n" {
		t.Fatalf("logs of an exited session: %d %q", a.code(), a.stdout.String())
	}
}

// TestSessionTTY: a detachable session with a terminal takes input and
// resizes from whoever is attached, and its output is one stream.
func TestSessionTTY(t *testing.T) {
	c := newTestAgent(t)
	ctx := context.Background()
	ss, err := c.CreateSession(ctx, api.ExecRequest{User: "root", Cmd: sh(`read x; stty size; echo got $x`), TTY: true, Stdin: true, Rows: 10, Cols: 20})
	if err != nil {
		t.Fatal(err)
	}
	a := attach(t, c, ss.ID, nil, nil)
	a.waitStarted()
	a.sendControl(api.ExecControl{Type: api.ExecResize, Rows: 33, Cols: 44})
	a.sendStdin("hi\n")
	a.wait()
	if a.code() != 0 || !strings.Contains(a.stdout.String(), "33 44") || !strings.Contains(a.stdout.String(), "got hi") || a.stderr.Len() != 0 {
		t.Fatalf("tty session: %d %q %q", a.code(), a.stdout.String(), a.stderr.String())
	}
}
