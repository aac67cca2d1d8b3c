package sandbox_test

import (
	"errors"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/runtime/fake"
	"loam.dev/loam/internal/sandbox"
)

// crashAt runs op until it calls the runtime's op crashOp, where its
// goroutine ends, as if the daemon had died there. (Deferred calls do run,
// which a real crash would not do; the sweep test makes what they remove
// by hand.)
func crashAt(e *env, crashOp string, op func()) {
	e.t.Helper()
	e.rt.SetHook(func(o, id string) {
		if o == crashOp {
			goruntime.Goexit()
		}
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		op()
		e.t.Errorf("no crash: %s was not called", crashOp)
	}()
	<-done
	e.rt.SetHook(nil)
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, d := range entries {
		names = append(names, d.Name())
	}
	return names
}

func TestRecover(t *testing.T) {
	t.Run("running is taken back", func(t *testing.T) {
		e := newEnv(t)
		sb := e.create(api.CreateSandbox{Name: "alive", Resources: &api.Resources{CPUs: 0.5, MemoryMiB: 256}})
		must(t, e.restart())
		// Taken back as it runs, with its limits set again: a crash may
		// have come while a checkpoint had lifted them.
		if got := e.rt.CallsOf(sb.ID); !slices.Equal(got, []string{"start", "setlimits"}) {
			t.Errorf("runtime calls %v, want the first start, then setlimits", got)
		}
		if c, _ := e.rt.Get(sb.ID); c.Limits == nil || *c.Limits != (runtime.Limits{CPUs: 0.5, MemoryMiB: 256}) {
			t.Errorf("limits after recovery %+v", c.Limits)
		}
		if got, _ := e.m.Get(e.ctx, "alive"); got.State != api.StateRunning {
			t.Errorf("state %s", got.State)
		}
		e.agentAnswers(sb.ID)
	})

	for _, tc := range []struct {
		name string
		kill func(t *testing.T, e *env, id string)
	}{
		{"gone container boots again", func(t *testing.T, e *env, id string) { e.rt.Vanish(id) }},
		{"dead container boots again", func(t *testing.T, e *env, id string) {
			c, _ := e.rt.Get(id)
			c.Kill()
			if st, _ := e.rt.State(e.ctx, id); st != runtime.StatusStopped {
				t.Fatalf("killed container is %s", st)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			sb := e.create(api.CreateSandbox{Name: "reboot"})
			e.writeVolume(sb.ID, "state.txt", "kept")
			tc.kill(t, e, sb.ID)
			must(t, e.restart())
			if got, want := e.rt.CallsOf(sb.ID), []string{"start", "delete", "start"}; !slices.Equal(got, want) {
				t.Errorf("runtime calls %v, want %v", got, want)
			}
			if got, _ := e.m.Get(e.ctx, "reboot"); got.State != api.StateRunning {
				t.Errorf("state %s", got.State)
			}
			if c, _ := e.rt.Get(sb.ID); c.From != "" || c.Status != runtime.StatusRunning {
				t.Errorf("container %+v", c)
			}
			e.agentAnswers(sb.ID)
			if s := e.readVolume(sb.ID, "state.txt"); s != "kept" {
				t.Errorf("disk %q, want the one it had", s)
			}
		})
	}

	t.Run("running container not taken back is stopped", func(t *testing.T) {
		// Its limits cannot be set again: recovery gives the sandbox up,
		// and a container left running would go on with no daemon
		// managing it.
		e := newEnv(t)
		sb := e.create(api.CreateSandbox{Name: "lost"})
		e.rt.FailNext("setlimits", errors.New("cgroup gone"))
		must(t, e.restart())
		got, _ := e.m.Get(e.ctx, "lost")
		if rec := e.record(sb.ID); got.State != api.StateError || !strings.Contains(rec.Error, "its container was stopped") {
			t.Errorf("state %s, error %q; want error saying the container was stopped", got.State, rec.Error)
		}
		if got, want := e.rt.CallsOf(sb.ID), []string{"start", "setlimits", "delete"}; !slices.Equal(got, want) {
			t.Errorf("runtime calls %v, want %v", got, want)
		}
		if st, err := e.rt.State(e.ctx, sb.ID); err == nil && st != runtime.StatusStopped {
			t.Errorf("container is %s after recovery gave the sandbox up", st)
		}
		// A wake boots it again on its disk.
		if _, err := e.m.Wake(e.ctx, "lost"); err != nil {
			t.Fatal(err)
		}
		if got, _ := e.m.Get(e.ctx, "lost"); got.State != api.StateRunning {
			t.Errorf("state after wake %s", got.State)
		}
	})

	t.Run("agent that does not answer is an error", func(t *testing.T) {
		e := newEnv(t)
		sb := e.create(api.CreateSandbox{Name: "mute"})
		e.rt.Vanish(sb.ID)
		e.rt.SetNoAgent(true)
		e.cfg.BootTimeout = 200 * time.Millisecond
		must(t, e.restart())
		got, _ := e.m.Get(e.ctx, "mute")
		if rec := e.record(sb.ID); got.State != api.StateError || !strings.Contains(rec.Error, "waiting for the agent") {
			t.Errorf("state %s, error %q", got.State, rec.Error)
		}
		// Deleting it still frees everything.
		must(t, e.m.Delete(e.ctx, "mute"))
		e.requireGone(sb.ID)
	})

	t.Run("interrupted create is undone", func(t *testing.T) {
		e := newEnv(t)
		var id string
		crashAt(e, "start", func() { _, _ = e.m.Create(e.ctx, api.CreateSandbox{Name: "half"}) })
		all, _ := e.m.List(e.ctx, nil)
		if len(all) != 1 || all[0].State != api.StateCreating {
			t.Fatalf("before the restart: %+v", all)
		}
		id = all[0].ID
		if !slices.Contains(e.volumes(), id) || !e.nets.exists(id) {
			t.Fatal("the crashed create made no disk or network")
		}
		must(t, e.restart())
		e.requireGone(id)
		// Its name and address are free.
		sb := e.create(api.CreateSandbox{Name: "half"})
		if i := e.record(sb.ID).NetIndex; i != 0 {
			t.Errorf("net index %d, want 0", i)
		}
	})

	t.Run("interrupted delete is finished", func(t *testing.T) {
		e := newEnv(t)
		sb := e.create(api.CreateSandbox{Name: "doomed"})
		e.checkpoint("doomed", false)
		crashAt(e, "delete", func() { _ = e.m.Delete(e.ctx, "doomed") })
		if got, _ := e.m.Get(e.ctx, "doomed"); got.State != api.StateDeleting {
			t.Fatalf("before the restart: %+v", got)
		}
		must(t, e.restart())
		e.requireGone(sb.ID)
	})

	t.Run("paused container is resumed", func(t *testing.T) {
		e := newEnv(t)
		sb := e.create(api.CreateSandbox{Name: "frozen"})
		crashAt(e, "checkpoint", func() { _, _ = e.cps.CreateCheckpoint(e.ctx, "frozen", api.CreateCheckpoint{}) })
		if c, _ := e.rt.Get(sb.ID); c.Status != runtime.StatusPaused {
			t.Fatalf("before the restart the container is %s", c.Status)
		}
		must(t, e.restart())
		if got, want := e.rt.CallsOf(sb.ID), []string{"start", "pause", "checkpoint", "resume", "setlimits"}; !slices.Equal(got, want) {
			t.Errorf("runtime calls %v, want %v", got, want)
		}
		if got, _ := e.m.Get(e.ctx, "frozen"); got.State != api.StateRunning {
			t.Errorf("state %s", got.State)
		}
		e.agentAnswers(sb.ID)
		if ids := e.checkpointIDs("frozen"); len(ids) != 0 {
			t.Errorf("checkpoints %v", ids)
		}
		// The id the crashed checkpoint took is spent.
		if cp := e.checkpoint("frozen", true); cp.ID != "v2" {
			t.Errorf("next checkpoint %s, want v2", cp.ID)
		}
	})
}

// TestRecoverSweeps leaves what crashes between two steps leave behind,
// and checks that start-up removes it and keeps the rest.
func TestRecoverSweeps(t *testing.T) {
	e := newEnv(t)
	keep := e.create(api.CreateSandbox{Name: "keep"})
	e.checkpoint("keep", true)

	// A disk with no record (a create that crashed before storing it is
	// impossible, but a delete that crashed after removing it is not).
	const orphanVol = "sb-orphanvol0001"
	if _, err := e.pool.CreateVolume(e.ctx, orphanVol, tinyTemplate); err != nil {
		t.Fatal(err)
	}
	// A sandbox directory with a network and a container and no record.
	const orphan = "sb-orphandir001"
	if _, err := e.pool.CreateVolume(e.ctx, orphan, tinyTemplate); err != nil {
		t.Fatal(err)
	}
	must(t, os.MkdirAll(filepath.Join(e.sandboxDir(orphan), "bundle"), 0o700))
	ep, _ := e.nets.Endpoint(orphan, 0)
	must(t, e.nets.Create(e.ctx, ep))
	e.rt.SetNoAgent(true)
	must(t, e.rt.Start(e.ctx, runtime.Spec{
		ID: orphan, BundleDir: filepath.Join(e.sandboxDir(orphan), "bundle"),
		Rootfs: e.pool.VolumePath(orphan), Netns: ep.Netns,
		Env: []string{agent.EnvListen + "=" + agent.DefaultListen, agent.EnvToken + "=x"},
	}))
	e.rt.SetNoAgent(false)
	// Checkpoint data with no record: a checkpoint cut short in its
	// temporary directory, a finished one whose record was never stored, and
	// the checkpoints of a sandbox that is gone.
	cps := e.checkpointsDir(keep.ID)
	must(t, os.MkdirAll(filepath.Join(cps, ".tmp-v2-123456", "mem"), 0o700))
	must(t, os.WriteFile(filepath.Join(cps, ".tmp-v2-123456", "mem", fake.ImageFile), []byte("{}"), 0o600))
	must(t, os.MkdirAll(filepath.Join(cps, "v7", "mem"), 0o700))
	must(t, os.MkdirAll(filepath.Join(e.checkpointsDir("sb-gone00000000"), "v1", "mem"), 0o700))
	// A restore's staged disk, cloned while the state was being kept.
	if _, err := e.pool.CloneSnapshot(e.ctx, keep.ID+".v1", keep.ID+"-restoring"); err != nil {
		t.Fatal(err)
	}
	must(t, e.pool.Snapshot(e.ctx, keep.ID, keep.ID+".v7"))
	must(t, e.pool.Snapshot(e.ctx, keep.ID, "junk"))

	must(t, e.restart())

	if got := e.volumes(); !slices.Equal(got, []string{keep.ID}) {
		t.Errorf("volumes %v, want only %s", got, keep.ID)
	}
	if got := dirNames(t, filepath.Join(e.cfg.DataDir, "sandboxes")); !slices.Equal(got, []string{keep.ID}) {
		t.Errorf("sandbox directories %v", got)
	}
	if got := e.rt.IDs(); !slices.Equal(got, []string{keep.ID}) {
		t.Errorf("containers %v", got)
	}
	if e.nets.exists(orphan) {
		t.Error("the orphan's network is left")
	}
	if got := dirNames(t, filepath.Join(e.cfg.DataDir, "checkpoints")); !slices.Equal(got, []string{keep.ID}) {
		t.Errorf("checkpoint directories %v", got)
	}
	if got := dirNames(t, cps); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("checkpoints of keep on disk: %v, want [v1]", got)
	}
	if got := e.snapshots(); !slices.Equal(got, []string{keep.ID + ".v1"}) {
		t.Errorf("snapshots %v", got)
	}
	// What has a record is untouched.
	if got, _ := e.m.Get(e.ctx, "keep"); got.State != api.StateRunning {
		t.Errorf("keep is %s", got.State)
	}
	if got := e.rt.CallsOf(keep.ID); slices.Contains(got, "delete") {
		t.Errorf("keep's container was touched: %v", got)
	}
	e.agentAnswers(keep.ID)
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "keep", "v1"); err != nil {
		t.Errorf("restoring v1 after the sweep: %v", err)
	}
}

