package checkpoints

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/store"
)

// take says which checkpoint Service.take takes.
type take struct {
	id, name, comment string
	memory            bool // memory and disk, or the disk alone
	auto              bool // kept by a restore, not asked for
	inside            bool // asked for by the sandbox itself (see api.Checkpoint.Inside)
	// stop leaves a running sandbox stopped by its memory checkpoint (a
	// restore's automatic one, whose sandbox is replaced next): one
	// runsc checkpoint, no resume, and no token to hand over.
	stop bool
	// op is the operation the caller claimed the sandbox for: a call the
	// checkpoint makes to its agent is made for it.
	op sandbox.Op
}

// requireSpace refuses a checkpoint of sb up front when the data dir
// cannot hold it: better a clear refusal now than a sandbox paused while
// runsc writes an image that cannot fit.
func (s *Service) requireSpace(sb *store.Sandbox, memory bool) error {
	what := "a disk-only checkpoint"
	if memory {
		what = "a memory checkpoint"
	}
	return disk.RequireSpace(s.cfg.DataDir, what, s.core.CheckpointNeed(sb, memory))
}

// roomFor reports whether the data dir has need bytes free beside the
// reserve (true when that cannot be read: the work then fails on its own).
func (s *Service) roomFor(need int64) bool {
	return disk.RequireSpace(s.cfg.DataDir, "", need) == nil
}

