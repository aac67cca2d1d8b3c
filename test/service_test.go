package test

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// tickCmd writes a line a tenth of a second, for ever.
var tickCmd = []string{"sh", "-c", `while :; do echo tick; sleep 0.1; done`}

// waitService polls a service until ok says yes.
func waitService(t *testing.T, d *harness.Daemon, sb, name, what string, ok func(api.ServiceStatus) bool) api.ServiceStatus {
	t.Helper()
	ctx := harness.Ctx(t)
	var got api.ServiceStatus
	harness.Eventually(t, 60*time.Second, fmt.Sprintf("service %s of %s %s", name, sb, what), func() error {
		s, err := d.C.GetService(ctx, sb, name)
		if err != nil {
			t.Fatalf("service %s of %s: %v", name, sb, err)
		}
		got = *s
		if !ok(got) {
			return fmt.Errorf("it is %+v", got)
		}
		return nil
	})
	return got
}

func running(s api.ServiceStatus) bool { return s.State == api.ServiceRunning && s.PID > 0 }

// serviceLogs reads what a service's logs hold.
func serviceLogs(t *testing.T, d *harness.Daemon, sb, name string) (stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	if err := d.C.ServiceLogs(harness.Ctx(t), sb, name, client.ServiceLogsOptions{Stdout: &out, Stderr: &errb}); err != nil {
		t.Fatalf("logs of %s: %v", name, err)
	}
	return out.String(), errb.String()
}

// TestServices: a service given at create runs; one with restart
// on-failure that exits 1 is restarted and one that exits 0 is not; logs
// are readable; stop and start work; a definition the sandbox cannot run is
// a clear 400; the CLI lists them.
func TestServices(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "svc", Env: map[string]string{"GREETING": "hi"}, Services: []api.Service{
		{Name: "web", Cmd: tickCmd},
		{Name: "hello", Cmd: []string{"sh", "-c", "echo $GREETING $LOAM_SANDBOX $OWN"}, Env: map[string]string{"OWN": "mine"}, Restart: api.RestartNever},
	}}); err != nil {
		t.Fatal(err)
	}
	web := waitService(t, d, "svc", "web", "running", running)
	// A service's environment is as an exec's: the sandbox's env, its
	// own over it, the sandbox's name.
	waitService(t, d, "svc", "hello", "exited", func(s api.ServiceStatus) bool { return s.State == api.ServiceExited })
	if out, _ := serviceLogs(t, d, "svc", "hello"); out != "hi svc mine\n" {
		t.Errorf("hello said %q", out)
	}

	if _, err := d.C.PutService(ctx, "svc", api.Service{Name: "flaky", Cmd: []string{"sh", "-c", "echo try; echo oops >&2; exit 1"}, Restart: api.RestartOnFailure}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.PutService(ctx, "svc", api.Service{Name: "once", Cmd: []string{"sh", "-c", "echo done"}, Restart: api.RestartOnFailure}); err != nil {
		t.Fatal(err)
	}
	flaky := waitService(t, d, "svc", "flaky", "restarts", func(s api.ServiceStatus) bool { return s.Restarts >= 2 })
	if flaky.ExitCode == nil || *flaky.ExitCode != 1 {
		t.Errorf("flaky: %+v, want exit code 1", flaky)
	}
	once := waitService(t, d, "svc", "once", "exited", func(s api.ServiceStatus) bool { return s.State == api.ServiceExited })
	if once.Restarts != 0 || once.ExitCode == nil || *once.ExitCode != 0 {
		t.Errorf("once: %+v, want exited 0 with no restart", once)
	}
	if out, errs := serviceLogs(t, d, "svc", "flaky"); strings.Count(out, "try\n") < 2 || !strings.Contains(errs, "oops\n") {
		t.Errorf("logs of flaky: stdout %q, stderr %q", out, errs)
	}
	if out, _ := serviceLogs(t, d, "svc", "web"); !strings.HasPrefix(out, "tick\n") {
		t.Errorf("logs of web: %q", out)
	}

	// Stop waits for it to exit; start runs it again.
	s, err := d.C.StopService(ctx, "svc", "web")
	if err != nil || s.State != api.ServiceStopped || s.PID != 0 {
		t.Fatalf("stop: %+v, %v", s, err)
	}
	if _, err := d.C.StartService(ctx, "svc", "web"); err != nil {
		t.Fatal(err)
	}
	if again := waitService(t, d, "svc", "web", "running", running); again.PID == web.PID {
		t.Errorf("web started again with the same pid %d", web.PID)
	}

	// Mistakes are clear errors.
	for _, tc := range []struct {
		def  api.Service
		code api.Code
		msg  string
	}{
		{api.Service{Name: "bad", Cmd: []string{"true"}, User: "nobody-here"}, api.CodeInvalid, "nobody-here"},
		{api.Service{Name: "bad", Cmd: []string{"no-such-program"}}, api.CodeInvalid, "no-such-program"},
		{api.Service{Name: "bad", Cmd: []string{"true"}, Restart: "sometimes"}, api.CodeInvalid, "restart"},
	} {
		_, err := d.C.PutService(ctx, "svc", tc.def)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != tc.code || !strings.Contains(ae.Message, tc.msg) {
			t.Errorf("PUT %+v: %v, want %s about %s", tc.def, err, tc.code, tc.msg)
		}
	}
	if _, err := d.C.GetService(ctx, "svc", "bad"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a refused service: %v, want not found", err)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "svc-bad", Services: []api.Service{{Name: "x", Cmd: []string{"true"}, User: "nobody-here"}}}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("create with a service it cannot run: %v, want invalid", err)
	}
	if _, err := d.C.GetSandbox(ctx, "svc-bad"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a create refused for its services left %v", err)
	}

	out, errs, code := d.CLI("", "service", "ls", "svc")
	if code != 0 || !strings.Contains(out, "web") || !strings.Contains(out, "flaky") {
		t.Errorf("loam service ls: %d %q %q", code, out, errs)
	}
	if _, errs, code := d.CLI("", "service", "add", "svc", "echoer", "--restart", "never", "-e", "WORD=hi", "--", "sh", "-c", "echo $WORD"); code != 0 {
		t.Fatalf("loam service add: %d %q", code, errs)
	}
	waitService(t, d, "svc", "echoer", "exited", func(s api.ServiceStatus) bool { return s.State == api.ServiceExited })
	if out, errs, code := d.CLI("", "service", "logs", "svc", "echoer"); code != 0 || out != "hi\n" {
		t.Errorf("loam service logs: %d %q %q", code, out, errs)
	}
	for _, action := range []string{"stop", "start", "restart"} {
		if _, errs, code := d.CLI("", "service", action, "svc", "web"); code != 0 {
			t.Errorf("loam service %s: %d %q", action, code, errs)
		}
	}
	waitService(t, d, "svc", "web", "running", running)
	if _, errs, code := d.CLI("", "service", "rm", "-y", "svc", "once"); code != 0 {
		t.Errorf("loam service rm: %d %q", code, errs)
	}
	if _, err := d.C.GetService(ctx, "svc", "once"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("after rm: %v, want not found", err)
	}
}

