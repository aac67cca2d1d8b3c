package runtimetest

import (
	"errors"
	"io/fs"
	"path/filepath"
	"testing"
	"time"

	"loam.dev/loam/internal/runtime"
)

// errCaller is what the suite's callbacks fail with.
var errCaller = errors.New("runtimetest: the caller's work failed")

// testStartStateDelete: a started container runs its agent, detached; its
// id is taken until Delete, which is idempotent and frees it.
func testStartStateDelete(t *testing.T, e *env) {
	const id = "sb-rtclife0000"
	e.wantGone(id)
	b := e.started(id)
	b.wantState(runtime.StatusRunning)
	b.wantRefused(1)

	if err := e.Runtime.Start(e.ctx, b.Spec); !errors.Is(err, runtime.ErrExist) {
		t.Errorf("Start of an id that runs: %v, want ErrExist", err)
	}
	b.wantState(runtime.StatusRunning)
	b.wantAnswer(0)

	for i := range 2 {
		if err := e.Runtime.Delete(e.ctx, id); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	e.wantGone(id)
	b.wantSilent()

	// The id is free again (the namespace readied again, as before
	// every start into one that was used: runsc's netstack took its
	// addresses).
	b.prepare()
	if err := e.Runtime.Start(e.ctx, b.Spec); err != nil {
		t.Fatalf("Start after Delete: %v", err)
	}
	b.wantState(runtime.StatusRunning)
	b.wantAnswer(0)
}

// testUnknownID: every call on an id the runtime does not have is
// ErrNotExist, but Delete, which does nothing; a checkpoint of it writes
// nothing.
func testUnknownID(t *testing.T, e *env) {
	const id = "sb-rtcnone0000"
	ctx := e.ctx
	if _, err := e.Runtime.State(ctx, id); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("State: %v, want ErrNotExist", err)
	}
	if err := e.Runtime.Pause(ctx, id); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("Pause: %v, want ErrNotExist", err)
	}
	if err := e.Runtime.Resume(ctx, id); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("Resume: %v, want ErrNotExist", err)
	}
	if err := e.Runtime.SetLimits(ctx, id, runtime.Limits{CPUs: 1}); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("SetLimits: %v, want ErrNotExist", err)
	}
	img := e.imageDir()
	var flushed counter
	if err := e.Runtime.Checkpoint(ctx, id, img, runtime.CheckpointOptions{Flushed: flushed.call}); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("Checkpoint: %v, want ErrNotExist", err)
	}
	flushed.want(t, "Flushed of a failed checkpoint", 0)
	e.wantNoDir(img)
	if hc, ok := e.Runtime.(runtime.HeldCheckpointer); ok {
		var paused counter
		if err := hc.CheckpointHeld(ctx, id, img, paused.call); !errors.Is(err, runtime.ErrNotExist) {
			t.Errorf("CheckpointHeld: %v, want ErrNotExist", err)
		}
		paused.want(t, "whilePaused of a failed checkpoint", 0)
		e.wantNoDir(img)
	}
	if err := e.Runtime.Delete(ctx, id); err != nil {
		t.Errorf("Delete: %v, want nil", err)
	}
	e.wantGone(id)
}

// testStartFailure: a Start that fails leaves no container, and its id free.
func testStartFailure(t *testing.T, e *env) {
	const id = "sb-rtcfail0000"
	b := e.sandbox(id)
	good := b.Spec.Rootfs
	b.Spec.Rootfs = filepath.Join(t.TempDir(), "missing")
	if err := e.Runtime.Start(e.ctx, b.Spec); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Start with a missing rootfs: %v, want fs.ErrNotExist", err)
	}
	e.wantGone(id)
	b.Spec.Rootfs = good
	b.prepare()
	if err := e.Runtime.Start(e.ctx, b.Spec); err != nil {
		t.Fatalf("Start after a failed one: %v", err)
	}
	b.wantAnswer(0)
}

