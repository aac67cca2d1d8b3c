package sandbox

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
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/store"
)

// memDir is where a checkpoint keeps its memory image, inside its directory.
const memDir = "mem"

// checkpointsDir holds the data of a sandbox's checkpoints, one directory each.
func (m *Manager) checkpointsDir(id string) string {
	return filepath.Join(m.cfg.DataDir, "checkpoints", id)
}

// checkpointDir holds the data of one checkpoint. It is derived from the
// ids, never stored, so that the data dir can move (or be reached through
// another path) without losing a checkpoint.
func (m *Manager) checkpointDir(sandboxID, cpID string) string {
	return filepath.Join(m.checkpointsDir(sandboxID), cpID)
}

func cpView(cp *store.Checkpoint) api.Checkpoint { return cp.Checkpoint }

// findCheckpoint finds a checkpoint of a sandbox by id or name, as a user's
// not_found when missing.
func (m *Manager) findCheckpoint(ctx context.Context, sb *store.Sandbox, ref string) (*store.Checkpoint, error) {
	cp, err := m.store.GetCheckpoint(ctx, sb.ID, ref)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.Errorf(api.CodeNotFound, "checkpoint %q of sandbox %s not found", ref, sb.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("looking up checkpoint %s of %s: %w", ref, sb.ID, err)
	}
	return cp, nil
}

// ListCheckpoints lists a sandbox's checkpoints, oldest first. It never
// wakes the sandbox.
func (m *Manager) ListCheckpoints(ctx context.Context, ref string) ([]api.Checkpoint, error) {
	sb, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	cps, err := m.store.ListCheckpoints(ctx, sb.ID)
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints of %s: %w", sb.ID, err)
	}
	out := make([]api.Checkpoint, 0, len(cps))
	for _, cp := range cps {
		out = append(out, cpView(cp))
	}
	return out, nil
}

// GetCheckpoint returns one checkpoint. It never wakes the sandbox.
func (m *Manager) GetCheckpoint(ctx context.Context, ref, cpRef string) (*api.Checkpoint, error) {
	sb, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	cp, err := m.findCheckpoint(ctx, sb, cpRef)
	if err != nil {
		return nil, err
	}
	v := cpView(cp)
	return &v, nil
}

// DeleteCheckpoint deletes one checkpoint: its record first, so that it is
// gone at once, then its data. It never wakes the sandbox.
func (m *Manager) DeleteCheckpoint(ctx context.Context, ref, cpRef string) error {
	sb, end, err := m.claim(ctx, ref, opCheckpointDelete)
	if err != nil {
		return err
	}
	defer end()
	cp, err := m.findCheckpoint(ctx, sb, cpRef)
	if err != nil {
		return err
	}
	if err := checkpoint.CheckDelete(checkpoint.CallerOf(ctx), cp); err != nil {
		return err
	}
	unlock := m.lockSource(sb.ID)
	defer unlock()
	return m.removeCheckpoint(context.WithoutCancel(ctx), sb, cp)
}

func (m *Manager) removeCheckpoint(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint) error {
	m.pools.Forget(ctx, PoolSource{Sandbox: sb.ID, Checkpoint: cp.ID})
	if err := m.store.DeleteCheckpoint(ctx, sb.ID, cp.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("deleting checkpoint %s of %s: %w", cp.ID, sb.ID, err)
	}
	crash.Point("checkpoint-delete.record")
	err := errors.Join(
		m.disks.DeleteSnapshot(ctx, snapName(sb.ID, cp.ID)),
		os.RemoveAll(m.checkpointDir(sb.ID, cp.ID)))
	if err != nil {
		// The record is gone; the next start sweeps what is left.
		m.log.Warn("removing checkpoint data", "sandbox", sb.ID, "checkpoint", cp.ID, "err", err)
	}
	return nil
}