// TestRecoverDropsBrokenCheckpoints removes parts of checkpoints by hand
// and checks that start-up drops those checkpoints, whole.
func TestRecoverDropsBrokenCheckpoints(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "broken"})
	for _, memory := range []bool{true, false, true, false, true} {
		e.checkpoint("broken", memory)
	}
	cpDir := func(id string) string { return filepath.Join(e.checkpointsDir(sb.ID), id) }
	must(t, os.RemoveAll(filepath.Join(cpDir("v1"), "mem"))) // memory image lost
	must(t, e.pool.DeleteSnapshot(e.ctx, sb.ID+".v2"))       // disk snapshot lost
	must(t, os.RemoveAll(cpDir("v3")))                       // whole directory lost
	must(t, os.RemoveAll(cpDir("v4")))                       // a disk-only one's directory

	must(t, e.restart())
	if ids := e.checkpointIDs("broken"); !slices.Equal(ids, []string{"v5"}) {
		t.Errorf("checkpoints %v, want [v5]", ids)
	}
	if got := e.snapshots(); !slices.Equal(got, []string{sb.ID + ".v5"}) {
		t.Errorf("snapshots %v", got)
	}
	if got := dirNames(t, e.checkpointsDir(sb.ID)); !slices.Equal(got, []string{"v5"}) {
		t.Errorf("checkpoint directories %v", got)
	}
	if got, _ := e.m.Get(e.ctx, "broken"); got.State != api.StateRunning {
		t.Errorf("state %s", got.State)
	}
	if cp := e.checkpoint("broken", false); cp.ID != "v6" {
		t.Errorf("next checkpoint %s, want v6", cp.ID)
	}
}

