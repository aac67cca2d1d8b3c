package checkpoints

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/store"
)

// RestoreCheckpoint puts a sandbox back to a checkpoint, in place. It first
// keeps the current state as an automatic checkpoint, so that the restore
// can be undone, then records the restore (state restoring, and its
// target) before it changes anything, so that a restarted daemon finishes
// a restore cut short (the core's Recover).
func (s *Service) RestoreCheckpoint(ctx context.Context, ref, cpRef string) (*api.Sandbox, error) {
	leave, err := s.core.Heavy(ctx, "restoring a checkpoint")
	if err != nil {
		return nil, err
	}
	defer leave()
	// A sandbox of a node that stopped answering is brought back here,
	// from a stored checkpoint, before it is claimed as this node's own.
	recovered, err := s.bringBack(ctx, ref, cpRef)
	if err != nil {
		return nil, err
	}
	sb, end, err := s.core.Claim(ctx, ref, sandbox.OpRestore)
	if err != nil {
		return nil, err
	}
	defer end()
	if sb.Handover != "" {
		// Handed here by a move: calls wait for the hand-over's end, which
		// is the write that has it restoring (they then wait for the
		// restore), or, if it fails first, this.
		defer func() {
			if sb.Handover != "" {
				sb.Handover = ""
				if err := s.store.UpdateSandbox(context.WithoutCancel(ctx), sb); err != nil {
					s.log.Warn("ending a hand-over", "sandbox", sb.ID, "err", err)
				}
			}
		}()
	}
	caller := checkpoint.CallerOf(ctx)
	// The call's audit record goes with the write after which a crash
	// leaves the restore done (recovery finishes it): the automatic
	// checkpoint's record when the state is kept first, the state
	// restoring otherwise; not the number spent on the way.
	ctx = store.HoldAudit(context.WithoutCancel(ctx))
	cp, err := s.core.FindCheckpoint(ctx, sb, cpRef)
	if err != nil {
		return nil, err
	}
	if err := sandbox.RequireState(sb.Name, sb.State, api.StateRunning, api.StateStopped, api.StateSleeping, api.StateError); err != nil {
		return nil, err
	}
	if err := s.fetchMissing(ctx, sb, cp); err != nil {
		return nil, err
	}
	admitted, err := s.core.AdmitStart(ctx, sb)
	if err != nil {
		return nil, err
	}
	defer admitted()
	st := newSteps()
	defer st.log(ctx, s.log, "restore steps", "sandbox", sb.ID, "checkpoint", cp.ID)
	s.core.Drain(sb.ID)
	unlock := s.core.LockSource(sb.ID)
	defer unlock()
	st.done("drain")

	// The checkpoint's disk is cloned under a staging id while the current
	// state is kept, and takes the disk's place once that is stored.
	staging := stagingVolume(sb.ID)
	staged := make(chan error, 1)
	go func() {
		// One a failed clean-up left is of no use.
		err := s.disks.DeleteVolume(ctx, staging)
		if err == nil {
			_, err = s.disks.CloneSnapshot(ctx, checkpoint.Snapshot(sb.ID, cp.ID), staging)
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
			_ = s.disks.DeleteVolume(ctx, stagingVolume(sb.ID))
		}
	}()

	// Keep the current state: memory and disk when running, the disk
	// otherwise. A sandbox left without a disk by a failed restore has no
	// state to keep, and must still be restorable.
	if _, err := os.Stat(s.disks.VolumePath(sb.ID)); err == nil || sb.State != api.StateError {
		memory := sb.State == api.StateRunning || sb.State == api.StateSleeping
		if err := s.requireSpace(sb, memory); err != nil {
			return nil, fmt.Errorf("keeping the state before the restore: %w", err)
		}
		// The automatic checkpoint is one of the org's: refused before
		// anything is made when its quota has no room for it.
		admitted, err := s.core.AdmitCheckpoint(ctx, sb, memory)
		if err != nil {
			return nil, fmt.Errorf("keeping the state before the restore: %w", err)
		}
		defer admitted()
		// A checkpoint that stops the sandbox saves a pause and a resume,
		// but one that fails part-way leaves nothing running: gVisor
		// ends a sandbox whose stopping save failed. With the data dir
		// short of room for twice the estimate, the automatic checkpoint
		// pauses and resumes instead, so that running out of space
		// part-way leaves the sandbox running as it was.
		stop := sb.State == api.StateRunning && s.roomFor(2*s.core.CheckpointNeed(sb, true))
		sb.AutoSeq++
		// The target, stored with the automatic checkpoint's number, tells
		// a restarted daemon that the restore began: it finishes it if
		// that checkpoint was stored, and knows that a running sandbox
		// may have been stopped by it if not (the core's recoverOne).
		sb.RestoreTarget = cp.ID
		if err := s.store.UpdateSandbox(ctx, sb); err != nil {
			return nil, fmt.Errorf("numbering automatic checkpoint of %s: %w", sb.ID, err)
		}
		crash.Point("restore.numbered")
		cps, err := s.store.ListCheckpoints(ctx, sb.ID)
		if err != nil {
			return nil, err
		}
		name, _ := pickName(cps, "")
		_, err = s.take(ctx, sb, take{
			id: checkpoint.AutoID(sb.AutoSeq), name: name, comment: "before restoring " + cp.ID,
			memory: memory, auto: true, inside: caller == checkpoint.Inside,
			stop: stop, op: sandbox.OpRestore,
		})
		if err != nil {
			// Refused, and left as it was (or in state error, saying why).
			sb.RestoreTarget = ""
			_ = s.store.UpdateSandbox(ctx, sb)
			s.log.Error("keeping the state before a restore", "sandbox", sb.ID, "err", err)
			return nil, agentconn.Failed(s.core.SpaceError(fmt.Errorf("keeping the state before the restore: %w", err), sb, "the checkpoint a restore keeps first"))
		}
		crash.Point("restore.auto-kept")
		st.done("auto_checkpoint")
	}

	sb.RestoreTarget = cp.ID
	sb.Handover = ""
	if err := s.core.SetState(store.ReleaseAudit(ctx), sb, api.StateRestoring, ""); err != nil {
		return nil, err
	}
	crash.Point("restore.restoring")
	start := time.Now()
	if err := stagedErr(); err != nil {
		s.log.Warn("cloning the checkpoint's disk ahead", "sandbox", sb.ID, "checkpoint", cp.ID, "err", err)
		_ = s.disks.DeleteVolume(ctx, staging)
		staging = ""
	}
	st.done("restoring")
	if err := s.core.RollBack(ctx, sb, cp, staging, st.done); err != nil {
		s.log.Error("restore failed", "sandbox", sb.ID, "checkpoint", cp.ID, "err", err)
		_ = s.core.SetState(ctx, sb, api.StateError, fmt.Sprintf("restoring %s failed: %v", cp.ID, err))
		return nil, agentconn.Failed(fmt.Errorf("restoring %s to %s: %w", sb.Name, cp.ID, err))
	}
	s.log.Info("restored", "sandbox", sb.ID, "checkpoint", cp.ID, "ms", time.Since(start).Milliseconds())
	if recovered != "" && sb.State == api.StateRunning {
		// Its reason says what it is: brought back, and what was lost.
		if err := s.core.SetState(ctx, sb, api.StateRunning, recovered); err != nil {
			s.log.Warn("noting a sandbox brought back", "sandbox", sb.ID, "err", err)
		}
	}
	s.pruneAutos(ctx, sb, caller, cp.ID)
	st.done("prune")
	return s.core.View(sb), nil
}