// CreateCheckpoint takes a checkpoint of a sandbox on request.
func (m *Manager) CreateCheckpoint(ctx context.Context, ref string, req api.CreateCheckpoint) (*api.Checkpoint, error) {
	if _, err := m.lookup(ctx, ref); err != nil {
		return nil, err
	}
	leave, err := m.heavy.enter(ctx, "taking a checkpoint")
	if err != nil {
		return nil, err
	}
	defer leave()
	if err := checkpoint.CheckComment(req.Comment); err != nil {
		return nil, err
	}
	if req.Name != "" {
		if err := checkpoint.CheckName(req.Name); err != nil {
			return nil, err
		}
	}
	memory := req.Memory == nil || *req.Memory
	sb, end, err := m.claim(ctx, ref, opCheckpoint)
	if err != nil {
		return nil, err
	}
	defer end()
	ctx = context.WithoutCancel(ctx)
	if memory {
		if err := requireState(sb.Name, sb.State, api.StateRunning, api.StateSleeping); err != nil {
			return nil, api.Errorf(api.CodeConflict, "sandbox %s is %s: a memory checkpoint needs it running (take a disk-only one with \"memory\":false)", sb.Name, sb.State)
		}
	} else if err := requireState(sb.Name, sb.State, api.StateRunning, api.StateStopped, api.StateSleeping, api.StateError); err != nil {
		return nil, err
	}
	if err := m.requireCheckpointSpace(sb, memory); err != nil {
		return nil, err
	}
	cps, err := m.store.ListCheckpoints(ctx, sb.ID)
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints of %s: %w", sb.ID, err)
	}
	if err := checkpoint.CheckLimit(checkpoint.CallerOf(ctx), cps, m.checkpointLimits()); err != nil {
		return nil, err
	}
	name, err := pickName(cps, req.Name)
	if err != nil {
		return nil, err
	}
	// The id is spent before the work starts, so that a crash part-way can
	// never hand the same id out twice.
	sb.CheckpointSeq++
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		return nil, fmt.Errorf("numbering checkpoint of %s: %w", sb.ID, err)
	}
	crash.Point("checkpoint.numbered")
	cp, err := m.takeCheckpoint(ctx, sb, take{
		id: checkpoint.UserID(sb.CheckpointSeq), name: name, comment: req.Comment,
		memory: memory, inside: checkpoint.CallerOf(ctx) == checkpoint.Inside,
	})
	if err != nil {
		what := "a disk-only checkpoint"
		if memory {
			what = "a memory checkpoint"
		}
		return nil, publicError(m.spaceError(err, sb, m.cfg.DataDir, what))
	}
	v := cpView(cp)
	return &v, nil
}

// checkpointLimits is the two shares of a sandbox's checkpoints.
func (m *Manager) checkpointLimits() checkpoint.Limits {
	return checkpoint.Limits{Owner: m.cfg.CheckpointLimit, Inside: m.cfg.InsideCheckpointLimit}
}

// pickName returns the name a new checkpoint gets: the one asked for, if no
// other checkpoint of the sandbox has it, or a new one.
func pickName(cps []*store.Checkpoint, want string) (string, error) {
	taken := map[string]bool{}
	for _, cp := range cps {
		taken[cp.Name] = true
	}
	if want != "" {
		if taken[want] {
			return "", api.Errorf(api.CodeConflict, "checkpoint name %q is in use", want)
		}
		return want, nil
	}
	for {
		if n := checkpoint.NewName(); !taken[n] {
			return n, nil
		}
	}
}

// take says which checkpoint takeCheckpoint takes.
type take struct {
	id, name, comment string
	memory            bool // memory and disk, or the disk alone
	auto              bool // kept by a restore, not asked for
	inside            bool // asked for by the sandbox itself (see api.Checkpoint.Inside)
	// stop leaves a running sandbox stopped by its memory checkpoint (a
	// restore's automatic one, whose sandbox is replaced next): one
	// runsc checkpoint, no resume, and no token to hand over.
	stop bool
}