// TestRecoverFinishesInterruptedRestore: a restore records itself (state
// restoring, and its target) before it changes anything, and a daemon that
// dies part-way finishes it at the next start: the sandbox ends up running
// the checkpoint's memory on the checkpoint's disk.
func TestRecoverFinishesInterruptedRestore(t *testing.T) {
	for _, crashOp := range []string{"delete", "restore"} {
		t.Run("crash at "+crashOp, func(t *testing.T) {
			e := newEnv(t)
			sb := e.create(api.CreateSandbox{Name: "undo"})
			e.writeVolume(sb.ID, "state.txt", "one")
			e.checkpoint("undo", true)
			e.writeVolume(sb.ID, "state.txt", "two")

			var seen *api.Sandbox
			crashAt(e, crashOp, func() {
				// The hook runs first: look at the record as it stands.
				e.rt.SetHook(func(o, id string) {
					if o == crashOp && id == sb.ID {
						seen, _ = e.m.Get(e.ctx, sb.ID)
						goruntime.Goexit()
					}
				})
				_, _ = e.cps.RestoreCheckpoint(e.ctx, "undo", "v1")
			})
			if seen == nil || seen.State != api.StateRestoring {
				t.Fatalf("during the restore the sandbox is %+v, want restoring", seen)
			}
			if rec := e.record(sb.ID); rec.State != api.StateRestoring || rec.RestoreTarget != "v1" {
				t.Fatalf("after the crash: state %s, target %q", rec.State, rec.RestoreTarget)
			}
			e.rt.SetHook(nil)
			must(t, e.restart())
			rec := e.record(sb.ID)
			if rec.State != api.StateRunning || rec.RestoreTarget != "" || rec.Error != "" {
				t.Errorf("after recovery: %+v", rec)
			}
			if c, _ := e.rt.Get(sb.ID); c.From != sb.ID || c.Status != runtime.StatusRunning {
				t.Errorf("container after recovery: from %q, %s; want restored from %s", c.From, c.Status, sb.ID)
			}
			if s := e.readVolume(sb.ID, "state.txt"); s != "one" {
				t.Errorf("disk after recovery %q, want one", s)
			}
			e.agentAnswers(sb.ID)
			if ids := e.checkpointIDs("undo"); !slices.Equal(ids, []string{"v1", "auto-1"}) {
				t.Errorf("checkpoints %v", ids)
			}
		})
	}
}

