package gvisor

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"loam.dev/loam/internal/runtime"
)

// TestCheckpointHeld: the container is paused while whilePaused runs and
// running after, with its quota back; a failing whilePaused still resumes
// it and leaves no image; and the image restores.
func TestCheckpointHeld(t *testing.T) {
	e := newEnv(t)
	if !e.rt.holdPaused {
		t.Errorf("runsc %s has no checkpoint %s (tools/runsc/patches/0002): CheckpointHeld takes three runsc commands", e.runsc, holdPausedFlag)
	}
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestheld00", 9)
	sb.spec.CPUs = 0.5
	if err := e.rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	sb.ask(t)
	img := filepath.Join(t.TempDir(), "img")
	calls := 0
	err := e.rt.CheckpointHeld(ctx, sb.spec.ID, img, func() error {
		calls++
		e.wantState(t, sb.spec.ID, runtime.StatusPaused)
		if _, err := os.Stat(filepath.Join(img, "checkpoint.img")); err != nil {
			t.Errorf("image while paused: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("CheckpointHeld: %v", err)
	}
	if calls != 1 {
		t.Errorf("whilePaused called %d times, want 1", calls)
	}
	// loam's runsc says "synced" before "saved": the disk snapshot runs
	// while the memory is written, not after.
	if n := e.rt.overlapped.Load(); n != 1 {
		t.Errorf("checkpoints whose whilePaused ran from \"synced\": %d, want 1 (tools/runsc/patches/0002)", n)
	}
	e.wantState(t, sb.spec.ID, runtime.StatusRunning)
	if q, err := cpuQuota(sb.spec.ID); err != nil || q != 0.5 {
		t.Errorf("CPU quota after a checkpoint = %g, %v; want 0.5", q, err)
	}
	if r := sb.ask(t); r.N != 2 {
		t.Errorf("after checkpoint n = %d, want 2", r.N)
	}
	if err := e.rt.CheckpointHeld(ctx, sb.spec.ID, img, func() error { return nil }); !errors.Is(err, os.ErrExist) {
		t.Errorf("CheckpointHeld into an existing directory: %v, want ErrExist", err)
	}

	// A whilePaused that fails: resumed all the same, no image left.
	img2 := filepath.Join(t.TempDir(), "img")
	boom := errors.New("snapshot failed")
	err = e.rt.CheckpointHeld(ctx, sb.spec.ID, img2, func() error {
		e.wantState(t, sb.spec.ID, runtime.StatusPaused)
		return boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("CheckpointHeld with a failing whilePaused: %v, want %v", err, boom)
	}
	e.wantState(t, sb.spec.ID, runtime.StatusRunning)
	if _, err := os.Stat(img2); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("image of a failed checkpoint: %v, want it removed", err)
	}
	if r := sb.ask(t); r.N != 3 {
		t.Errorf("after a failed checkpoint n = %d, want 3", r.N)
	}

	// The first image restores: the counter goes on from it.
	if err := e.rt.Delete(ctx, sb.spec.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	sb.prepare(t)
	if err := e.rt.Restore(ctx, sb.spec, img); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	e.wantState(t, sb.spec.ID, runtime.StatusRunning)
	if r := sb.ask(t); r.N != 2 {
		t.Errorf("restored n = %d, want 2", r.N)
	}
	checkNoChildren(t)
}

// TestCheckpointHoldPausedCallerGone drives the patched runsc checkpoint
// -hold-paused directly: a caller that goes away (its end of stdin closed,
// no byte written) leaves the container running; and a resume by someone
// else meanwhile (a restarted daemon's recovery) is not done twice, which
// would kill the sandbox.
func TestCheckpointHoldPausedCallerGone(t *testing.T) {
	e := newEnv(t)
	if !e.rt.holdPaused {
		t.Fatalf("runsc %s has no checkpoint %s (tools/runsc/patches/0002)", e.runsc, holdPausedFlag)
	}
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestheld01", 10)
	if err := e.rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	sb.ask(t)
	for i, resumeMeanwhile := range []bool{false, true} {
		img := filepath.Join(t.TempDir(), "img")
		cmd := e.rt.command(ctx, nil, "checkpoint", "-direct", "-leave-running", holdPausedFlag, "-image-path", img, sb.spec.ID)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// "synced" first (the disk is flushed), then "saved".
		rd := bufio.NewReader(stdout)
		for _, want := range []string{syncedLine, savedLine} {
			line, err := rd.ReadString('\n')
			if line != want+"\n" {
				t.Fatalf("runsc checkpoint %s said %q, %v; want %q", holdPausedFlag, line, err, want)
			}
		}
		e.wantState(t, sb.spec.ID, runtime.StatusPaused)
		if resumeMeanwhile {
			if err := e.rt.Resume(ctx, sb.spec.ID); err != nil {
				t.Fatalf("Resume while held: %v", err)
			}
		}
		stdin.Close() // the caller is gone
		if err := cmd.Wait(); err != nil {
			t.Errorf("runsc checkpoint %s after its caller went: %v", holdPausedFlag, err)
		}
		e.wantState(t, sb.spec.ID, runtime.StatusRunning)
		if r := sb.ask(t); r.N != i+2 {
			t.Errorf("after the caller went (resumed meanwhile: %v) n = %d, want %d", resumeMeanwhile, r.N, i+2)
		}
	}
	checkNoChildren(t)
}

// TestCheckpointFlushed: a checkpoint that stops the container calls
// Flushed from runsc's "synced", while the memory is written, with the
// container no longer running; a failing Flushed fails the checkpoint; and
// the image restores.
func TestCheckpointFlushed(t *testing.T) {
	e := newEnv(t)
	if !e.rt.synced {
		t.Errorf("runsc %s has no checkpoint %s (tools/runsc/patches/0002)", e.runsc, syncedFlag)
	}
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestflush0", 11)
	if err := e.rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	sb.ask(t)
	img := filepath.Join(t.TempDir(), "img")
	calls := 0
	before := e.rt.overlapped.Load()
	err := e.rt.Checkpoint(ctx, sb.spec.ID, img, runtime.CheckpointOptions{Flushed: func() error {
		calls++
		if _, err := os.Stat(filepath.Join(img, "checkpoint.img")); err != nil {
			t.Errorf("image while flushed: %v", err)
		}
		return nil
	}})
	if err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if calls != 1 {
		t.Errorf("Flushed called %d times, want 1", calls)
	}
	if n := e.rt.overlapped.Load() - before; n != 1 {
		t.Errorf("checkpoints whose Flushed ran from \"synced\": %d, want 1", n)
	}
	if err := e.rt.Delete(ctx, sb.spec.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	sb.prepare(t)
	if err := e.rt.Restore(ctx, sb.spec, img); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if r := sb.ask(t); r.N != 2 {
		t.Errorf("restored n = %d, want 2", r.N)
	}

	// A Flushed that fails fails the checkpoint, which keeps its image
	// (the save itself succeeded) for the caller to drop.
	boom := errors.New("snapshot failed")
	img2 := filepath.Join(t.TempDir(), "img")
	if err := e.rt.Checkpoint(ctx, sb.spec.ID, img2, runtime.CheckpointOptions{Flushed: func() error { return boom }}); !errors.Is(err, boom) {
		t.Errorf("Checkpoint with a failing Flushed: %v, want %v", err, boom)
	}
	checkNoChildren(t)
}

// TestImageKeepsItsAgent: a memory image names the agent binary its
// container ran, and a restore runs that one whatever the spec says: an
// upgrade must not put a new binary under an old memory image.
func TestImageKeepsItsAgent(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestagent0", 12)
	// The container's agent is a copy of the counter under a path of its
	// own: "the binary of the day" when the image is made.
	old := filepath.Join(t.TempDir(), "loam-old")
	b, err := os.ReadFile(sb.spec.AgentBinary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(old, b, 0o755); err != nil {
		t.Fatal(err)
	}
	sb.spec.AgentBinary = old
	if err := e.rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	sb.ask(t)
	for _, leaveRunning := range []bool{true, false} {
		img := filepath.Join(t.TempDir(), "img")
		var err error
		if leaveRunning {
			err = e.rt.CheckpointHeld(ctx, sb.spec.ID, img, func() error { return nil })
		} else {
			err = e.rt.Checkpoint(ctx, sb.spec.ID, img, runtime.CheckpointOptions{})
		}
		if err != nil {
			t.Fatalf("checkpoint (leave running %v): %v", leaveRunning, err)
		}
		if got := e.rt.imageAgent(img); got != old {
			t.Errorf("the image (leave running %v) names agent %q, want %q", leaveRunning, got, old)
		}
		if leaveRunning {
			continue
		}
		if err := e.rt.Delete(ctx, sb.spec.ID); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		// Restored with a spec naming today's binary: it runs the old.
		sb.spec.AgentBinary = agentPath
		sb.prepare(t)
		if err := e.rt.Restore(ctx, sb.spec, img); err != nil {
			t.Fatalf("Restore: %v", err)
		}
		if got, err := e.rt.agentBinary(sb.spec.ID); err != nil || got != old {
			t.Errorf("restored container runs agent %q, %v; want %q", got, err, old)
		}
		sb.ask(t)
	}
}