// takeCheckpoint writes a checkpoint's data, makes it durable, and only
// then stores its record. A memory checkpoint pauses the sandbox while its
// memory image and disk snapshot are taken, and ends its streams first;
// then the sandbox's agent gets a new token, since the image holds the old,
// while the image is synced (with t.stop the sandbox stays stopped
// instead, and the next token is for whatever runs as it next). A disk-only checkpoint of a running
// sandbox does not pause it: its agent syncs its files, then the disk is
// snapshotted as it runs.
func (m *Manager) takeCheckpoint(ctx context.Context, sb *store.Sandbox, t take) (*store.Checkpoint, error) {
	id := t.id
	st := newSteps()
	defer st.log(ctx, m.log, "checkpoint steps", "sandbox", sb.ID, "checkpoint", id, "memory", t.memory, "stop", t.stop)
	parent := m.checkpointsDir(sb.ID)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(parent, ".tmp-"+id+"-")
	if err != nil {
		return nil, err
	}
	final := m.checkpointDir(sb.ID, id)
	snap := snapName(sb.ID, id)
	// A snapshot by this name that is there already belongs to another
	// checkpoint: never take it over, nor delete it on the way out.
	snaps, err := m.disks.Snapshots(ctx)
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
			_ = m.disks.DeleteSnapshot(ctx, snap)
		}
		if !ok && stopped && sb.State == api.StateRunning {
			_ = m.setState(ctx, sb, api.StateError, "stopped for a restore whose automatic checkpoint failed: restore it again")
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
			_ = m.setState(ctx, sb, api.StateError, "its agent did not take a new token after a checkpoint: "+err.Error())
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
		held = m.sleepImages.HeldGen(sb.ID, sb.AgentGen)
		if err := checkpoint.LinkTree(m.sleepImages.Image(sb.ID), filepath.Join(tmp, memDir)); err != nil {
			return nil, fmt.Errorf("checkpointing %s: keeping its sleep image: %w", sb.Name, err)
		}
		if err := m.disks.Snapshot(ctx, sb.ID, snap); err != nil {
			return nil, fmt.Errorf("snapshotting the disk of %s: %w", sb.Name, err)
		}
		// The token in the image is not one the sandbox may answer to
		// once it wakes (or is restored): move it on now.
		if sb.AgentGen == held {
			sb.AgentGen++
			if err := m.store.UpdateSandbox(ctx, sb); err != nil {
				return nil, fmt.Errorf("numbering the agent token of %s: %w", sb.ID, err)
			}
		}
		crash.Point("checkpoint.asleep")
	} else if t.memory && t.stop {
		if err := m.stopInto(ctx, sb, filepath.Join(tmp, memDir), snap, st); err != nil {
			return nil, fmt.Errorf("checkpointing %s: %w", sb.Name, err)
		}
		stopped = true
		crash.Point("restore.auto-image")
		// The image holds the agent's token, and the agent is stopped:
		// what runs as this sandbox next (the checkpoint restored, or a
		// fresh boot after a crash) is handed the next generation. Stored
		// before the checkpoint is visible, as rotateToken does.
		sb.AgentGen++
		if err := m.store.UpdateSandbox(ctx, sb); err != nil {
			return nil, fmt.Errorf("numbering the agent token of %s: %w", sb.ID, err)
		}
		crash.Point("restore.auto-gen")
		st.done("token")
	} else if t.memory {
		why := "the sandbox is being checkpointed"
		if t.auto {
			why = "the sandbox is being restored" // the state before a restore
		}
		release := m.holdCalls(sb.ID)
		paused, err := m.freeze(ctx, sb, filepath.Join(tmp, memDir), snap, why, st)
		if err != nil {
			release()
			return nil, fmt.Errorf("checkpointing %s: %w", sb.Name, err)
		}
		m.log.Info("memory checkpoint", "sandbox", sb.ID, "checkpoint", id, "paused_ms", paused.Milliseconds())
		crash.Point("checkpoint.frozen")
		// The agent takes its new token while the image and the disk are
		// made durable: neither needs the other, and the checkpoint is
		// published only once both are done. sb is the rotation's alone
		// until waitToken.
		rotated = make(chan error, 1)
		go func() {
			start := time.Now()
			err := m.rotateToken(ctx, sb)
			release()
			tokenTime = time.Since(start)
			rotated <- err
		}()
	} else {
		if err := m.syncFiles(ctx, sb); err != nil {
			return nil, fmt.Errorf("checkpointing %s: %w", sb.Name, err)
		}
		st.done("agent_sync")
		if err := m.disks.Snapshot(ctx, sb.ID, snap); err != nil {
			return nil, fmt.Errorf("snapshotting the disk of %s: %w", sb.Name, err)
		}
		crash.Point("checkpoint.disk-snapshot")
		st.done("snapshot")
	}
	if err := m.disks.SyncSnapshot(ctx, snap); err != nil {
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
	if err := checkpoint.Publish(tmp, final, m.cfg.DataDir); err != nil {
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
	if err := m.store.CreateCheckpoint(ctx, cp); err != nil {
		os.RemoveAll(final)
		return nil, fmt.Errorf("storing checkpoint %s of %s: %w", id, sb.ID, err)
	}
	st.done("record")
	ok = true
	return cp, nil
}

// stopInto takes a running sandbox's memory image and then its disk
// snapshot with one runsc checkpoint that leaves it stopped, for a restore
// that replaces it next: no pause and resume around it. A checkpoint that
// fails leaves the sandbox as it was when it can (running, its limits set
// again), and says so in its state when it cannot.
func (m *Manager) stopInto(ctx context.Context, sb *store.Sandbox, imageDir, snap string, st *steps) error {
	m.closeStreams(sb.ID, "the sandbox is being restored")
	m.dropAgentConns()
	st.done("streams")
	start := time.Now()
	// The disk is snapshotted once the sandbox's files are flushed and its
	// tasks stopped for good (runsc's "synced"): it changes no more, and
	// its dirty pages are in the image being written, as a paused
	// sandbox's are. A failure of either leaves the sandbox running if it
	// still is, and in state error if it stopped.
	err := m.rt.Checkpoint(ctx, sb.ID, imageDir, runtime.CheckpointOptions{Flushed: func() error {
		st.done("flush")
		if err := m.disks.Snapshot(ctx, sb.ID, snap); err != nil {
			return fmt.Errorf("snapshotting the disk: %w", err)
		}
		st.done("snapshot")
		return nil
	}})
	if err != nil {
		return m.afterFailedStop(ctx, sb, err)
	}
	st.done("image")
	m.log.Info("memory checkpoint before a restore", "sandbox", sb.ID, "ms", time.Since(start).Milliseconds())
	return nil
}

// afterFailedStop puts a sandbox whose stopping checkpoint failed (err)
// back to running if it still is (paused: resumed; limits set again), and
// into state error if it stopped.
func (m *Manager) afterFailedStop(ctx context.Context, sb *store.Sandbox, err error) error {
	st, serr := m.rt.State(ctx, sb.ID)
	// gVisor ends a sandbox whose stopping save failed inside it (a full
	// disk part-way): it may still look running for a moment. Never call
	// one running that is on its way out.
	for i := 0; i < 20 && serr == nil && st == runtime.StatusRunning; i++ {
		time.Sleep(100 * time.Millisecond)
		st, serr = m.rt.State(ctx, sb.ID)
	}
	if serr == nil && st == runtime.StatusPaused {
		if rerr := m.rt.Resume(ctx, sb.ID); rerr != nil {
			serr = rerr
		} else {
			st = runtime.StatusRunning
		}
	}
	if serr != nil || st != runtime.StatusRunning {
		_ = m.setState(ctx, sb, api.StateError, "stopped by a checkpoint that failed: "+err.Error())
		return err
	}
	return errors.Join(err, m.applyLimits(ctx, sb))
}

// syncFiles has a running sandbox write back what gVisor holds of its
// files in its own memory, so that a snapshot of its disk taken next, with
// no pause, holds every write made before it (see agent's serveSync).
// Other writes reach the host file at once, and the snapshot is atomic.
// An agent too old to sync (restored from an old checkpoint) is not asked:
// its snapshot is as consistent as before.
func (m *Manager) syncFiles(ctx context.Context, sb *store.Sandbox) error {
	if sb.State != api.StateRunning || m.requireAgent(sb, 5, "a sync") != nil {
		return nil
	}
	ep, err := m.Endpoint(sb)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	defer cancel()
	if err := m.agentClient(ep, m.agentToken(sb)).Sync(ctx); err != nil {
		return fmt.Errorf("syncing its files: %w", err)
	}
	return nil
}

// applyLimits sets a running sandbox's resource limits again, as its
// record says. Checkpoints and restores lift the CPU quota for speed; every
// path that may have been cut short while it was lifted calls this.
func (m *Manager) applyLimits(ctx context.Context, sb *store.Sandbox) error {
	l := runtime.Limits{CPUs: sb.Resources.CPUs, MemoryMiB: sb.Resources.MemoryMiB}
	if err := m.rt.SetLimits(ctx, sb.ID, l); err != nil {
		return fmt.Errorf("setting the limits of %s: %w", sb.ID, err)
	}
	return nil
}

// RestoreCheckpoint puts a sandbox back to a checkpoint, in place. It first
// keeps the current state as an automatic checkpoint, so that the restore
// can be undone, then records the restore (state restoring, and its
// target) before it changes anything, so that a restarted daemon finishes
// a restore cut short.
func (m *Manager) RestoreCheckpoint(ctx context.Context, ref, cpRef string) (*api.Sandbox, error) {
	leave, err := m.heavy.enter(ctx, "restoring a checkpoint")
	if err != nil {
		return nil, err
	}
	defer leave()
	sb, end, err := m.claim(ctx, ref, opRestore)
	if err != nil {
		return nil, err
	}
	defer end()
	caller := checkpoint.CallerOf(ctx)
	ctx = context.WithoutCancel(ctx)
	cp, err := m.findCheckpoint(ctx, sb, cpRef)
	if err != nil {
		return nil, err
	}
	if err := requireState(sb.Name, sb.State, api.StateRunning, api.StateStopped, api.StateSleeping, api.StateError); err != nil {
		return nil, err
	}
	st := newSteps()
	defer st.log(ctx, m.log, "restore steps", "sandbox", sb.ID, "checkpoint", cp.ID)
	m.drain(sb.ID)
	unlock := m.lockSource(sb.ID)
	defer unlock()
	st.done("drain")

	// The checkpoint's disk is cloned under a staging id while the current
	// state is kept, and takes the disk's place once that is stored.
	staging := stagingVolume(sb.ID)
	staged := make(chan error, 1)
	go func() {
		// One a failed clean-up left is of no use.
		err := m.disks.DeleteVolume(ctx, staging)
		if err == nil {
			_, err = m.disks.CloneSnapshot(ctx, snapName(sb.ID, cp.ID), staging)
		}
		staged <- err
	}()
	stagedErr := func() error {
		if staged == nil {
			return nil
		}
		err := <-staged
		staged = nil
		return err
	}
	defer func() {
		// Whatever was not used: never left for the sweep.
		if err := stagedErr(); err == nil {
			_ = m.disks.DeleteVolume(ctx, stagingVolume(sb.ID))
		}
	}()

	// Keep the current state: memory and disk when running, the disk
	// otherwise. A sandbox left without a disk by a failed restore has no
	// state to keep, and must still be restorable.
	if _, err := os.Stat(m.disks.VolumePath(sb.ID)); err == nil || sb.State != api.StateError {
		memory := sb.State == api.StateRunning || sb.State == api.StateSleeping
		if err := m.requireCheckpointSpace(sb, memory); err != nil {
			return nil, fmt.Errorf("keeping the state before the restore: %w", err)
		}
		// A checkpoint that stops the sandbox saves a pause and a resume,
		// but one that fails part-way leaves nothing running: gVisor
		// ends a sandbox whose stopping save failed. With the data dir
		// short of room for twice the estimate, the automatic checkpoint
		// pauses and resumes instead, so that running out of space
		// part-way leaves the sandbox running as it was.
		stop := sb.State == api.StateRunning && m.roomFor(2*m.checkpointNeed(sb, true))
		sb.AutoSeq++
		// The target, stored with the automatic checkpoint's number, tells
		// a restarted daemon that the restore began: it finishes it if
		// that checkpoint was stored, and knows that a running sandbox
		// may have been stopped by it if not (see recoverOne).
		sb.RestoreTarget = cp.ID
		if err := m.store.UpdateSandbox(ctx, sb); err != nil {
			return nil, fmt.Errorf("numbering automatic checkpoint of %s: %w", sb.ID, err)
		}
		crash.Point("restore.numbered")
		cps, err := m.store.ListCheckpoints(ctx, sb.ID)
		if err != nil {
			return nil, err
		}
		name, _ := pickName(cps, "")
		_, err = m.takeCheckpoint(ctx, sb, take{
			id: checkpoint.AutoID(sb.AutoSeq), name: name, comment: "before restoring " + cp.ID,
			memory: memory, auto: true, inside: caller == checkpoint.Inside,
			stop: stop,
		})
		if err != nil {
			// Refused, and left as it was (or in state error, saying why).
			sb.RestoreTarget = ""
			_ = m.store.UpdateSandbox(ctx, sb)
			m.log.Error("keeping the state before a restore", "sandbox", sb.ID, "err", err)
			return nil, publicError(m.spaceError(fmt.Errorf("keeping the state before the restore: %w", err), sb, m.cfg.DataDir, "the checkpoint a restore keeps first"))
		}
		crash.Point("restore.auto-kept")
		st.done("auto_checkpoint")
	}

	sb.RestoreTarget = cp.ID
	if err := m.setState(ctx, sb, api.StateRestoring, ""); err != nil {
		return nil, err
	}
	crash.Point("restore.restoring")
	start := time.Now()
	if err := stagedErr(); err != nil {
		m.log.Warn("cloning the checkpoint's disk ahead", "sandbox", sb.ID, "checkpoint", cp.ID, "err", err)
		_ = m.disks.DeleteVolume(ctx, staging)
		staging = ""
	}
	st.done("restoring")
	if err := m.rollBack(ctx, sb, cp, staging, st); err != nil {
		m.log.Error("restore failed", "sandbox", sb.ID, "checkpoint", cp.ID, "err", err)
		_ = m.setState(ctx, sb, api.StateError, fmt.Sprintf("restoring %s failed: %v", cp.ID, err))
		return nil, publicError(fmt.Errorf("restoring %s to %s: %w", sb.Name, cp.ID, err))
	}
	m.log.Info("restored", "sandbox", sb.ID, "checkpoint", cp.ID, "ms", time.Since(start).Milliseconds())
	m.pruneAutos(ctx, sb, caller, cp.ID)
	st.done("prune")
	return m.view(sb), nil
}

// stagingVolume is the id under which a restore of sandbox id clones the
// checkpoint's disk before it drops the current one. Not a sandbox's id:
// the sweep removes one a crash left.
func stagingVolume(id string) string { return id + "-restoring" }

// rollBack stops the sandbox, puts its disk back to the checkpoint's, and
// restores the checkpoint's memory (or boots fresh for a disk-only one).
// The disk is the volume staged, a clone of the checkpoint's already made,
// or (staged "") one cloned now.
func (m *Manager) rollBack(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint, staged string, st *steps) error {
	m.closeStreams(sb.ID, "the sandbox is being restored")
	m.dropAgentConns()
	if err := m.rt.Delete(ctx, sb.ID); err != nil {
		return fmt.Errorf("stopping: %w", err)
	}
	crash.Point("rollback.stopped")
	st.done("delete")
	if err := m.disks.DeleteVolume(ctx, sb.ID); err != nil {
		return fmt.Errorf("dropping the disk: %w", err)
	}
	crash.Point("rollback.disk-dropped")
	// A sleep image is of the disk just dropped (a restore of a sleeping
	// sandbox kept it as its automatic checkpoint): never wake on it.
	if err := m.sleepImages.Drop(sb.ID); err != nil {
		return fmt.Errorf("dropping the sleep image: %w", err)
	}
	if staged != "" {
		if err := m.disks.RenameVolume(ctx, staged, sb.ID); err != nil {
			return fmt.Errorf("putting the disk back: %w", err)
		}
	} else if _, err := m.disks.CloneSnapshot(ctx, snapName(sb.ID, cp.ID), sb.ID); err != nil {
		return fmt.Errorf("putting the disk back: %w", err)
	}
	if err := m.limitDisk(ctx, sb); err != nil {
		return fmt.Errorf("putting the disk back: %w", err)
	}
	crash.Point("rollback.disk-back")
	st.done("disk")
	if !cp.Memory {
		return m.boot(ctx, sb, false)
	}
	err := m.resume(ctx, sb, cp)
	st.done("resume")
	return err
}

// resume starts a sandbox from a memory checkpoint's image, on the disk
// already in place, and waits for its agent. The agent wakes up holding the
// token it had when the checkpoint was taken; it is given the sandbox's own.
func (m *Manager) resume(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint) error {
	return m.resumeImage(ctx, sb, filepath.Join(m.checkpointDir(cp.Sandbox, cp.ID), memDir), m.heldToken(cp), cp.ID)
}

// resumeImage starts a sandbox from the memory image in imageDir, whose
// agent holds token held, on the disk already in place; what names the
// image in logs.
func (m *Manager) resumeImage(ctx context.Context, sb *store.Sandbox, imageDir, held, what string) error {
	prep := time.Now()
	ep, err := m.prepare(ctx, sb)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := m.rt.Restore(ctx, m.spec(ctx, sb, ep), imageDir); err != nil {
		return fmt.Errorf("restoring memory: %w", err)
	}
	crash.Point("resume.restored")
	restored := time.Now()
	if err := m.connect(ctx, sb, ep, held); err != nil {
		return err
	}
	crash.Point("resume.connected")
	m.log.Info("memory restored", "sandbox", sb.ID, "image", what, "prepare_ms", start.Sub(prep).Milliseconds(),
		"runtime_ms", restored.Sub(start).Milliseconds(), "agent_ms", time.Since(restored).Milliseconds())
	return m.setState(ctx, sb, api.StateRunning, "")
}

// pruneAutos deletes the oldest automatic checkpoints beyond KeepAuto,
// sparing keep (the one just restored), of by's share: the owner's
// restores prune only the owner's, the sandbox's own only its own.
func (m *Manager) pruneAutos(ctx context.Context, sb *store.Sandbox, by checkpoint.Caller, keep string) {
	cps, err := m.store.ListCheckpoints(ctx, sb.ID)
	if err != nil {
		m.log.Warn("listing checkpoints to prune", "sandbox", sb.ID, "err", err)
		return
	}
	for _, cp := range checkpoint.PruneAutosBy(by, cps, checkpoint.KeepAuto) {
		if cp.ID == keep {
			continue
		}
		_ = m.removeCheckpoint(ctx, sb, cp)
	}
}

// lockSource takes a sandbox's checkpoints for writing (deleting or pruning
// them, or deleting the sandbox) against forks reading them.
func (m *Manager) lockSource(id string) func() {
	l := m.sourceLock(id)
	l.Lock()
	return l.Unlock
}

// rlockSource takes a sandbox's checkpoints for reading: a fork from one.
func (m *Manager) rlockSource(id string) func() {
	l := m.sourceLock(id)
	l.RLock()
	return l.RUnlock
}