// TestRecoverRestoreCutWhileKeepingState: a restore of a running sandbox
// keeps its state with the checkpoint that stops it. A crash before that
// checkpoint leaves it running; one after it, before the automatic
// checkpoint is stored, leaves it stopped on its disk, untouched. A
// restart takes the first back as it runs (its agent answers), and boots
// the second again on that disk; either answers to its own token only,
// with no automatic checkpoint visible, nothing left of the one cut short
// (image, snapshot, staged disk), and the restore not done.
func TestRecoverRestoreCutWhileKeepingState(t *testing.T) {
	for _, at := range []string{"before the checkpoint", "after the checkpoint"} {
		t.Run(at, func(t *testing.T) {
			e := newEnv(t)
			sb := e.create(api.CreateSandbox{Name: "keep"})
			e.writeVolume(sb.ID, "state.txt", "one")
			e.checkpoint("keep", true)
			e.writeVolume(sb.ID, "state.txt", "two")
			heldBefore := e.token(sb.ID)

			done := make(chan struct{})
			go func() {
				defer close(done)
				stop := func(o, id string) {
					if o == "checkpoint" && id == sb.ID {
						goruntime.Goexit()
					}
				}
				if at == "before the checkpoint" {
					e.rt.SetHook(stop)
				} else {
					e.rt.SetAfter(stop)
				}
				_, _ = e.cps.RestoreCheckpoint(e.ctx, "keep", "v1")
				t.Errorf("no crash")
			}()
			<-done
			e.rt.SetHook(nil)
			e.rt.SetAfter(nil)
			want := runtime.StatusRunning
			if at == "after the checkpoint" {
				want = runtime.StatusStopped
			}
			if c, _ := e.rt.Get(sb.ID); c.Status != want {
				t.Fatalf("after the crash the container is %s, want %s", c.Status, want)
			}
			if rec := e.record(sb.ID); rec.State != api.StateRunning || rec.RestoreTarget != "v1" {
				t.Fatalf("after the crash: state %s, target %q; want running, v1", rec.State, rec.RestoreTarget)
			}

			must(t, e.restart())
			if rec := e.record(sb.ID); rec.State != api.StateRunning || rec.Error != "" || rec.RestoreTarget != "" {
				t.Errorf("after recovery: %+v", rec)
			}
			got := e.rt.CallsOf(sb.ID)
			if at == "after the checkpoint" && !slices.Equal(got[len(got)-2:], []string{"delete", "start"}) {
				t.Errorf("runtime calls %v, want a delete and a start last (booted again)", got)
			}
			if at == "before the checkpoint" && slices.Contains(got, "delete") {
				t.Errorf("runtime calls %v: the running sandbox was deleted, want it taken back", got)
			}
			if c, _ := e.rt.Get(sb.ID); c.Status != runtime.StatusRunning || c.From != "" {
				t.Errorf("container after recovery: %s, from %q", c.Status, c.From)
			}
			if s := e.readVolume(sb.ID, "state.txt"); s != "two" {
				t.Errorf("disk after recovery %q, want two (untouched)", s)
			}
			if ids := e.checkpointIDs("keep"); !slices.Equal(ids, []string{"v1"}) {
				t.Errorf("checkpoints %v, want [v1]", ids)
			}
			if got := e.snapshots(); !slices.Equal(got, []string{sb.ID + ".v1"}) {
				t.Errorf("snapshots %v", got)
			}
			if got := e.volumes(); !slices.Equal(got, []string{sb.ID}) {
				t.Errorf("volumes %v, want only %s", got, sb.ID)
			}
			if got := dirNames(t, e.checkpointsDir(sb.ID)); !slices.Equal(got, []string{"v1"}) {
				t.Errorf("checkpoint data %v, want [v1]", got)
			}
			if at == "after the checkpoint" {
				// The lost image held this token: no longer the sandbox's.
				e.agentAnswers(sb.ID, heldBefore)
			} else {
				e.agentAnswers(sb.ID)
			}
			// The restore can be asked for again, and undone.
			if _, err := e.cps.RestoreCheckpoint(e.ctx, "keep", "v1"); err != nil {
				t.Fatal(err)
			}
			if s := e.readVolume(sb.ID, "state.txt"); s != "one" {
				t.Errorf("disk after the restore %q, want one", s)
			}
			e.agentAnswers(sb.ID)
		})
	}
}

