package test

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// idleFlags make idle times of seconds possible, for tests.
var idleFlags = []string{"--test-idle-every", "300ms", "--test-idle-min", "1s"}

// wakes counts the wakes of a sandbox the daemon has logged so far.
func wakes(d *harness.Daemon, id string) int {
	return strings.Count(d.Log.String(), "msg=awake sandbox="+id)
}

// waitState waits, reading the sandbox (which never wakes it), until it
// is in state want.
func waitState(t *testing.T, d *harness.Daemon, sb string, want api.State) *api.Sandbox {
	t.Helper()
	var got *api.Sandbox
	harness.Eventually(t, 30*time.Second, fmt.Sprintf("%s %s", sb, want), func() error {
		var err error
		got, err = d.C.GetSandbox(harness.Ctx(t), sb)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != want {
			return fmt.Errorf("%s is %s", sb, got.State)
		}
		return nil
	})
	return got
}

// runscProcesses counts the host processes that name sandbox id (runsc's
// sandbox, gofer and their helpers).
func runscProcesses(id string) int { return len(pids(id)) }

// pids lists the host processes whose command line names id.
func pids(id string) []string {
	out, _ := exec.Command("pgrep", "-f", id).Output()
	return strings.Fields(string(out))
}

// startCounter starts a counter like counter's that also writes its PID.
func startCounter(t *testing.T, d *harness.Daemon, sb string) string {
	t.Helper()
	// The pid file goes first: a counter of an earlier call may still
	// run (and write /tmp/count), and the pid read must be the new one's.
	d.Run(sb, "rm", "-f", "/tmp/pid")
	d.Run(sb, "sh", "-c", `sh -c 'echo $$ > /tmp/pid.tmp; mv /tmp/pid.tmp /tmp/pid; i=0; while true; do i=$((i+1)); echo $i > /tmp/count.tmp; mv /tmp/count.tmp /tmp/count; sleep 0.05; done' >/dev/null 2>&1 &`)
	waitFor(t, func() bool { return readCount(t, d, sb) > 0 })
	waitFor(t, func() bool { return strings.TrimSpace(d.Run(sb, "sh", "-c", "cat /tmp/pid 2>/dev/null; true")) != "" })
	return strings.TrimSpace(d.Run(sb, "cat", "/tmp/pid"))
}

// alive checks the process pid still runs in sb, as the counter.
func alive(t *testing.T, d *harness.Daemon, sb, pid string) {
	t.Helper()
	out := d.Run(sb, "sh", "-c", "cat /tmp/pid; kill -0 "+pid+" && echo alive")
	if out != pid+"\nalive\n" {
		t.Fatalf("the counter (pid %s) in %s: %q", pid, sb, out)
	}
}

