package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/sleep"
)

// sleeping checks that sandbox id sleeps: its state, no container, and a
// sleep image on disk.
func (e *env) sleeping(id string) {
	e.t.Helper()
	if rec := e.record(id); rec.State != api.StateSleeping {
		e.t.Fatalf("state %s, want sleeping", rec.State)
	}
	if _, ok := e.rt.Get(id); ok {
		e.t.Errorf("a sleeping sandbox has a container")
	}
	if _, err := os.Stat(filepath.Join(e.sandboxDir(id), "sleep", "mem")); err != nil {
		e.t.Errorf("no sleep image: %v", err)
	}
}

// awake checks that sandbox id runs, restored, without a sleep image, and
// that its agent answers to its own token only.
func (e *env) awake(id string, others ...string) {
	e.t.Helper()
	if rec := e.record(id); rec.State != api.StateRunning {
		e.t.Fatalf("state %s, want running", rec.State)
	}
	if c, ok := e.rt.Get(id); !ok || c.Status != runtime.StatusRunning {
		e.t.Fatalf("no running container: %+v", c)
	}
	if _, err := os.Stat(filepath.Join(e.sandboxDir(id), "sleep")); !os.IsNotExist(err) {
		e.t.Errorf("the sleep image is still there: %v", err)
	}
	e.agentAnswers(id, others...)
}

func count(ops []string, op string) int {
	n := 0
	for _, o := range ops {
		if o == op {
			n++
		}
	}
	return n
}

// TestSleepWake: sleep and wake, one wake for many callers at once, reads
// and checkpoints that don't wake, and the token moved on after a wake.
func TestSleepWake(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "nap"})
	slept, err := e.m.Sleep(e.ctx, "nap")
	if err != nil || slept.State != api.StateSleeping {
		t.Fatalf("Sleep: %+v %v", slept, err)
	}
	e.sleeping(sb.ID)
	held := e.token(sb.ID)
	if again, err := e.m.Sleep(e.ctx, "nap"); err != nil || again.State != api.StateSleeping {
		t.Errorf("Sleep of a sleeping sandbox: %+v %v", again, err)
	}

	// Reads, and checkpoints of both kinds, leave it asleep.
	if _, err := e.m.Get(e.ctx, "nap"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.List(e.ctx, nil); err != nil {
		t.Fatal(err)
	}
	disk := e.checkpoint("nap", false)
	mem := e.checkpoint("nap", true)
	if _, err := e.cps.ListCheckpoints(e.ctx, "nap"); err != nil {
		t.Fatal(err)
	}
	e.sleeping(sb.ID)
	if n := count(e.rt.CallsOf(sb.ID), "restore"); n != 0 {
		t.Fatalf("%d restores while asleep", n)
	}
	if e.cpRecord(sb.ID, mem.ID).AgentGen == e.record(sb.ID).AgentGen {
		t.Errorf("a memory checkpoint taken asleep holds the token the sandbox answers to")
	}

	// Many callers at once: one wake, no conflict.
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		wg.Go(func() {
			if i%2 == 0 {
				_, errs[i] = e.m.Wake(e.ctx, "nap")
			} else {
				_, errs[i] = e.guest().ListSessions(e.ctx, "nap")
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
	if n := count(e.rt.CallsOf(sb.ID), "restore"); n != 1 {
		t.Errorf("%d restores for 5 callers, want 1", n)
	}
	e.awake(sb.ID, held)

	// The checkpoints taken asleep restore.
	for _, cp := range []*api.Checkpoint{disk, mem} {
		if got, err := e.cps.RestoreCheckpoint(e.ctx, "nap", cp.ID); err != nil || got.State != api.StateRunning {
			t.Fatalf("restore %s: %+v %v", cp.ID, got, err)
		}
		e.agentAnswers(sb.ID)
	}
}

// TestRestoreSleeping: a restore of a sleeping sandbox keeps its sleeping
// state as auto-1 (a memory checkpoint), and leaves it running at the
// checkpoint without its sleep image.
func TestRestoreSleeping(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "nap"})
	e.writeVolume(sb.ID, "state.txt", "one")
	e.checkpoint("nap", false)
	e.writeVolume(sb.ID, "state.txt", "two")
	if _, err := e.m.Sleep(e.ctx, "nap"); err != nil {
		t.Fatal(err)
	}
	if got, err := e.cps.RestoreCheckpoint(e.ctx, "nap", "v1"); err != nil || got.State != api.StateRunning {
		t.Fatalf("restore: %+v %v", got, err)
	}
	e.awake(sb.ID)
	if s := e.readVolume(sb.ID, "state.txt"); s != "one" {
		t.Errorf("disk %q after the restore, want one", s)
	}
	if auto := e.cpRecord(sb.ID, "auto-1"); !auto.Memory {
		t.Errorf("auto-1 of a sleeping sandbox is not a memory checkpoint")
	}
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "nap", "auto-1"); err != nil {
		t.Fatal(err)
	}
	if s := e.readVolume(sb.ID, "state.txt"); s != "two" {
		t.Errorf("disk %q after undoing the restore, want two", s)
	}
	e.agentAnswers(sb.ID)
}

