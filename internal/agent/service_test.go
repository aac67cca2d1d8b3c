package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// newServiceAgent serves an agent that keeps service definitions in dir,
// as at an agent's start (see Run), and deletes every service it has when
// the test ends. Services to start wait for an identity up to identityWait.
func newServiceAgent(t *testing.T, dir string) *Client {
	c, _ := newServiceAgentWait(t, dir, 0)
	return c
}

func newServiceAgentWait(t *testing.T, dir string, identityWait time.Duration) (*Client, *handler) {
	t.Helper()
	h := newHandler(Config{Token: testToken, Logger: testLogger(), ServicesDir: dir})
	h.identityDir = t.TempDir()
	h.services.identityWait = identityWait
	h.services.load()
	srv := httptest.NewServer(h)
	c := &Client{BaseURL: srv.URL, Token: testToken}
	t.Cleanup(func() {
		ctx := context.Background()
		if l, err := c.ListServices(ctx); err == nil {
			for _, s := range l {
				_ = c.DeleteService(ctx, s.Name)
			}
		}
		srv.Close()
	})
	return c, h
}

// waitService polls service name until ok says yes, or fails the test.
func waitService(t *testing.T, c *Client, name string, what string, ok func(api.ServiceStatus) bool) api.ServiceStatus {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := c.GetService(context.Background(), name)
		if err != nil {
			t.Fatalf("GetService %s: %v", name, err)
		}
		if ok(*s) {
			return *s
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s: waited for %s; it is %+v", name, what, *s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFile waits until path exists, or fails the test.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServiceRestartPolicies(t *testing.T) {
	c := newServiceAgent(t, t.TempDir())
	ctx := context.Background()
	if _, _, err := c.PutService(ctx, api.Service{Name: "fails", User: "root", Cmd: sh("exit 1"), Restart: api.RestartOnFailure}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.PutService(ctx, api.Service{Name: "succeeds", User: "root", Cmd: sh("exit 0"), Restart: api.RestartOnFailure}); err != nil {
		t.Fatal(err)
	}
	s := waitService(t, c, "fails", "2 restarts", func(s api.ServiceStatus) bool { return s.Restarts >= 2 })
	if s.ExitCode == nil || *s.ExitCode != 1 {
		t.Errorf("fails: exit code %v, want 1", s.ExitCode)
	}
	s = waitService(t, c, "succeeds", "exited", func(s api.ServiceStatus) bool { return s.State == api.ServiceExited })
	if s.Restarts != 0 || s.ExitCode == nil || *s.ExitCode != 0 {
		t.Errorf("succeeds: %+v, want no restart and exit code 0", s)
	}
	// An exited service starts again when asked.
	if _, err := c.ServiceAction(ctx, "succeeds", api.ServiceStart); err != nil {
		t.Fatal(err)
	}
	waitService(t, c, "succeeds", "a new start", func(s api.ServiceStatus) bool {
		return s.State == api.ServiceExited && s.StartedAt != nil
	})
}

func TestServiceStopStartAndReload(t *testing.T) {
	dir := t.TempDir()
	c := newServiceAgent(t, dir)
	ctx := context.Background()
	for _, name := range []string{"up", "down"} {
		if _, _, err := c.PutService(ctx, api.Service{Name: name, User: "root", Cmd: sh("trap 'exit 0' TERM; while :; do sleep 0.05; done")}); err != nil {
			t.Fatal(err)
		}
	}
	first := waitService(t, c, "up", "running", func(s api.ServiceStatus) bool { return s.State == api.ServiceRunning })
	// Defining it again replaces it: a new process, not a new service.
	if _, created, err := c.PutService(ctx, api.Service{Name: "up", User: "root", Cmd: sh("trap 'exit 0' TERM; while :; do sleep 0.05; done")}); err != nil || created {
		t.Fatalf("PUT again: created %v, %v", created, err)
	}
	first = waitService(t, c, "up", "running", func(s api.ServiceStatus) bool { return s.State == api.ServiceRunning && s.PID != first.PID })
	s, err := c.ServiceAction(ctx, "down", api.ServiceStop)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != api.ServiceStopped || s.PID != 0 {
		t.Fatalf("after stop: %+v", s)
	}
	s, err = c.ServiceAction(ctx, "up", api.ServiceRestart)
	if err != nil {
		t.Fatal(err)
	}
	second := waitService(t, c, "up", "running again", func(s api.ServiceStatus) bool { return s.State == api.ServiceRunning && s.PID != 0 })
	if second.PID == first.PID {
		t.Errorf("restart kept pid %d", first.PID)
	}

	// A fresh agent on the same directory (a fresh boot) starts "up" and
	// leaves "down" stopped. Stop the first agent's "up" first, keeping
	// its definition as it was.
	var f serviceFile
	b, err := os.ReadFile(filepath.Join(dir, "up.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &f); err != nil || !f.Running {
		t.Fatalf("up.json: %s (%v)", b, err)
	}
	if _, err := c.ServiceAction(ctx, "up", api.ServiceStop); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "up.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	c2 := newServiceAgent(t, dir)
	waitService(t, c2, "up", "running after reload", func(s api.ServiceStatus) bool { return s.State == api.ServiceRunning })
	if s, err := c2.GetService(ctx, "down"); err != nil || s.State != api.ServiceStopped {
		t.Fatalf("down after reload: %+v, %v", s, err)
	}

	// Delete forgets it on disk too.
	if err := c2.DeleteService(ctx, "down"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "down.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("down.json after delete: %v", err)
	}
	var ae *Error
	if _, err := c2.GetService(ctx, "down"); !errors.As(err, &ae) || ae.Status != 404 {
		t.Errorf("GetService after delete: %v, want a 404", err)
	}
}

func TestServiceLogs(t *testing.T) {
	c := newServiceAgent(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := c.PutService(ctx, api.Service{Name: "talk", User: "root", Cmd: sh("echo out; echo err >&2"), Restart: api.RestartNever}); err != nil {
		t.Fatal(err)
	}
	waitService(t, c, "talk", "exited", func(s api.ServiceStatus) bool { return s.State == api.ServiceExited })
	conn, err := c.DialServiceLogs(ctx, "talk", api.AttachParams{NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	var stdout, stderr bytes.Buffer
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("reading logs: %v", err)
			}
			break
		}
		if typ == websocket.MessageBinary && len(b) > 0 {
			if b[0] == api.StreamStderr {
				stderr.Write(b[1:])
			} else {
				stdout.Write(b[1:])
			}
		}
	}
	if stdout.String() != "out\n" || stderr.String() != "err\n" {
		t.Errorf("logs: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
}

func TestServiceRefusals(t *testing.T) {
	c := newServiceAgent(t, t.TempDir())
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		def  api.Service
		want string
	}{
		{"bad name", api.Service{Name: "Web_1", User: "root", Cmd: sh("true")}, "name"},
		{"no cmd", api.Service{Name: "web", User: "root"}, "cmd"},
		{"bad restart", api.Service{Name: "web", User: "root", Cmd: sh("true"), Restart: "sometimes"}, "restart"},
		{"no user", api.Service{Name: "web", User: "nobody-here", Cmd: sh("true")}, "does not exist"},
		{"no program", api.Service{Name: "web", User: "root", Cmd: []string{"no-such-program-anywhere"}}, "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := c.PutService(ctx, tc.def)
			var ae *Error
			if !errors.As(err, &ae) || ae.Status/100 != 4 || !strings.Contains(ae.Message, tc.want) {
				t.Fatalf("PutService: %v, want a 4xx about %s", err, tc.want)
			}
		})
	}
	if l, err := c.ListServices(ctx); err != nil || len(l) != 0 {
		t.Errorf("services after refusals: %v, %v", l, err)
	}
}

func TestServiceBackoff(t *testing.T) {
	for _, tc := range []struct {
		name      string
		last, ran time.Duration
		want      time.Duration
	}{
		{"first restart", 0, time.Millisecond, serviceMinBackoff},
		{"doubles", serviceMinBackoff, time.Millisecond, 2 * serviceMinBackoff},
		{"doubles again", 4 * serviceMinBackoff, time.Second, 8 * serviceMinBackoff},
		{"capped", 20 * time.Second, time.Second, api.ServiceMaxBackoff},
		{"stays capped", api.ServiceMaxBackoff, time.Second, api.ServiceMaxBackoff},
		{"reset after a stable run", api.ServiceMaxBackoff, serviceStable, serviceMinBackoff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := serviceBackoff(tc.last, tc.ran); got != tc.want {
				t.Errorf("serviceBackoff(%v, %v) = %v, want %v", tc.last, tc.ran, got, tc.want)
			}
		})
	}
}

// TestServiceStopKills: a service that ignores SIGTERM is killed, its
// whole process group, once the grace has passed.
func TestServiceStopKills(t *testing.T) {
	c, h := newServiceAgentWait(t, t.TempDir(), 0)
	h.services.stopGrace = 200 * time.Millisecond
	ctx := context.Background()
	// The trap is inherited: sleep ignores TERM too. "running" means the
	// shell started, not that it has set its trap yet: the stop waits
	// for the file it writes after.
	trapped := filepath.Join(t.TempDir(), "trapped")
	if _, _, err := c.PutService(ctx, api.Service{Name: "stubborn", User: "root", Cmd: sh("trap '' TERM; touch " + trapped + "; sleep 1000 & wait")}); err != nil {
		t.Fatal(err)
	}
	waitService(t, c, "stubborn", "running", func(s api.ServiceStatus) bool { return s.State == api.ServiceRunning })
	waitFile(t, trapped)
	start := time.Now()
	s, err := c.ServiceAction(ctx, "stubborn", api.ServiceStop)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < h.services.stopGrace {
		t.Errorf("stop took %v, less than the grace", took)
	}
	if s.State != api.ServiceStopped || s.ExitCode == nil || *s.ExitCode != 128+9 {
		t.Errorf("after stop: %+v, want stopped, killed by SIGKILL", s)
	}
}

// TestServiceBootWaitsForIdentity: on a fresh boot, services start once the
// daemon has said which sandbox this is, with the sandbox's env.
func TestServiceBootWaitsForIdentity(t *testing.T) {
	dir := t.TempDir()
	b, err := json.Marshal(serviceFile{Running: true, Service: api.Service{
		Name: "envy", User: "root", Restart: api.RestartNever,
		Cmd: sh("echo $GREETING $LOAM_SANDBOX $OWN"), Env: map[string]string{"OWN": "mine", "LOAM_SANDBOX": "not-this"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "envy.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := newServiceAgentWait(t, dir, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	time.Sleep(100 * time.Millisecond)
	if s, err := c.GetService(ctx, "envy"); err != nil || s.State != api.ServiceStopped || s.StartedAt != nil {
		t.Fatalf("before the identity: %+v, %v; want not started", s, err)
	}
	if err := c.SetIdentity(ctx, Identity{SandboxID: "sb-000000000001", SandboxName: "box", APIURL: "http://127.0.0.1:1", Env: map[string]string{"GREETING": "hi", "OWN": "theirs"}}); err != nil {
		t.Fatal(err)
	}
	waitService(t, c, "envy", "exited", func(s api.ServiceStatus) bool { return s.State == api.ServiceExited })
	conn, err := c.DialServiceLogs(ctx, "envy", api.AttachParams{NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	var out bytes.Buffer
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			break
		}
		if typ == websocket.MessageBinary && len(b) > 0 && b[0] == api.StreamStdout {
			out.Write(b[1:])
		}
	}
	if out.String() != "hi box mine\n" {
		t.Errorf("the service's env gave %q, want %q", out.String(), "hi box mine\n")
	}
}