// TestSleepWake: a sandbox with an idle time falls asleep (no runsc process
// left); reading it, listing and reading its checkpoints, and checkpoints
// of it (disk-only, and memory from the sleep image) don't wake it; an exec
// wakes it with its processes and PIDs and the counter's state; loam sleep
// and loam wake; a fork of a checkpoint taken asleep doesn't wake it; a
// daemon restart keeps it asleep; a restore of a sleeping sandbox leaves it
// running at the checkpoint with an auto-N of its sleeping state.
func TestSleepWake(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t, idleFlags...)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "nap", Idle: "2s"})
	if err != nil {
		t.Fatal(err)
	}
	pid := startCounter(t, d, "nap")
	before := readCount(t, d, "nap")

	// Idle: it falls asleep, and nothing of it runs on the host.
	waitState(t, d, "nap", api.StateSleeping)
	if n := runscProcesses(sb.ID); n != 0 {
		t.Errorf("%d host processes name the sleeping sandbox", n)
	}
	woken := wakes(d, sb.ID)

	// Reads and checkpoints don't wake it.
	if out, errOut, code := d.CLI("", "checkpoint", "ls", "nap"); code != 0 {
		t.Fatalf("checkpoint ls: %d %s %s", code, out, errOut)
	}
	if out, _, _ := d.CLI("", "ls"); !strings.Contains(out, "sleeping") {
		t.Errorf("ls does not show sleeping:\n%s", out)
	}
	disk := mustCheckpoint(t, d, "nap", false)
	mem := mustCheckpoint(t, d, "nap", true)
	if _, err := d.C.GetCheckpoint(ctx, "nap", mem.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, d, "nap", api.StateSleeping)
	if wakes(d, sb.ID) != woken {
		t.Fatalf("reads or checkpoints woke the sandbox:\n%s", d.Log.String())
	}

	// A fork of the memory checkpoint counts on; the source sleeps on.
	if _, err := d.C.Fork(ctx, "nap", mem.ID, "nap-fork"); err != nil {
		t.Fatal(err)
	}
	counts(t, d, "nap-fork", before)
	if got := waitState(t, d, "nap", api.StateSleeping); wakes(d, sb.ID) != woken {
		t.Fatalf("the fork woke its source (%s)", got.State)
	}
	if err := d.C.DeleteSandbox(ctx, "nap-fork"); err != nil {
		t.Fatal(err)
	}

	// An exec wakes it: same process, and the count goes on from where it was.
	n := readCount(t, d, "nap")
	if n < before {
		t.Errorf("woken, the count is %d; before sleeping it was at least %d", n, before)
	}
	if wakes(d, sb.ID) != woken+1 {
		t.Errorf("an exec on a sleeping sandbox: %d wakes, want 1", wakes(d, sb.ID)-woken)
	}
	alive(t, d, "nap", pid)
	counts(t, d, "nap", n)

	// loam sleep, a daemon restart (it stays asleep), loam wake.
	if out, errOut, code := d.CLI("", "sleep", "nap"); code != 0 || out != "nap\tsleeping\n" {
		t.Fatalf("loam sleep: %d %q %q", code, out, errOut)
	}
	d.Stop()
	d.Start(idleFlags...)
	waitState(t, d, "nap", api.StateSleeping)
	if n := runscProcesses(sb.ID); n != 0 {
		t.Errorf("after a restart, %d host processes name the sleeping sandbox", n)
	}
	if out, errOut, code := d.CLI("", "wake", "nap"); code != 0 || out != "nap\trunning\n" {
		t.Fatalf("loam wake: %d %q %q", code, out, errOut)
	}
	alive(t, d, "nap", pid)

	// A restore of a sleeping sandbox: running at the checkpoint (the
	// disk-only one boots fresh), with an automatic memory checkpoint of
	// its sleeping state, which a restore brings back with the counter.
	if _, err := d.C.Sleep(ctx, "nap"); err != nil {
		t.Fatal(err)
	}
	got, err := d.C.RestoreCheckpoint(ctx, "nap", disk.ID)
	if err != nil || got.State != api.StateRunning {
		t.Fatalf("restore of a sleeping sandbox: %v %+v", err, got)
	}
	// A fresh boot reuses low PIDs, so the PID may name another process:
	// what must be gone is the counter itself.
	if out, _, _, _ := d.C.Output(ctx, "nap", "sh", "-c", "cat /proc/"+pid+"/cmdline 2>/dev/null | tr '\\0' ' '"); strings.Contains(string(out), "/tmp/count") {
		t.Errorf("after a disk-only restore the counter still runs: %q", out)
	}
	cps, err := d.C.ListCheckpoints(ctx, "nap")
	if err != nil {
		t.Fatal(err)
	}
	last := cps[len(cps)-1]
	if !last.Auto || !last.Memory {
		t.Fatalf("no automatic memory checkpoint: %+v", cps)
	}
	if _, err := d.C.RestoreCheckpoint(ctx, "nap", last.ID); err != nil {
		t.Fatal(err)
	}
	alive(t, d, "nap", pid)
	// The memory checkpoint taken asleep restores too.
	if _, err := d.C.RestoreCheckpoint(ctx, "nap", mem.ID); err != nil {
		t.Fatal(err)
	}
	alive(t, d, "nap", pid)
}