// testPauseResume: a paused container keeps its state but does not answer;
// pausing twice or resuming a running one is an error that changes
// nothing; a paused container can be deleted.
func testPauseResume(t *testing.T, e *env) {
	b := e.started("sb-rtcpause000")
	b.rotate()
	if err := e.Runtime.Pause(e.ctx, b.id()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	b.wantState(runtime.StatusPaused)
	b.wantSilent()
	if err := e.Runtime.Pause(e.ctx, b.id()); err == nil {
		t.Error("Pause of a paused container: nil error, want one")
	}
	b.wantState(runtime.StatusPaused)

	if err := e.Runtime.Resume(e.ctx, b.id()); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	b.wantState(runtime.StatusRunning)
	b.wantAnswer(1)
	if err := e.Runtime.Resume(e.ctx, b.id()); err == nil {
		t.Error("Resume of a running container: nil error, want one")
	}
	b.wantState(runtime.StatusRunning)
	b.wantAnswer(1)

	if err := e.Runtime.Pause(e.ctx, b.id()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := e.Runtime.Delete(e.ctx, b.id()); err != nil {
		t.Fatalf("Delete of a paused container: %v", err)
	}
	e.wantGone(b.id())
}

// testSetLimits: limits can be set, lifted and set again on a running or a
// paused container, which goes on as it was.
func testSetLimits(t *testing.T, e *env) {
	b := e.sandbox("sb-rtclimit000")
	b.Spec.CPUs, b.Spec.MemoryMiB = 1, 512
	if err := e.Runtime.Start(e.ctx, b.Spec); err != nil {
		t.Fatalf("Start with limits: %v", err)
	}
	b.wantAnswer(0)
	for _, l := range []runtime.Limits{{CPUs: 0.5, MemoryMiB: 256}, {}, b.Spec.Limits()} {
		if err := e.Runtime.SetLimits(e.ctx, b.id(), l); err != nil {
			t.Errorf("SetLimits(%+v) of a running container: %v", l, err)
		}
		if err := e.Runtime.SetLimits(e.ctx, b.id(), l); err != nil {
			t.Errorf("SetLimits(%+v) again: %v", l, err)
		}
	}
	b.wantAnswer(0)
	if err := e.Runtime.Pause(e.ctx, b.id()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := e.Runtime.SetLimits(e.ctx, b.id(), runtime.Limits{CPUs: 2, MemoryMiB: 512}); err != nil {
		t.Errorf("SetLimits of a paused container: %v", err)
	}
	b.wantState(runtime.StatusPaused)
	if err := e.Runtime.Resume(e.ctx, b.id()); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	b.wantAnswer(0)
}

// testCheckpointLeaveRunning: a checkpoint that leaves the container
// running writes an image, calls Flushed once, and the agent goes on as it
// was; one into a directory that exists fails and changes nothing;
// Flushed's error is Checkpoint's.
func testCheckpointLeaveRunning(t *testing.T, e *env) {
	b := e.started("sb-rtcleave000")
	b.rotate()
	img := e.imageDir()
	var flushed counter
	if err := e.Runtime.Checkpoint(e.ctx, b.id(), img, runtime.CheckpointOptions{LeaveRunning: true, Flushed: flushed.call}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	flushed.want(t, "Flushed", 1)
	e.wantImage(img)
	b.wantState(runtime.StatusRunning)
	b.wantAnswer(1)

	err := e.Runtime.Checkpoint(e.ctx, b.id(), img, runtime.CheckpointOptions{LeaveRunning: true})
	if !errors.Is(err, fs.ErrExist) {
		t.Errorf("Checkpoint into a directory that exists: %v, want fs.ErrExist", err)
	}
	e.wantImage(img)
	b.wantState(runtime.StatusRunning)
	b.wantAnswer(1)

	img2 := e.imageDir()
	failing := counter{check: func() error { return errCaller }}
	err = e.Runtime.Checkpoint(e.ctx, b.id(), img2, runtime.CheckpointOptions{LeaveRunning: true, Flushed: failing.call})
	if !errors.Is(err, errCaller) {
		t.Errorf("Checkpoint whose Flushed fails: %v, want Flushed's error", err)
	}
	failing.want(t, "Flushed", 1)
	b.wantState(runtime.StatusRunning)
	b.wantAnswer(1)
}

// testCheckpointWhilePaused: the caller's own held checkpoint (pause,
// checkpoint leaving it running, its work, resume): the container stays
// paused through the checkpoint, Flushed sees it so, and the image forks.
func testCheckpointWhilePaused(t *testing.T, e *env) {
	b := e.started("sb-rtcpaused00")
	b.rotate()
	if err := e.Runtime.Pause(e.ctx, b.id()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	img := e.imageDir()
	flushed := counter{check: b.silent}
	if err := e.Runtime.Checkpoint(e.ctx, b.id(), img, runtime.CheckpointOptions{LeaveRunning: true, Flushed: flushed.call}); err != nil {
		t.Fatalf("Checkpoint of a paused container: %v", err)
	}
	flushed.want(t, "Flushed", 1)
	b.wantState(runtime.StatusPaused)
	b.wantSilent()
	if err := e.Runtime.Resume(e.ctx, b.id()); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	b.wantAnswer(1)

	f := e.sandbox("sb-rtcpausedf0")
	if err := e.Runtime.Restore(e.ctx, f.Spec, img); err != nil {
		t.Fatalf("Restore of the paused container's image: %v", err)
	}
	f.forkOf(b)
	f.wantAnswer(1)
	f.wantState(runtime.StatusRunning)
}

// testCheckpointStops: a checkpoint that does not leave the container
// running stops it: its agent is silent from Flushed on, and only Delete is
// left to do (the id stays taken until then). Restored into the same id,
// the agent goes on from its memory: the token it was handed, not its
// spec's.
func testCheckpointStops(t *testing.T, e *env) {
	b := e.started("sb-rtcstop0000")
	b.rotate()
	img := e.imageDir()
	flushed := counter{check: b.silent}
	if err := e.Runtime.Checkpoint(e.ctx, b.id(), img, runtime.CheckpointOptions{Flushed: flushed.call}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	flushed.want(t, "Flushed", 1)
	e.wantImage(img)
	b.wantSilent()
	// runsc goes on reporting the container running while its sandbox
	// exits; it is stopped soon after, and never paused or gone. Nothing
	// tells when but State, so State is polled.
	for deadline := time.Now().Add(stopTimeout); ; time.Sleep(100 * time.Millisecond) {
		st, err := e.Runtime.State(e.ctx, b.id())
		if err != nil || (st != runtime.StatusRunning && st != runtime.StatusStopped) {
			t.Fatalf("State after the checkpoint = %q, %v; want running, then stopped", st, err)
		}
		if st == runtime.StatusStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still running %s after the checkpoint", stopTimeout)
		}
	}
	b.wantSilent()
	// A stopped container has nothing to pause or checkpoint.
	if err := e.Runtime.Pause(e.ctx, b.id()); err == nil {
		t.Error("Pause of a stopped container: nil error, want one")
	}
	img2 := e.imageDir()
	if err := e.Runtime.Checkpoint(e.ctx, b.id(), img2, runtime.CheckpointOptions{LeaveRunning: true}); err == nil {
		t.Error("Checkpoint of a stopped container: nil error, want one")
	}
	e.wantNoDir(img2)
	b.wantState(runtime.StatusStopped)
	if err := e.Runtime.Restore(e.ctx, b.Spec, img); !errors.Is(err, runtime.ErrExist) {
		t.Errorf("Restore onto the id before Delete: %v, want ErrExist", err)
	}
	if err := e.Runtime.Delete(e.ctx, b.id()); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	e.wantGone(b.id())

	b.prepare()
	if err := e.Runtime.Restore(e.ctx, b.Spec, img); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	b.wantState(runtime.StatusRunning)
	b.wantAnswer(1)
	b.wantRefused(0)
}

// testFork: an image of a running container restores into a new id and
// namespace, as many times as asked, with a CPU quota of its own; the
// copies hold the original's memory and then go each its own way, and
// outlive it.
func testFork(t *testing.T, e *env) {
	a := e.sandbox("sb-rtcforka000")
	a.Spec.MemoryMiB = 512
	if err := e.Runtime.Start(e.ctx, a.Spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	a.wantAnswer(0)
	a.rotate()
	img := e.imageDir()
	if err := e.Runtime.Checkpoint(e.ctx, a.id(), img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if err := e.Runtime.Restore(e.ctx, a.Spec, img); !errors.Is(err, runtime.ErrExist) {
		t.Errorf("Restore onto a running id: %v, want ErrExist", err)
	}
	a.wantAnswer(1)

	var forks []*box
	for _, id := range []string{"sb-rtcforkb000", "sb-rtcforkc000"} {
		f := e.sandbox(id)
		f.Spec.CPUs, f.Spec.MemoryMiB = 0.5, a.Spec.MemoryMiB
		if err := e.Runtime.Restore(e.ctx, f.Spec, img); err != nil {
			t.Fatalf("Restore as %s: %v", id, err)
		}
		f.wantState(runtime.StatusRunning)
		// The fork's agent holds the original's token: its memory.
		f.forkOf(a)
		f.wantAnswer(1)
		forks = append(forks, f)
	}
	a.wantAnswer(1)

	// Each goes its own way: the original's token changes, the forks' not.
	a.rotate()
	for _, f := range forks {
		f.wantAnswer(1)
	}
	if err := e.Runtime.Delete(e.ctx, a.id()); err != nil {
		t.Fatalf("Delete of the original: %v", err)
	}
	for _, f := range forks {
		f.wantAnswer(1)
		f.wantState(runtime.StatusRunning)
	}
}

// testRestoreFailure: a Restore from no image, or from a directory that
// holds none, fails and leaves no container.
func testRestoreFailure(t *testing.T, e *env) {
	b := e.sandbox("sb-rtcnoimg000")
	missing := filepath.Join(t.TempDir(), "missing")
	if err := e.Runtime.Restore(e.ctx, b.Spec, missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Restore from a missing image: %v, want fs.ErrNotExist", err)
	}
	e.wantGone(b.id())
	empty := t.TempDir()
	if err := e.Runtime.Restore(e.ctx, b.Spec, empty); err == nil {
		t.Error("Restore from an empty directory: nil error, want one")
	}
	e.wantGone(b.id())
	b.prepare()
	if err := e.Runtime.Start(e.ctx, b.Spec); err != nil {
		t.Fatalf("Start after failed restores: %v", err)
	}
	b.wantAnswer(0)
}

// testRestoreOtherMemory: a restore whose memory limit is not the image's
// fails and leaves no container. runsc refuses a spec whose rlimits differ
// from the image's, and RLIMIT_NPROC follows the memory limit (see
// gvisor's processes), so a fork or a wake keeps the checkpoint's memory.
func testRestoreOtherMemory(t *testing.T, e *env) {
	a := e.sandbox("sb-rtcmema0000")
	a.Spec.MemoryMiB = 512
	if err := e.Runtime.Start(e.ctx, a.Spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	a.wantAnswer(0)
	img := e.imageDir()
	if err := e.Runtime.Checkpoint(e.ctx, a.id(), img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	f := e.sandbox("sb-rtcmemb0000")
	f.Spec.MemoryMiB = 1024
	if err := e.Runtime.Restore(e.ctx, f.Spec, img); err == nil {
		t.Errorf("Restore with %d MiB of an image of %d MiB: nil error, want one", f.Spec.MemoryMiB, a.Spec.MemoryMiB)
	}
	e.wantGone(f.id())
	f.prepare()
	f.Spec.MemoryMiB = a.Spec.MemoryMiB
	if err := e.Runtime.Restore(e.ctx, f.Spec, img); err != nil {
		t.Fatalf("Restore with the image's memory: %v", err)
	}
	f.forkOf(a)
	f.wantAnswer(0)
}

// testCheckpointHeld: a held checkpoint pauses the container, calls
// whilePaused once with it paused, and resumes it; the image restores.
func testCheckpointHeld(t *testing.T, e *env) {
	hc := e.held()
	b := e.started("sb-rtcheld0000")
	b.rotate()
	img := e.imageDir()
	paused := counter{check: func() error {
		if st, err := e.Runtime.State(e.ctx, b.id()); err != nil || st != runtime.StatusPaused {
			t.Errorf("State in whilePaused = %q, %v; want paused", st, err)
		}
		return b.silent()
	}}
	if err := hc.CheckpointHeld(e.ctx, b.id(), img, paused.call); err != nil {
		t.Fatalf("CheckpointHeld: %v", err)
	}
	paused.want(t, "whilePaused", 1)
	e.wantImage(img)
	b.wantState(runtime.StatusRunning)
	b.wantAnswer(1)

	if err := hc.CheckpointHeld(e.ctx, b.id(), img, paused.call); !errors.Is(err, fs.ErrExist) {
		t.Errorf("CheckpointHeld into a directory that exists: %v, want fs.ErrExist", err)
	}
	paused.want(t, "whilePaused", 1)
	b.wantState(runtime.StatusRunning)

	f := e.sandbox("sb-rtcheldf000")
	if err := e.Runtime.Restore(e.ctx, f.Spec, img); err != nil {
		t.Fatalf("Restore of a held checkpoint's image: %v", err)
	}
	f.forkOf(b)
	f.wantAnswer(1)
}

// testCheckpointHeldFailure: when whilePaused fails, CheckpointHeld fails
// with its error, removes the image and leaves the container running.
func testCheckpointHeldFailure(t *testing.T, e *env) {
	hc := e.held()
	b := e.started("sb-rtcheldx000")
	img := e.imageDir()
	failing := counter{check: func() error { return errCaller }}
	if err := hc.CheckpointHeld(e.ctx, b.id(), img, failing.call); !errors.Is(err, errCaller) {
		t.Errorf("CheckpointHeld whose work fails: %v, want its error", err)
	}
	failing.want(t, "whilePaused", 1)
	e.wantNoDir(img)
	b.wantState(runtime.StatusRunning)
	b.wantAnswer(0)
}
