package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/user"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/server"
)

// execUser is who commands run as: the fake containers' agents run on the
// host as the test's user, and can run commands as no one else.
func execUser(t *testing.T) string {
	if os.Geteuid() == 0 {
		return "root"
	}
	u, err := user.Current()
	if err != nil {
		t.Skipf("no name for the test's user: %v", err)
	}
	return u.Username
}

// execClient is a client's side of an exec socket proxied by the Manager.
type execClient struct {
	t      *testing.T
	ctx    context.Context
	conn   *websocket.Conn
	stdout strings.Builder
	pid    int
	code   *int
}

// startExec serves Manager.Exec for ref and req on a test server, as the
// API server does after its checks, and dials it.
func startExec(t *testing.T, e *env, ref string, req api.ExecRequest) *execClient {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		st, err := e.guest().Exec(r.Context(), ref, req)
		if err != nil {
			c.Close(websocket.StatusPolicyViolation, err.Error())
			return
		}
		server.ProxyStream(r.Context(), c, st)
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	t.Cleanup(cancel)
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	return &execClient{t: t, ctx: ctx, conn: conn}
}

// next reads one message; it returns the close status once the socket ends.
func (c *execClient) next() (ended bool, status websocket.StatusCode) {
	c.t.Helper()
	typ, b, err := c.conn.Read(c.ctx)
	if err != nil {
		st := websocket.CloseStatus(err)
		if st == -1 {
			c.t.Fatalf("exec socket broke without a close: %v", err)
		}
		return true, st
	}
	if typ == websocket.MessageBinary {
		if len(b) > 0 && b[0] == api.StreamStdout {
			c.stdout.Write(b[1:])
		}
		return false, 0
	}
	var m api.ExecControl
	if err := json.Unmarshal(b, &m); err != nil {
		c.t.Fatalf("control message %q: %v", b, err)
	}
	switch m.Type {
	case api.ExecStarted:
		c.pid = m.PID
	case api.ExecExit:
		c.code = m.ExitCode
	case api.ExecError:
		c.t.Fatalf("exec error: %v", m.Error)
	}
	return false, 0
}

// wait reads to the end and returns the close status.
func (c *execClient) wait() websocket.StatusCode {
	c.t.Helper()
	for {
		if ended, st := c.next(); ended {
			return st
		}
	}
}

func (c *execClient) send(data string) {
	c.t.Helper()
	if err := c.conn.Write(c.ctx, websocket.MessageBinary, append([]byte{api.StreamStdin}, data...)); err != nil {
		c.t.Fatal(err)
	}
}

// readLine reads until stdout holds a line.
func (c *execClient) readLine() string {
	c.t.Helper()
	for !strings.Contains(c.stdout.String(), "\n") {
		if ended, st := c.next(); ended {
			c.t.Fatalf("socket ended (%d) before a line; stdout %q", st, c.stdout.String())
		}
	}
	line, rest, _ := strings.Cut(c.stdout.String(), "\n")
	c.stdout.Reset()
	c.stdout.WriteString(rest)
	return line
}

func TestExec(t *testing.T) {
	e := newEnv(t)
	e.create(api.CreateSandbox{Name: "shell", Env: map[string]string{"GREETING": "hi", "WHO": "sandbox"}})
	c := startExec(t, e, "shell", api.ExecRequest{
		Cmd:  []string{"sh", "-c", `echo "$GREETING $WHO $LOAM_SANDBOX $LOAM_AGENT_TOKEN"; exit 3`},
		Env:  map[string]string{"WHO": "request"},
		User: execUser(t),
	})
	if st := c.wait(); st != websocket.StatusNormalClosure {
		t.Errorf("closed with %d, want %d", st, websocket.StatusNormalClosure)
	}
	// The request's env over the sandbox's, the sandbox's name, and never
	// the agent's token.
	if got := c.stdout.String(); got != "hi request shell \n" {
		t.Errorf("stdout %q", got)
	}
	if c.pid == 0 || c.code == nil || *c.code != 3 {
		t.Errorf("pid %d, exit code %v", c.pid, c.code)
	}

	if _, _, err := e.guest().CheckExec(e.ctx, "nope"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("CheckExec of a missing sandbox: %v", err)
	}
}

// TestExecStreamsAndCheckpoints checks that a disk-only checkpoint leaves
// exec sockets alone and a memory checkpoint ends them with 1011.
func TestExecStreamsAndCheckpoints(t *testing.T) {
	e := newEnv(t)
	e.create(api.CreateSandbox{Name: "stream"})
	c := startExec(t, e, "stream", api.ExecRequest{Cmd: []string{"cat"}, Stdin: true, User: execUser(t)})
	c.send("one\n")
	if got := c.readLine(); got != "one" {
		t.Fatalf("echoed %q", got)
	}

	e.checkpoint("stream", false)
	c.send("two\n")
	if got := c.readLine(); got != "two" {
		t.Errorf("after a disk-only checkpoint: echoed %q", got)
	}

	// The client reads on, as clients do, so that the Manager's close
	// handshake is answered at once.
	ended := make(chan websocket.StatusCode, 1)
	go func() {
		for {
			if _, _, err := c.conn.Read(c.ctx); err != nil {
				ended <- websocket.CloseStatus(err)
				return
			}
		}
	}()
	e.checkpoint("stream", true)
	if st := <-ended; st != websocket.StatusInternalError {
		t.Errorf("after a memory checkpoint the socket closed with %d, want %d", st, websocket.StatusInternalError)
	}
	// The sandbox runs on and takes new commands.
	c2 := startExec(t, e, "stream", api.ExecRequest{Cmd: []string{"echo", "three"}, User: execUser(t)})
	if st := c2.wait(); st != websocket.StatusNormalClosure || c2.stdout.String() != "three\n" {
		t.Errorf("exec after the checkpoint: %d, %q", st, c2.stdout.String())
	}
}

// TestExecSpareSockets: after an exec the daemon opens the next one's
// socket to the agent ahead; execs that use it run as any other, and
// nothing that changes the sandbox's memory or its agent's token (a memory
// checkpoint, a restore, a delete) leaves one behind. A spare the agent no
// longer waits on is not an error: the exec opens another.
func TestExecSpareSockets(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "spare"})
	echo := func(word string) {
		t.Helper()
		c := startExec(t, e, "spare", api.ExecRequest{Cmd: []string{"echo", word}, User: execUser(t)})
		if st := c.wait(); st != websocket.StatusNormalClosure || c.stdout.String() != word+"\n" {
			t.Fatalf("exec of echo %s: %d, %q", word, st, c.stdout.String())
		}
	}
	waitSpare := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !e.m.HasSpare(sb.ID) {
			if time.Now().After(deadline) {
				t.Fatal("no spare exec socket after an exec")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	echo("one")
	waitSpare()
	echo("two") // on the spare
	waitSpare()

	e.checkpoint("spare", true)
	if e.m.HasSpare(sb.ID) {
		t.Error("a spare exec socket outlived a memory checkpoint")
	}
	echo("three") // the agent holds a new token now
	waitSpare()

	if _, err := e.cps.RestoreCheckpoint(e.ctx, "spare", "v1"); err != nil {
		t.Fatal(err)
	}
	if e.m.HasSpare(sb.ID) {
		t.Error("a spare exec socket outlived a restore")
	}
	echo("four")
	waitSpare()

	e.m.BreakSpares(sb.ID)
	echo("five")
	waitSpare()

	must(t, e.m.Delete(e.ctx, "spare"))
	if e.m.HasSpare(sb.ID) {
		t.Error("a spare exec socket outlived its sandbox")
	}
}
