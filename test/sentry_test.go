package test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// TestSandboxProcessKilled kills a sandbox's sandbox process (gVisor's
// sentry) from outside, as the OOM killer or an operator would: the
// sandbox becomes error saying so, its exec stream and its session's
// attach end with that reason, nothing of its container is left, and it
// comes back by a restore of a checkpoint taken before; another one comes
// back by a wake, which boots it again on its disk with its files. The
// daemon's own stops (a checkpoint, a sleep, a restore) never count as a
// death. It logs how long the daemon took to notice.
func TestSandboxProcessKilled(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	victim, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "victim"})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("victim", "sh", "-c", "echo v1 > /home/loam/f")
	cp, err := d.C.CreateCheckpoint(ctx, "victim", api.CreateCheckpoint{})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("victim", "sh", "-c", "echo v2 > /home/loam/f")

	// An exec stream and a detachable session's attach, both following.
	var execOut harness.SyncBuffer
	execDone := make(chan error, 1)
	go func() {
		_, err := d.C.Exec(ctx, "victim", client.ExecOptions{Cmd: counterCmd, Stdout: &execOut})
		execDone <- err
	}()
	ss, err := d.C.CreateSession(ctx, "victim", api.ExecRequest{Cmd: counterCmd})
	if err != nil {
		t.Fatal(err)
	}
	var f follower
	attachDone := f.attach(ctx, d.C, "victim", ss.ID)
	f.waitLines(t, 5)
	waitFor(t, func() bool { return strings.Count(execOut.String(), "\n") >= 5 })
	// A file watch and a ports watch too.
	fw, err := d.C.Watch(ctx, "victim", "/home/loam", nil)
	if err != nil {
		t.Fatal(err)
	}
	watchDone := make(chan error, 1)
	go func() {
		for {
			if _, err := fw.Next(ctx); err != nil {
				watchDone <- err
				return
			}
		}
	}()
	portsDone := make(chan error, 1)
	go func() {
		for _, err := range d.C.WatchPorts(ctx, "victim") {
			if err != nil {
				portsDone <- err
				return
			}
		}
		portsDone <- errors.New("the ports watch stopped without an error")
	}()
	d.Run("victim", "touch", "/home/loam/seen") // the watch is in place

	took := killSentry(t, d, victim.ID)
	t.Logf("killed by SIGKILL: state error after %v", took)
	got, err := d.C.GetSandbox(ctx, "victim")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got.Reason, "sandbox process") || !strings.Contains(got.Reason, "signal 9") {
		t.Errorf("error says %q, want the sandbox process killed by signal 9", got.Reason)
	}
	for name, done := range map[string]<-chan error{"exec": execDone, "attach": attachDone, "file watch": watchDone, "ports watch": portsDone} {
		select {
		case err := <-done:
			interrupted := errors.Is(err, client.ErrInterrupted) || !strings.Contains("exec attach", name)
			if !interrupted || !strings.Contains(err.Error(), "signal 9") {
				t.Errorf("%s ended with %v, want interrupted with the reason", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not end", name)
		}
	}
	checkNoContainer(t, d, victim.ID)

	// A restore from error puts the checkpoint back, and running it stays.
	if _, err := d.C.RestoreCheckpoint(ctx, "victim", cp.ID); err != nil {
		t.Fatal(err)
	}
	if out := d.Run("victim", "cat", "/home/loam/f"); out != "v1\n" {
		t.Errorf("after the restore: %q, want v1", out)
	}

	// Another one: a sleep and a wake are no death; after a kill a wake
	// boots it again on its disk, which has its files.
	phoenix, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "phoenix"})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("phoenix", "sh", "-c", "echo kept > /home/loam/g; sync")
	if _, err := d.C.Sleep(ctx, "phoenix"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.Wake(ctx, "phoenix"); err != nil {
		t.Fatal(err)
	}
	took = killSentry(t, d, phoenix.ID)
	t.Logf("killed by SIGKILL after a sleep and wake: state error after %v", took)
	checkNoContainer(t, d, phoenix.ID)
	if _, _, _, err := d.C.Output(ctx, "phoenix", "true"); !errors.Is(err, api.ErrConflict) {
		t.Errorf("exec in a broken sandbox: %v, want a conflict", err)
	}
	sb, err := d.C.Wake(ctx, "phoenix")
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != api.StateRunning || sb.Reason != "" {
		t.Errorf("after the wake: %s %q", sb.State, sb.Reason)
	}
	if out := d.Run("phoenix", "cat", "/home/loam/g"); out != "kept\n" {
		t.Errorf("after booting again: %q, want kept", out)
	}

	// The daemon's own stops (the restore's above, the sleep's) were not
	// taken for deaths.
	time.Sleep(time.Second)
	for _, name := range []string{"victim", "phoenix"} {
		sb, err := d.C.GetSandbox(ctx, name)
		if err != nil || sb.State != api.StateRunning {
			t.Errorf("%s: %v %+v", name, err, sb)
		}
	}
	for _, id := range []string{victim.ID, phoenix.ID} {
		if err := d.C.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		checkNoContainer(t, d, id)
		if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), "loam-"+id) {
			t.Errorf("the network namespace of %s is left", id)
		}
	}
}

// killSentry kills sandbox id's sandbox process with SIGKILL and returns
// how long the daemon took to call the sandbox broken.
func killSentry(t *testing.T, d *harness.Daemon, id string) time.Duration {
	t.Helper()
	out, err := exec.Command(harness.Runsc(), "--root", filepath.Join(d.DataDir, "runsc"), "state", id).Output()
	if err != nil {
		t.Fatalf("runsc state %s: %v", id, err)
	}
	var st struct{ Pid int }
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("runsc state %s: %s: %v", id, out, err)
	}
	if err := syscall.Kill(st.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		sb, err := d.C.GetSandbox(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if sb.State == api.StateError {
			return time.Since(start)
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("30 s after its sandbox process was killed, %s is %s", id, sb.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkNoContainer checks that runsc has no container id and no process
// of it is left.
func checkNoContainer(t *testing.T, d *harness.Daemon, id string) {
	t.Helper()
	out, _ := exec.Command(harness.Runsc(), "--root", filepath.Join(d.DataDir, "runsc"), "list", "-quiet").Output()
	if strings.Contains(string(out), id) {
		t.Errorf("runsc still has container %s", id)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), id) {
			t.Errorf("process %s of %s is left: %q", filepath.Base(filepath.Dir(p)), id, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