// TestRecoverRestoreWithoutItsCheckpoint: when the checkpoint of a restore
// cut short is gone too, the sandbox is left in error, saying why, and can
// be restored to another checkpoint.
func TestRecoverRestoreWithoutItsCheckpoint(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "lost"})
	e.writeVolume(sb.ID, "state.txt", "one")
	e.checkpoint("lost", false)
	e.writeVolume(sb.ID, "state.txt", "two")
	e.checkpoint("lost", true)
	crashAt(e, "delete", func() { _, _ = e.cps.RestoreCheckpoint(e.ctx, "lost", "v2") })
	e.rt.SetHook(nil)
	must(t, e.st.DeleteCheckpoint(e.ctx, sb.ID, "v2"))

	must(t, e.restart())
	rec := e.record(sb.ID)
	if rec.State != api.StateError || !strings.Contains(rec.Error, "v2") {
		t.Fatalf("after recovery: state %s, error %q", rec.State, rec.Error)
	}
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "lost", "v1"); err != nil {
		t.Fatalf("restoring another checkpoint: %v", err)
	}
	if s := e.readVolume(sb.ID, "state.txt"); s != "one" {
		t.Errorf("disk %q, want one", s)
	}
	e.agentAnswers(sb.ID)
}

// TestCheckpointsSurviveAMovedDataDir: checkpoints are found from their ids,
// not from paths stored at the time, so a data dir that moved (or is
// reached through another path) keeps every checkpoint, and each can be
// restored.
func TestCheckpointsSurviveAMovedDataDir(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "mover"})
	e.writeVolume(sb.ID, "state.txt", "one")
	e.checkpoint("mover", true)
	e.checkpoint("mover", false)

	// The host "reboots" into a data dir at another path.
	e.rt.Vanish(sb.ID)
	moved := filepath.Join(t.TempDir(), "moved")
	must(t, os.Rename(e.cfg.DataDir, moved))
	e.cfg.DataDir = moved
	must(t, e.restart())

	if ids := e.checkpointIDs("mover"); !slices.Equal(ids, []string{"v1", "v2"}) {
		t.Fatalf("checkpoints after the move %v, want [v1 v2]", ids)
	}
	e.writeVolume(sb.ID, "state.txt", "two")
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "mover", "v1"); err != nil {
		t.Fatalf("restoring v1 after the move: %v", err)
	}
	if s := e.readVolume(sb.ID, "state.txt"); s != "one" {
		t.Errorf("disk %q, want one", s)
	}
	if _, err := os.Stat(filepath.Join(moved, "checkpoints", sb.ID, "v1", "mem")); err != nil {
		t.Errorf("v1's memory image: %v", err)
	}
}