// TestSleepIdle: a sandbox sleeps once its idle time (its own, or the
// daemon's default) has passed without activity; Use starts it again; an
// open stream is activity; "0" never sleeps.
func TestSleepIdle(t *testing.T) {
	e := newEnv(t)
	// Idle sleep with a default idle, over the env's Manager.
	idle := sleep.New(sandbox.NewIdleCore(e.m), e.st, sleep.Config{DataDir: e.cfg.DataDir, Idle: time.Hour}, testLogger())
	dflt := e.create(api.CreateSandbox{Name: "dflt"})
	own := e.create(api.CreateSandbox{Name: "own", Idle: "10m"})
	never := e.create(api.CreateSandbox{Name: "never", Idle: "0"})
	if _, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "short", Idle: "10s"}); err == nil {
		t.Errorf("an idle of 10s was accepted; the minimum is 1m")
	}
	now := time.Now()
	// The first look starts each sandbox's clock.
	must(t, idle.SleepIdle(e.ctx, now))
	must(t, idle.SleepIdle(e.ctx, now.Add(11*time.Minute)))
	e.sleeping(own.ID)
	if e.record(dflt.ID).State != api.StateRunning {
		t.Errorf("dflt slept before its hour")
	}
	// Use wakes it and counts as activity.
	if got, err := e.m.Use(e.ctx, "own"); err != nil || got.State != api.StateRunning {
		t.Fatalf("Use: %+v %v", got, err)
	}
	must(t, idle.SleepIdle(e.ctx, time.Now().Add(5*time.Minute)))
	if e.record(own.ID).State != api.StateRunning {
		t.Errorf("own slept 5 minutes after it was used")
	}
	// An open stream is activity for as long as it is open.
	st, err := e.guest().WatchPorts(e.ctx, "own")
	if err != nil {
		t.Fatal(err)
	}
	must(t, idle.SleepIdle(e.ctx, time.Now().Add(2*time.Hour)))
	if e.record(own.ID).State != api.StateRunning {
		t.Errorf("own slept with a stream open")
	}
	st.Close()
	must(t, idle.SleepIdle(e.ctx, time.Now().Add(3*time.Hour)))
	e.sleeping(own.ID)
	e.sleeping(dflt.ID)
	if e.record(never.ID).State != api.StateRunning {
		t.Errorf("a sandbox with idle 0 slept")
	}
}

// TestSleepIdleExecCheck: the check before an exec (which wakes the
// sandbox) keeps it active until the exec's handler lets go, however long
// its client takes to send the command; then its idle runs again.
func TestSleepIdleExecCheck(t *testing.T) {
	e := newEnv(t)
	idle := sleep.New(sandbox.NewIdleCore(e.m), e.st, sleep.Config{DataDir: e.cfg.DataDir, Idle: time.Hour}, testLogger())
	sb := e.create(api.CreateSandbox{Name: "slowclient", Idle: "1m"})
	must(t, idle.SleepIdle(e.ctx, time.Now()))
	_, release, err := e.guest().CheckExec(e.ctx, "slowclient")
	if err != nil {
		t.Fatal(err)
	}
	must(t, idle.SleepIdle(e.ctx, time.Now().Add(2*time.Hour)))
	if e.record(sb.ID).State != api.StateRunning {
		t.Errorf("the sandbox slept between the exec's check and its command")
	}
	release()
	must(t, idle.SleepIdle(e.ctx, time.Now().Add(3*time.Hour)))
	e.sleeping(sb.ID)
}