// take writes a checkpoint's data, makes it durable, and only then stores
// its record. A memory checkpoint pauses the sandbox while its memory image
// and disk snapshot are taken, and ends its streams first; then the
// sandbox's agent gets a new token, since the image holds the old, while
// the image is synced (with t.stop the sandbox stays stopped instead, and
// the next token is for whatever runs as it next). A disk-only checkpoint
// of a running sandbox does not pause it: its agent syncs its files, then
// the disk is snapshotted as it runs. The caller holds sb's operation.
func (s *Service) take(ctx context.Context, sb *store.Sandbox, t take) (*store.Checkpoint, error) {
	// The call's audit record goes with the checkpoint's own record, the
	// change it makes, and names it; the writes on the way (a new token,
	// a state) carry none, so that a crash part-way leaves no record of a
	// checkpoint that never was.
	audited := store.ReleaseAudit(ctx) // a restore's, held for its change
	ctx = store.WithoutAudit(ctx)
	id := t.id
	st := newSteps()
	defer st.log(ctx, s.log, "checkpoint steps", "sandbox", sb.ID, "checkpoint", id, "memory", t.memory, "stop", t.stop)
	parent := checkpoint.SandboxDir(s.cfg.DataDir, sb.ID)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(parent, ".tmp-"+id+"-")
	if err != nil {
		return nil, err
	}
	final := checkpoint.Dir(s.cfg.DataDir, sb.ID, id)
	snap := checkpoint.Snapshot(sb.ID, id)
	// A snapshot by this name that is there already belongs to another
	// checkpoint: never take it over, nor delete it on the way out.
	snaps, err := s.disks.Snapshots(ctx)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if slices.Contains(snaps, snap) {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("checkpointing %s: snapshot %s exists already", sb.ID, snap)
	}
	st.done("prepare")
	ok, stopped := false, false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
			_ = s.disks.DeleteSnapshot(ctx, snap)
		}
		if !ok && stopped && sb.State == api.StateRunning {
			_ = s.core.SetState(ctx, sb, api.StateError, "stopped for a restore whose automatic checkpoint failed: restore it again")
		}
	}()
	// A memory checkpoint of a running sandbox hands its agent a new token
	// in the background (rotated); waitToken waits for it, on every way
	// out, before anything else reads or writes sb.
	var (
		rotated   chan error
		tokenTime time.Duration
	)
	waitToken := func() error {
		if rotated == nil {
			return nil
		}
		err := <-rotated
		rotated = nil
		st.took("token", tokenTime)
		if err != nil {
			_ = s.core.SetState(ctx, sb, api.StateError, "its agent did not take a new token after a checkpoint: "+err.Error())
			return fmt.Errorf("checkpointing %s: %w", sb.Name, err)
		}
		return nil
	}
	defer func() { _ = waitToken() }()
	held := sb.AgentGen // the generation in the memory image
	if t.memory && sb.State == api.StateSleeping {
		// The sleep image is the memory, and the disk does not change
		// while the sandbox sleeps: no wake, no pause. The wake gives the
		// agent a new token generation.
		var image string
		image, held = s.core.SleepImage(sb)
		if err := checkpoint.LinkTree(image, filepath.Join(tmp, checkpoint.MemDir)); err != nil {
			return nil, fmt.Errorf("checkpointing %s: keeping its sleep image: %w", sb.Name, err)
		}
		if err := s.disks.Snapshot(ctx, sb.ID, snap); err != nil {
			return nil, fmt.Errorf("snapshotting the disk of %s: %w", sb.Name, err)
		}
		// The token in the image is not one the sandbox may answer to
		// once it wakes (or is restored): move it on now.
		if sb.AgentGen == held {
			sb.AgentGen++
			if err := s.store.UpdateSandbox(ctx, sb); err != nil {
				return nil, fmt.Errorf("numbering the agent token of %s: %w", sb.ID, err)
			}
		}
		crash.Point("checkpoint.asleep")
	} else if t.memory && t.stop {
		if err := s.stopInto(ctx, sb, filepath.Join(tmp, checkpoint.MemDir), snap, st); err != nil {
			return nil, fmt.Errorf("checkpointing %s: %w", sb.Name, err)
		}
		stopped = true
		crash.Point("restore.auto-image")
		// The image holds the agent's token, and the agent is stopped:
		// what runs as this sandbox next (the checkpoint restored, or a
		// fresh boot after a crash) is handed the next generation. Stored
		// before the checkpoint is visible, as RotateToken does.
		sb.AgentGen++
		if err := s.store.UpdateSandbox(ctx, sb); err != nil {
			return nil, fmt.Errorf("numbering the agent token of %s: %w", sb.ID, err)
		}
		crash.Point("restore.auto-gen")
		st.done("token")
	} else if t.memory {
		why := "the sandbox is being checkpointed"
		if t.auto {
			why = "the sandbox is being restored" // the state before a restore
		}
		release := s.core.HoldCalls(sb.ID)
		paused, err := s.freeze(ctx, sb, filepath.Join(tmp, checkpoint.MemDir), snap, why, st)
		if err != nil {
			release()
			return nil, fmt.Errorf("checkpointing %s: %w", sb.Name, err)
		}
		s.log.Info("memory checkpoint", "sandbox", sb.ID, "checkpoint", id, "paused_ms", paused.Milliseconds())
		crash.Point("checkpoint.frozen")
		// The agent takes its new token while the image and the disk are
		// made durable: neither needs the other, and the checkpoint is
		// published only once both are done. sb is the rotation's alone
		// until waitToken.
		rotated = make(chan error, 1)
		go func() {
			start := time.Now()
			err := s.core.RotateToken(ctx, sb, t.op)
			release()
			tokenTime = time.Since(start)
			rotated <- err
		}()
	} else {
		if err := s.core.SyncFiles(ctx, sb, t.op); err != nil {
			return nil, fmt.Errorf("checkpointing %s: %w", sb.Name, err)
		}
		st.done("agent_sync")
		if err := s.disks.Snapshot(ctx, sb.ID, snap); err != nil {
			return nil, fmt.Errorf("snapshotting the disk of %s: %w", sb.Name, err)
		}
		crash.Point("checkpoint.disk-snapshot")
		st.done("snapshot")
	}
	if err := s.disks.SyncSnapshot(ctx, snap); err != nil {
		return nil, fmt.Errorf("checkpointing %s: %w", sb.Name, err)
	}
	st.done("sync_snapshot")
	if err := checkpoint.SyncTree(tmp); err != nil {
		return nil, err
	}
	st.done("sync_image")
	if err := waitToken(); err != nil {
		return nil, err
	}
	st.done("token_wait")
	crash.Point("checkpoint.synced")
	// The record is stored next: the rename must be on disk first.
	if err := checkpoint.Publish(tmp, final, s.cfg.DataDir); err != nil {
		return nil, fmt.Errorf("keeping checkpoint %s: %w", id, err)
	}
	crash.Point("checkpoint.renamed")
	st.done("publish")
	cp := &store.Checkpoint{
		Checkpoint: api.Checkpoint{
			ID: id, Sandbox: sb.ID, Name: t.name, Comment: t.comment,
			Memory: t.memory, Auto: t.auto, Inside: t.inside, CreatedAt: store.Now(),
		},
		SandboxName: sb.Name, Template: sb.Template, Image: sb.Image, Resources: sb.Resources,
		AgentGen: held,
	}
	if !t.auto {
		store.AuditFrom(audited).SetTarget("sandboxes/" + sb.Name + "/checkpoints/" + id)
	}
	if err := s.store.CreateCheckpoint(audited, cp); err != nil {
		os.RemoveAll(final)
		return nil, fmt.Errorf("storing checkpoint %s of %s: %w", id, sb.ID, err)
	}
	st.done("record")
	ok = true
	if s.cfg.Uploads != nil {
		// Usable here at once; stored off the node in the background.
		s.cfg.Uploads.Queue(sb, cp)
	}
	return cp, nil
}

