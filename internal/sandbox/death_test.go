package sandbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/runtime/fake"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/warmpool"
)

// pidRuntime is the fake runtime telling the pid of each container's
// process, as runsc tells its sandbox process's: the Manager watches it.
type pidRuntime struct{ *fake.Runtime }

func (r pidRuntime) SandboxPid(ctx context.Context, id string) (int, error) {
	return r.Pid(id)
}

// TestSandboxProcessDies: the daemon's own stops (a memory checkpoint, a
// sleep and a wake, a restore, which stops and replaces the container) are
// not taken for deaths; a container process killed from outside is, at
// once: state error with the reason, its streams ended with it; a wake
// boots it again on its disk, files kept.
func TestSandboxProcessDies(t *testing.T) {
	e := newEnv(t)
	cfg := e.cfg
	cfg.Forks = e.forks(pidRuntime{e.rt})
	e.m = sandbox.New(cfg, e.st, pidRuntime{e.rt}, e.pool, e.nets, e.shelf, testLogger())
	if err := e.m.Recover(e.ctx); err != nil {
		t.Fatal(err)
	}
	sb := e.create(api.CreateSandbox{Name: "mortal"})
	cp := e.checkpoint("mortal", true)
	if _, err := e.m.Sleep(e.ctx, "mortal"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Wake(e.ctx, "mortal"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "mortal", cp.ID); err != nil {
		t.Fatal(err)
	}
	// Each of those ended a container process: once the watches on them
	// are over (only the restored container's is left), a wrong
	// judgement would have come.
	eventually(t, "one watch left", func() bool { return e.m.DeathWatchers() == 1 })
	if got := e.record(sb.ID); got.State != api.StateRunning {
		t.Fatalf("after the daemon's own stops: %s (%s)", got.State, got.Error)
	}

	e.writeVolume(sb.ID, "kept", "yes")
	st, err := e.guest().Exec(e.ctx, "mortal", api.ExecRequest{Cmd: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	c, ok := e.rt.Get(sb.ID)
	if !ok {
		t.Fatal("no container")
	}
	c.Kill()
	select {
	case <-st.Ended():
		st.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the exec stream did not end")
	}
	if !strings.Contains(st.Reason(), "signal 9") {
		t.Errorf("the stream ended with %q, want the sandbox process killed by signal 9", st.Reason())
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.record(sb.ID).State != api.StateError {
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the kill: %s", e.record(sb.ID).State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	v, err := e.m.Get(e.ctx, "mortal")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(v.Reason, "killed by signal 9") {
		t.Errorf("reason %q", v.Reason)
	}
	if _, ok := e.rt.Get(sb.ID); ok {
		t.Errorf("the dead container was not removed")
	}

	v, err = e.m.Wake(e.ctx, "mortal")
	if err != nil {
		t.Fatal(err)
	}
	if v.State != api.StateRunning || v.Reason != "" {
		t.Errorf("after the wake: %s %q", v.State, v.Reason)
	}
	if got := e.readVolume(sb.ID, "kept"); got != "yes" {
		t.Errorf("file after booting again: %q", got)
	}
}

// TestPoolMemberDies: a warm pool's member whose process dies is deleted
// and made again, never handed out.
func TestPoolMemberDies(t *testing.T) {
	e := newPoolTest(t, warmpool.Config{})
	cfg := e.cfg
	cfg.Forks = e.forks(pidRuntime{e.rt})
	e.m = sandbox.New(cfg, e.st, pidRuntime{e.rt}, e.pool, e.nets, e.shelf, testLogger())
	if err := e.m.Recover(e.ctx); err != nil {
		t.Fatal(err)
	}
	runPools(t, e)
	e.create(api.CreateSandbox{Name: "src"})
	cp := e.checkpoint("src", true)
	if _, err := e.pools.SetCheckpointPool(e.ctx, "src", cp.ID, 1); err != nil {
		t.Fatal(err)
	}
	waitReady(t, e, "src", cp.ID, 1)
	var member string
	for _, id := range e.rt.IDs() {
		if got := e.record(id); got.Pool != "" {
			member = id
		}
	}
	c, ok := e.rt.Get(member)
	if member == "" || !ok {
		t.Fatalf("no member among %v", e.rt.IDs())
	}
	c.Kill()
	deadline := time.Now().Add(20 * time.Second)
	for {
		p, err := e.pools.CheckpointPool(e.ctx, "src", cp.ID)
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.st.GetSandbox(e.ctx, "", member)
		if p.Ready == 1 && err != nil {
			break // the dead one gone, another made
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool: %+v; the dead member's record: %v", p, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