// bringBack makes sandbox ref this node's when its node stopped answering
// (or was removed) and checkpoint cpRef of it is in the object store: the
// checkpoint fetched here first (so that one not stored, or one that
// would not restore here, leaves the sandbox where it was), then its
// record moved here in one step the database decides (TakeOver). It
// answers the reason the sandbox then shows, "" for a sandbox that needs
// no bringing back (the restore goes on as any other).
func (s *Service) bringBack(ctx context.Context, ref, cpRef string) (string, error) {
	if s.cfg.Fetch == nil {
		return "", nil
	}
	sb, err := s.core.Lookup(ctx, ref)
	if err != nil {
		return "", err
	}
	since, ok := s.core.Orphaned(sb)
	if !ok {
		return "", nil
	}
	cp, err := s.core.FindCheckpoint(ctx, sb, cpRef)
	if err != nil {
		return "", err
	}
	start := time.Now()
	if err := s.cfg.Fetch.Fetch(ctx, sb, cp); err != nil {
		return "", err
	}
	if sb.Handover == s.cfg.Node {
		// A move: its owner stopped it at this checkpoint, and nothing is
		// lost.
		if _, err := s.core.TakeOver(ctx, sb, fmt.Sprintf("moving here from node %s", sb.Node)); err != nil {
			return "", err
		}
		return "", nil
	}
	lost := "was removed"
	if !since.IsZero() {
		lost = "stopped answering at " + since.UTC().Format(time.RFC3339)
	}
	reason := fmt.Sprintf("brought back on node %s from checkpoint %s (taken %s) after node %s %s: what it did after that checkpoint is lost",
		s.cfg.Node, cp.ID, cp.CreatedAt.UTC().Format(time.RFC3339), sb.Node, lost)
	if _, err := s.core.TakeOver(ctx, sb, reason); err != nil {
		return "", err
	}
	s.log.Warn("bringing back a sandbox of a lost node", "sandbox", sb.ID, "name", sb.Name, "from_node", sb.Node,
		"checkpoint", cp.ID, "fetch_ms", time.Since(start).Milliseconds())
	return reason, nil
}