// stopInto takes a running sandbox's memory image and then its disk
// snapshot with one runsc checkpoint that leaves it stopped, for a restore
// that replaces it next: no pause and resume around it. A checkpoint that
// fails leaves the sandbox as it was when it can (running, its limits set
// again), and says so in its state when it cannot.
func (s *Service) stopInto(ctx context.Context, sb *store.Sandbox, imageDir, snap string, st *steps) error {
	s.core.EndStreams(sb.ID, "the sandbox is being restored")
	st.done("streams")
	start := time.Now()
	// The disk is snapshotted once the sandbox's files are flushed and its
	// tasks stopped for good (runsc's "synced"): it changes no more, and
	// its dirty pages are in the image being written, as a paused
	// sandbox's are. A failure of either leaves the sandbox running if it
	// still is, and in state error if it stopped.
	err := s.rt.Checkpoint(ctx, sb.ID, imageDir, runtime.CheckpointOptions{Flushed: func() error {
		st.done("flush")
		if err := s.disks.Snapshot(ctx, sb.ID, snap); err != nil {
			return fmt.Errorf("snapshotting the disk: %w", err)
		}
		st.done("snapshot")
		return nil
	}})
	if err != nil {
		return s.afterFailedStop(ctx, sb, err)
	}
	st.done("image")
	s.log.Info("memory checkpoint before a restore", "sandbox", sb.ID, "ms", time.Since(start).Milliseconds())
	return nil
}

// afterFailedStop puts a sandbox whose stopping checkpoint failed (err)
// back to running if it still is (paused: resumed; limits set again), and
// into state error if it stopped.
func (s *Service) afterFailedStop(ctx context.Context, sb *store.Sandbox, err error) error {
	st, serr := s.rt.State(ctx, sb.ID)
	// gVisor ends a sandbox whose stopping save failed inside it (a full
	// disk part-way): it may still look running for a moment. Never call
	// one running that is on its way out.
	for i := 0; i < 20 && serr == nil && st == runtime.StatusRunning; i++ {
		time.Sleep(100 * time.Millisecond)
		st, serr = s.rt.State(ctx, sb.ID)
	}
	if serr == nil && st == runtime.StatusPaused {
		if rerr := s.rt.Resume(ctx, sb.ID); rerr != nil {
			serr = rerr
		} else {
			st = runtime.StatusRunning
		}
	}
	if serr != nil || st != runtime.StatusRunning {
		_ = s.core.SetState(ctx, sb, api.StateError, "stopped by a checkpoint that failed: "+err.Error())
		return err
	}
	return errors.Join(err, s.core.ApplyLimits(ctx, sb))
}