// TestServicesAcrossCheckpoints: a memory checkpoint leaves a service
// running (same pid), and a fork of it has it running; a disk-only fork and
// a disk-only restore
// boot fresh and start again what was running when the checkpoint was
// taken (a fresh start), even if it was stopped by hand since, and leaves
// stopped what was stopped.
func TestServicesAcrossCheckpoints(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "svcp"}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"web", "idle"} {
		if _, err := d.C.PutService(ctx, "svcp", api.Service{Name: name, Cmd: tickCmd}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.C.PutService(ctx, "svcp", api.Service{Name: "who", Cmd: []string{"sh", "-c", "echo $LOAM_SANDBOX"}, Restart: api.RestartNever}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.StopService(ctx, "svcp", "idle"); err != nil {
		t.Fatal(err)
	}
	web := waitService(t, d, "svcp", "web", "running", running)

	// Following its logs across a memory checkpoint ends with an
	// interruption, to be read again from the offsets reached.
	// web ticks every 100 ms: its first line through the socket says the
	// following has begun, before the checkpoint is taken.
	got := &firstWrite{started: make(chan struct{})}
	followed := make(chan error, 1)
	go func() {
		followed <- d.C.ServiceLogs(ctx, "svcp", "web", client.ServiceLogsOptions{Stdout: got, Stderr: got, Follow: true})
	}()
	select {
	case <-got.started:
	case err := <-followed:
		t.Fatalf("following web's logs ended before a line: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("following web's logs: no line in 20 s")
	}

	mem, err := d.C.CreateCheckpoint(ctx, "svcp", api.CreateCheckpoint{})
	if err != nil {
		t.Fatal(err)
	}
	if s := waitService(t, d, "svcp", "web", "running", running); s.PID != web.PID {
		t.Errorf("after a memory checkpoint web has pid %d, want %d", s.PID, web.PID)
	}
	select {
	case err := <-followed:
		if !errors.Is(err, client.ErrInterrupted) {
			t.Errorf("following logs across a memory checkpoint ended with %v, want ErrInterrupted", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a memory checkpoint did not end the logs socket")
	}
	no := false
	disk, err := d.C.CreateCheckpoint(ctx, "svcp", api.CreateCheckpoint{Memory: &no})
	if err != nil {
		t.Fatal(err)
	}

	// A fork of the memory checkpoint carries on as the checkpoint had it.
	if _, err := d.C.Fork(ctx, "svcp", mem.ID, "svcp-fork"); err != nil {
		t.Fatal(err)
	}
	if s := waitService(t, d, "svcp-fork", "web", "running", running); s.PID != web.PID {
		t.Errorf("in a memory fork web has pid %d, want %d", s.PID, web.PID)
	}
	// A fork may not give services of its own.
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "svcp-fork2", From: &api.ForkSource{Sandbox: "svcp", Checkpoint: mem.ID},
		Services: []api.Service{{Name: "x", Cmd: []string{"true"}}}}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("a fork with services: %v, want invalid", err)
	}

	// A fork of the disk-only checkpoint boots fresh, and starts web.
	if _, err := d.C.Fork(ctx, "svcp", disk.ID, "svcp-dfork"); err != nil {
		t.Fatal(err)
	}
	waitService(t, d, "svcp-dfork", "web", "running in a disk-only fork", running)
	// Services of a fresh boot start once the agent knows which sandbox
	// it is in.
	waitService(t, d, "svcp-dfork", "who", "exited", func(s api.ServiceStatus) bool { return s.State == api.ServiceExited })
	if out, _ := serviceLogs(t, d, "svcp-dfork", "who"); out != "svcp-dfork\n" {
		t.Errorf("in a disk-only fork, who said %q", out)
	}
	if s, err := d.C.GetService(ctx, "svcp-dfork", "idle"); err != nil || s.State != api.ServiceStopped {
		t.Errorf("in a disk-only fork idle is %+v, %v; want stopped", s, err)
	}

	// Stopped by hand after the disk-only checkpoint: the restore's fresh
	// boot goes by the disk as it was then.
	if _, err := d.C.StopService(ctx, "svcp", "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.RestoreCheckpoint(ctx, "svcp", disk.ID); err != nil {
		t.Fatal(err)
	}
	s := waitService(t, d, "svcp", "web", "running after a disk-only restore", running)
	// Its pid may well be the same in a fresh boot: its start time is not.
	if s.StartedAt == nil || !s.StartedAt.After(*web.StartedAt) || s.Restarts != 0 {
		t.Errorf("after a disk-only restore web is %+v, want a fresh start (after %v)", s, web.StartedAt)
	}
	if s, err := d.C.GetService(ctx, "svcp", "idle"); err != nil || s.State != api.ServiceStopped {
		t.Errorf("after a disk-only restore idle is %+v, %v; want stopped", s, err)
	}
	// A fresh start: its first line may not be logged yet when the
	// service reads running.
	waitFor(t, func() bool {
		out, _ := serviceLogs(t, d, "svcp", "web")
		return strings.Contains(out, "tick\n")
	})

	// A memory restore brings back the memory's services.
	if _, err := d.C.RestoreCheckpoint(ctx, "svcp", mem.ID); err != nil {
		t.Fatal(err)
	}
	if s := waitService(t, d, "svcp", "web", "running", running); s.PID != web.PID {
		t.Errorf("after a memory restore web has pid %d, want %d", s.PID, web.PID)
	}
}

// TestServicesColdStart: when the host went down with the sandbox (its
// container is gone), the daemon boots the sandbox again on its disk, and
// its services start again as they were: running ones run, stopped ones
// stay stopped.
func TestServicesColdStart(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "cold", Services: []api.Service{
		{Name: "web", Cmd: tickCmd}, {Name: "idle", Cmd: tickCmd},
	}}); err != nil {
		t.Fatal(err)
	}
	web := waitService(t, d, "cold", "web", "running", running)
	if _, err := d.C.StopService(ctx, "cold", "idle"); err != nil {
		t.Fatal(err)
	}
	d.Stop()
	harness.DeleteContainers(filepath.Join(d.DataDir, "runsc"))
	d.Start()
	if !strings.Contains(d.Log.String(), "booting it again") {
		t.Fatalf("the daemon did not boot the sandbox again:\n%s", d.Log.String())
	}
	s := waitService(t, d, "cold", "web", "running after a cold start", running)
	if s.StartedAt == nil || !s.StartedAt.After(*web.StartedAt) {
		t.Errorf("after a cold start web is %+v, want a fresh start (after %v)", s, web.StartedAt)
	}
	if s, err := d.C.GetService(ctx, "cold", "idle"); err != nil || s.State != api.ServiceStopped {
		t.Errorf("after a cold start idle is %+v, %v; want stopped", s, err)
	}
}