// TestRecoverSleep: a crash part-way through a sleep or a wake leaves the
// sandbox running or asleep, never lost; a restart keeps a sleeping
// sandbox asleep.
func TestRecoverSleep(t *testing.T) {
	t.Run("crash before the image is written", func(t *testing.T) {
		e := newEnv(t)
		sb := e.create(api.CreateSandbox{Name: "nap"})
		crashAt(e, "checkpoint", func() { _, _ = e.m.Sleep(e.ctx, "nap") })
		must(t, e.restart())
		if rec := e.record(sb.ID); rec.State != api.StateRunning {
			t.Fatalf("state %s", rec.State)
		}
		if c, _ := e.rt.Get(sb.ID); c.Status != runtime.StatusRunning {
			t.Errorf("container %s, want running", c.Status)
		}
		e.agentAnswers(sb.ID)
	})
	t.Run("crash once the image is durable", func(t *testing.T) {
		e := newEnv(t)
		sb := e.create(api.CreateSandbox{Name: "nap"})
		crashAt(e, "delete", func() { _, _ = e.m.Sleep(e.ctx, "nap") })
		if rec := e.record(sb.ID); rec.State != api.StateRunning {
			t.Fatalf("before recovery: state %s", rec.State)
		}
		must(t, e.restart())
		e.sleeping(sb.ID)
		if _, err := e.m.Wake(e.ctx, "nap"); err != nil {
			t.Fatal(err)
		}
		e.awake(sb.ID)
	})
	t.Run("crash during a wake", func(t *testing.T) {
		e := newEnv(t)
		sb := e.create(api.CreateSandbox{Name: "nap"})
		if _, err := e.m.Sleep(e.ctx, "nap"); err != nil {
			t.Fatal(err)
		}
		crashAt(e, "restore", func() { _, _ = e.m.Wake(e.ctx, "nap") })
		must(t, e.restart())
		e.sleeping(sb.ID)
		if _, err := e.m.Wake(e.ctx, "nap"); err != nil {
			t.Fatal(err)
		}
		e.awake(sb.ID)
	})
	t.Run("crash after the checkpoint stopped it, before the image was durable", func(t *testing.T) {
		e := newEnv(t)
		sb := e.create(api.CreateSandbox{Name: "nap"})
		must(t, os.MkdirAll(filepath.Join(e.sandboxDir(sb.ID), "sleep", ".tmp-1", "mem"), 0o700))
		e.rt.Vanish(sb.ID)
		must(t, e.restart())
		if rec := e.record(sb.ID); rec.State != api.StateRunning {
			t.Fatalf("state %s, want running (booted again)", rec.State)
		}
		if ops := e.rt.CallsOf(sb.ID); ops[len(ops)-1] != "start" {
			t.Errorf("not booted again: %v", ops)
		}
		if _, err := os.Stat(filepath.Join(e.sandboxDir(sb.ID), "sleep")); !os.IsNotExist(err) {
			t.Errorf("the unfinished sleep image is still there: %v", err)
		}
		e.agentAnswers(sb.ID)
	})
	t.Run("restart while asleep", func(t *testing.T) {
		e := newEnv(t)
		sb := e.create(api.CreateSandbox{Name: "nap"})
		if _, err := e.m.Sleep(e.ctx, "nap"); err != nil {
			t.Fatal(err)
		}
		must(t, e.restart())
		e.sleeping(sb.ID)
		if ops := e.rt.CallsOf(sb.ID); slices.Contains(ops, "restore") || slices.Contains(ops, "start") && count(ops, "start") > 1 {
			t.Errorf("recovery started it: %v", ops)
		}
	})
}