// TestSleepKeepsSessions: a detachable session runs on across sleeps and
// wakes with its PID; listing sessions, and files, ports and services
// calls, each wake a sleeping sandbox.
func TestSleepKeepsSessions(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "sess"}); err != nil {
		t.Fatal(err)
	}
	s, err := d.C.CreateSession(ctx, "sess", api.ExecRequest{Cmd: []string{"sleep", "3600"}, Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := d.C.Sleep(ctx, "sess"); err != nil || got.State != api.StateSleeping {
		t.Fatalf("sleep: %+v %v", got, err)
	}
	list, err := d.C.ListSessions(ctx, "sess")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != s.ID || list[0].PID != s.PID || list[0].State != api.SessionRunning {
		t.Fatalf("sessions after the wake: %+v, want %s (pid %d) running", list, s.ID, s.PID)
	}
	if sb, _ := d.C.GetSandbox(ctx, "sess"); sb.State != api.StateRunning {
		t.Errorf("after listing sessions the sandbox is %s", sb.State)
	}

	// Each kind of call that needs the sandbox running wakes it.
	for name, call := range map[string]func() error{
		"files":    func() error { _, err := d.C.StatFile(ctx, "sess", "/etc/hostname", nil); return err },
		"ports":    func() error { _, err := d.C.ListPorts(ctx, "sess"); return err },
		"services": func() error { _, err := d.C.ListServices(ctx, "sess"); return err },
		"wake":     func() error { _, err := d.C.Wake(ctx, "sess"); return err },
	} {
		if _, err := d.C.Sleep(ctx, "sess"); err != nil {
			t.Fatal(err)
		}
		if err := call(); err != nil {
			t.Errorf("%s on a sleeping sandbox: %v", name, err)
		}
		if sb, _ := d.C.GetSandbox(ctx, "sess"); sb.State != api.StateRunning {
			t.Errorf("after a %s call the sandbox is %s", name, sb.State)
		}
	}
	if list, err := d.C.ListSessions(ctx, "sess"); err != nil || len(list) != 1 || list[0].PID != s.PID {
		t.Errorf("sessions after 5 sleeps: %+v %v", list, err)
	}
}

// TestServeIdle: a sandbox created without an idle takes loam serve
// --idle; an exec stream open longer than the idle keeps it awake; "0"
// never sleeps.
func TestServeIdle(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t, append([]string{"--idle", "1500ms"}, idleFlags...)...)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "dflt"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "never", Idle: "0"}); err != nil {
		t.Fatal(err)
	}
	// The exec's command says "began", then waits for its stdin to close,
	// which the test does only once it has looked at the sandbox three
	// times, each more than the idle plus a round of idle sleep (2.5 s)
	// after "began": every look falls inside the exec, whenever a loaded
	// host lets it happen, when the sandbox must be running. Looks are no
	// activity. Before "began" the sandbox may have slept and been woken
	// by the exec (on a loaded host the exec can take longer than the idle
	// to arrive).
	start := time.Now()
	seen := make(chan struct{})
	done := make(chan error, 1)
	stdin, hold := io.Pipe()
	defer hold.Close()
	go func() {
		code, err := d.C.Exec(ctx, "dflt", client.ExecOptions{
			Cmd:    []string{"sh", "-c", "echo began; cat >/dev/null"},
			Stdin:  stdin,
			Stdout: &firstWrite{started: seen},
		})
		if err == nil && code != 0 {
			err = fmt.Errorf("exit code %d", code)
		}
		done <- err
	}()
	var began time.Time
	select {
	case <-seen:
		began = time.Now()
	case err := <-done:
		t.Fatalf("the exec ended before it said it began: %v", err)
	}
	for looks := 0; looks < 3; {
		select {
		case err := <-done:
			t.Fatalf("the exec ended before the test closed its stdin: %v", err)
		case <-time.After(200 * time.Millisecond):
			if time.Since(began) < 2500*time.Millisecond {
				continue
			}
			sb, err := d.C.GetSandbox(ctx, "dflt")
			if err != nil {
				t.Fatal(err)
			}
			looks++
			if sb.State != api.StateRunning {
				t.Fatalf("%s while an exec runs, %v after it began, with an idle of 1.5 s", sb.State, time.Since(began).Round(time.Millisecond))
			}
		}
	}
	t.Logf("3 looks inside the exec, the last %v after it began (%v after it was sent), found the sandbox running",
		time.Since(began).Round(time.Millisecond), began.Sub(start).Round(time.Millisecond))
	hold.Close()
	if err := <-done; err != nil {
		t.Fatalf("the exec, its stdin closed: %v", err)
	}
	waitState(t, d, "dflt", api.StateSleeping)
	if sb, _ := d.C.GetSandbox(ctx, "never"); sb.State != api.StateRunning {
		t.Errorf("a sandbox with idle 0 is %s", sb.State)
	}
}

// TestCrashMidSleep: a daemon killed part-way through a sleep leaves the
// sandbox running or asleep, never lost: after a restart an exec answers,
// and a sandbox found asleep wakes with its processes.
func TestCrashMidSleep(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "crashy", Resources: &api.Resources{MemoryMiB: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("crashy", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/blob bs=1M count=384 2>/dev/null")
	sleepDir := filepath.Join(d.DataDir, "sandboxes", sb.ID, "sleep")
	for _, after := range []time.Duration{0, 300 * time.Millisecond, 900 * time.Millisecond} {
		pid := startCounter(t, d, "crashy")
		// The kill must come while the sleep writes its image (.tmp-*).
		// That lasts about a second; a look that misses it (the host
		// busy) finds the sleep done instead: wake the sandbox and try
		// again.
		for attempt := 1; ; attempt++ {
			slept := make(chan struct{})
			go func() {
				defer close(slept)
				d.C.Sleep(context.Background(), "crashy")
			}()
			if harness.Seen(filepath.Join(sleepDir, ".tmp-*"), slept) {
				break
			}
			if attempt == 5 {
				t.Fatal("the sleep's image was never seen being written (5 tries)")
			}
			t.Logf("the sleep ended before it was seen writing its image (try %d); again", attempt)
			if _, err := d.C.Wake(ctx, "crashy"); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(after) // the point of the test: a kill this far into the sleep
		d.KillSettled()   // runsc finishes or fails what it was doing
		d.Start()
		got, err := d.C.GetSandbox(ctx, "crashy")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("killed %v into the sleep: %s", after, got.State)
		switch got.State {
		case api.StateSleeping:
			alive(t, d, "crashy", pid)
		case api.StateRunning:
			d.Run("crashy", "true")
		default:
			t.Fatalf("killed %v into the sleep: %s", after, got.State)
		}
		d.Run("crashy", "sh", "-c", "pkill -f count.tmp; true")
	}
}