// TestRecoverKeepsCheckpointsItCannotCheck: data that cannot be read for a
// reason other than its absence (here a path that is not a directory) is
// not taken for lost: the checkpoint stays.
func TestRecoverKeepsCheckpointsItCannotCheck(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "odd"})
	e.checkpoint("odd", true)
	dir := e.checkpointsDir(sb.ID)
	hidden := dir + ".hidden"
	must(t, os.Rename(dir, hidden))
	must(t, os.WriteFile(dir, nil, 0o600)) // stat of dir/v1/mem: not a directory
	if err := e.restart(); err == nil {
		t.Error("recovery did not report the checkpoint it could not check")
	}
	must(t, os.Remove(dir))
	must(t, os.Rename(hidden, dir))
	if ids := e.checkpointIDs("odd"); !slices.Equal(ids, []string{"v1"}) {
		t.Errorf("checkpoints %v, want [v1]", ids)
	}
}

// TestRecoverLegacyToken: a sandbox made by a loam that stored its agent's
// token in clear (schema version 1) is taken back with that token, moved to
// a derived one, and the stored one is forgotten.
func TestRecoverLegacyToken(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "old"})
	rec := e.record(sb.ID)
	// Its agent holds a token the daemon would not derive now.
	rec.LegacyAgentToken, rec.AgentGen = e.token(sb.ID), 5
	must(t, e.st.UpdateSandbox(e.ctx, rec))
	must(t, e.restart())
	rec = e.record(sb.ID)
	if rec.State != api.StateRunning || rec.LegacyAgentToken != "" {
		t.Fatalf("after recovery: %+v", rec)
	}
	e.agentAnswers(sb.ID, sandbox.AgentToken(e.cfg.Secret, sb.ID, 0))
}