// TestCallDuringSleep: a call that comes while the sandbox goes to sleep
// waits for the sleep, then wakes it, instead of failing on a container
// that is going away.
func TestCallDuringSleep(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "nap"})
	entered, release := make(chan struct{}), make(chan struct{})
	e.rt.SetHook(func(op, id string) {
		if op == "checkpoint" {
			close(entered)
			<-release
		}
	})
	slept := make(chan error, 1)
	go func() { _, err := e.m.Sleep(e.ctx, "nap"); slept <- err }()
	<-entered
	called := make(chan error, 1)
	go func() { _, err := e.guest().ListSessions(e.ctx, "nap"); called <- err }()
	eventually(t, "waiting for the sleep", func() bool { return e.m.OpWaiters(sb.ID) == 1 })
	select {
	case err := <-called:
		t.Fatalf("the call did not wait for the sleep: %v", err)
	default:
	}
	e.rt.SetHook(nil)
	close(release)
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
	if err := <-called; err != nil {
		t.Fatalf("the call after the sleep: %v", err)
	}
	e.awake(sb.ID)
}

// TestIdleComponent: the daemon's Idle component puts an idle sandbox to
// sleep on its own, and the end of its ctx stops it.
func TestIdleComponent(t *testing.T) {
	e := newEnv(t, func(c *sandbox.Config) { c.IdleMin = 10 * time.Millisecond })
	sb := e.create(api.CreateSandbox{Name: "nap", Idle: "200ms"})
	idle := sleep.New(sandbox.NewIdleCore(e.m), e.st, sleep.Config{DataDir: e.cfg.DataDir, Every: 20 * time.Millisecond}, testLogger())
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- idle.Run(ctx) }()
	eventually(t, "asleep", func() bool { return e.record(sb.ID).State == api.StateSleeping })
	cancel()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run still running 10 s after its ctx ended")
	}
	e.sleeping(sb.ID)
}

// TestIdleEndedAtStart: a daemon that stops as soon as it has started ends
// its Idle component's ctx before the goroutine that runs it has begun:
// the late Run returns at once, without a round (the sandbox, idle long
// enough, stays awake).
func TestIdleEndedAtStart(t *testing.T) {
	e := newEnv(t, func(c *sandbox.Config) { c.IdleMin = time.Millisecond })
	sb := e.create(api.CreateSandbox{Name: "late", Idle: "1ms"})
	time.Sleep(5 * time.Millisecond) // past its idle: a round would put it to sleep
	idle := sleep.New(sandbox.NewIdleCore(e.m), e.st, sleep.Config{DataDir: e.cfg.DataDir, Every: time.Millisecond}, testLogger())
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	done := make(chan error, 1)
	go func() { done <- idle.Run(ctx) }()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run with an ended ctx still running after 10 s")
	}
	if st := e.record(sb.ID).State; st != api.StateRunning {
		t.Errorf("state after a Run whose ctx had ended: %s, want running", st)
	}
}

// TestHold: a sandbox woken by Use is kept awake by Active until released,
// as the URL front door holds a connection through its URL.
func TestHold(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "web", Idle: "1m"})
	if _, err := e.m.Sleep(e.ctx, "web"); err != nil {
		t.Fatal(err)
	}
	got, err := e.m.Use(e.ctx, "web")
	if err != nil || got.State != api.StateRunning {
		t.Fatalf("Use: %+v %v", got, err)
	}
	release := e.m.Active(got.ID)
	e.awake(sb.ID)
	must(t, e.sleep.SleepIdle(e.ctx, time.Now().Add(time.Hour)))
	if e.record(sb.ID).State != api.StateRunning {
		t.Fatal("slept while held")
	}
	release()
	release()
	must(t, e.sleep.SleepIdle(e.ctx, time.Now().Add(30*time.Second)))
	if e.record(sb.ID).State != api.StateRunning {
		t.Fatal("slept 30 s after the hold ended, with an idle of 1m")
	}
	must(t, e.sleep.SleepIdle(e.ctx, time.Now().Add(2*time.Minute)))
	e.sleeping(sb.ID)
}