// fetchMissing fetches checkpoint cp of sb from the object store when its
// data is not on this node: one taken on the node sb was on before it
// was brought back here. A checkpoint of this node's own is never
// fetched (its upload may not even have begun).
func (s *Service) fetchMissing(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint) error {
	if s.cfg.Fetch == nil {
		return nil
	}
	snaps, err := s.disks.Snapshots(ctx)
	if err != nil {
		return err
	}
	if slices.Contains(snaps, checkpoint.Snapshot(sb.ID, cp.ID)) {
		if _, err := os.Stat(filepath.Join(checkpoint.Dir(s.cfg.DataDir, sb.ID, cp.ID), checkpoint.MemDir)); !cp.Memory || err == nil {
			return nil
		}
	}
	return s.cfg.Fetch.Fetch(ctx, sb, cp)
}

// stagingVolume is the id under which a restore of sandbox id clones the
// checkpoint's disk before it drops the current one. Not a sandbox's id:
// the core's sweep removes one a crash left.
func stagingVolume(id string) string { return id + "-restoring" }

// pruneAutos deletes the oldest automatic checkpoints beyond KeepAuto,
// sparing keep (the one just restored), of by's share: the owner's
// restores prune only the owner's, the sandbox's own only its own. The
// caller holds sb's checkpoints (LockSource).
func (s *Service) pruneAutos(ctx context.Context, sb *store.Sandbox, by checkpoint.Caller, keep string) {
	cps, err := s.store.ListCheckpoints(ctx, sb.ID)
	if err != nil {
		s.log.Warn("listing checkpoints to prune", "sandbox", sb.ID, "err", err)
		return
	}
	for _, cp := range checkpoint.PruneAutosBy(by, cps, checkpoint.KeepAuto) {
		if cp.ID == keep {
			continue
		}
		_ = s.core.RemoveCheckpoint(ctx, sb, cp)
	}
}