// freeze takes a running sandbox's memory image and disk snapshot while it
// is paused, and resumes it. It returns how long the sandbox was paused.
func (s *Service) freeze(ctx context.Context, sb *store.Sandbox, imageDir, snap, why string, st *steps) (time.Duration, error) {
	s.core.EndStreams(sb.ID, why)
	st.done("streams")
	if hc, ok := s.rt.(runtime.HeldCheckpointer); ok {
		return s.freezeHeld(ctx, hc, sb, imageDir, snap, st)
	}
	start := time.Now()
	if err := s.rt.Pause(ctx, sb.ID); err != nil {
		return 0, fmt.Errorf("pausing: %w", err)
	}
	st.done("pause")
	err := s.rt.Checkpoint(ctx, sb.ID, imageDir, runtime.CheckpointOptions{LeaveRunning: true})
	if err == nil {
		st.done("image")
		err = s.snapshotFrozen(ctx, sb, snap, st)
	}
	if rerr := s.rt.Resume(ctx, sb.ID); rerr != nil {
		err = errors.Join(err, fmt.Errorf("resuming: %w", rerr))
		// Not running any more, whatever the record said; a restore or
		// a restart of the daemon (which resumes paused sandboxes) mends it.
		_ = s.core.SetState(ctx, sb, api.StateError, "left paused: "+rerr.Error())
	}
	paused := time.Since(start)
	st.done("resume")
	if err != nil {
		// The runtime lifts the CPU quota while it writes the image; a
		// checkpoint that failed part-way must not leave it lifted.
		err = errors.Join(err, s.core.ApplyLimits(ctx, sb))
	}
	return paused, err
}

// freezeHeld is freeze with a runtime that holds the sandbox paused
// through its own checkpoint call: the disk snapshot is taken inside it,
// while the memory is still being written when the runtime says when the
// filesystem is flushed, and the pause holds no start-up of separate pause
// and resume commands.
// The time returned runs from the call, which pauses, to its return, after
// the resume: the pause itself is within it.
func (s *Service) freezeHeld(ctx context.Context, hc runtime.HeldCheckpointer, sb *store.Sandbox, imageDir, snap string, st *steps) (time.Duration, error) {
	start := time.Now()
	err := hc.CheckpointHeld(ctx, sb.ID, imageDir, func() error {
		// The command's start, the pause and the flush (or the save).
		st.done("pause_flush")
		return s.snapshotFrozen(ctx, sb, snap, st)
	})
	paused := time.Since(start)
	st.done("resume")
	if err == nil {
		return paused, nil
	}
	// CheckpointHeld resumes the sandbox when it can, and says so when
	// it cannot; then it is not running any more, whatever the record
	// said, and a restore or a restart of the daemon (which resumes
	// paused sandboxes) mends it.
	if rst, serr := s.rt.State(ctx, sb.ID); serr != nil || rst != runtime.StatusRunning {
		_ = s.core.SetState(ctx, sb, api.StateError, "left paused by a checkpoint that failed: "+err.Error())
	}
	// The runtime lifts the CPU quota while it writes the image; a
	// checkpoint that failed part-way must not leave it lifted.
	return paused, errors.Join(err, s.core.ApplyLimits(ctx, sb))
}

// snapshotFrozen takes the disk snapshot of a paused sandbox whose
// filesystem is flushed (its memory image written, or being written), the
// one place of freeze's crash points for both ways of holding the pause.
func (s *Service) snapshotFrozen(ctx context.Context, sb *store.Sandbox, snap string, st *steps) error {
	crash.Point("checkpoint.image")
	if err := s.disks.Snapshot(ctx, sb.ID, snap); err != nil {
		return err
	}
	st.done("snapshot")
	crash.Point("checkpoint.snapshot")
	return nil
}
