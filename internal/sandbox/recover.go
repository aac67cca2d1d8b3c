package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/store"
)

// Recover brings the daemon's view back in line with the host after a
// restart: sandboxes that were running and still are get taken back; those
// whose container is gone (the host rebooted) boot again on their disk; a
// create or delete cut short is finished (rolled back or completed); and
// disks, networks and directories no record points at are removed.
func (m *Manager) Recover(ctx context.Context) error {
	r := &recovery{m: m, known: map[string]bool{}}
	return r.run(ctx)
}

// recovery is one pass of Recover, at the daemon's start and before any
// request: it walks the records and takes back, finishes or gives up on
// each sandbox, then sweeps what no record points at. It is a type of its
// own because it runs once, with state of its own (which sandboxes it
// found), through steps no request ever takes; the Manager keeps the
// operations (boot, connect, setState, destroy) it dispatches to.
type recovery struct {
	m *Manager
	// known are the sandboxes that had a record when the pass began: the
	// sweep removes disks and directories of any other. keep are the
	// network endpoints of those whose egress policies the firewall keeps.
	known map[string]bool
	keep  []network.Endpoint
}

// run is the pass: every record, then the sweep.
func (r *recovery) run(ctx context.Context) error {
	m := r.m
	sbs, err := m.store.ListSandboxes(ctx, m.owner.filter())
	if err != nil {
		return fmt.Errorf("listing sandboxes: %w", err)
	}
	for _, sb := range sbs {
		r.known[sb.ID] = true
		r.recoverHeld(ctx, sb)
		if ep, err := m.Endpoint(sb); err == nil {
			r.keep = append(r.keep, ep)
		}
	}
	// The firewall kept every policy through the restart (so sandboxes
	// that ran on kept their egress): drop those of sandboxes now gone.
	return errors.Join(m.nets.PrunePolicies(ctx, r.keep), r.sweep(ctx))
}

// recoverHeld recovers sb under an operation of its own, opRecover, as
// every other change to a sandbox runs under one: what recovery asks of
// the sandbox's agent goes through the core's door for operations
// (within), which checks that the caller holds the sandbox, and a death
// watch that a takeBack starts judges the sandbox only once recovery is
// done with it. Recovery runs before any request is served, so no other
// operation can hold the sandbox; one that does (a Recover called on a
// Manager that serves) is left the sandbox, and recovery says so.
func (r *recovery) recoverHeld(ctx context.Context, sb *store.Sandbox) {
	m := r.m
	end, err := m.begin(sb, opRecover)
	if err != nil {
		m.log.Error("not recovering a sandbox another operation holds", "sandbox", sb.ID, "err", err)
		return
	}
	defer end()
	if err := r.recoverOne(ctx, sb); err != nil {
		m.log.Error("recovering sandbox", "sandbox", sb.ID, "err", err)
		r.giveUp(ctx, sb, err)
	}
	m.machine.relimitDisk(ctx, sb)
}

// giveUp deals with a sandbox that recovery could not take back (why): a
// container it left running would go on unmanaged, seen by no call, its
// death watched by no one, so it is stopped, and the sandbox is marked
// error, saying why and that a wake boots it again on its disk (its files
// are kept; its processes start afresh). A sandbox being deleted stays
// so, for the next delete.
func (r *recovery) giveUp(ctx context.Context, sb *store.Sandbox, why error) {
	stopped := "its container was stopped"
	if err := r.m.rt.Delete(ctx, sb.ID); err != nil {
		r.m.log.Error("stopping the container of a sandbox that was not taken back", "sandbox", sb.ID, "err", err)
		stopped = "stopping its container failed too"
	}
	if sb.State == api.StateDeleting || !canTransition(sb.State, api.StateError) {
		return
	}
	_ = r.m.setState(ctx, sb, api.StateError, fmt.Sprintf("not taken back after the daemon restarted (%s; %s): wake boots it again on its disk", why, stopped))
}

func (r *recovery) recoverOne(ctx context.Context, sb *store.Sandbox) error {
	if sb.Pool != "" {
		// A warm pool's member: made again by its pool (warmpool), with a
		// connection of its own, rather than taken back.
		r.m.log.Info("deleting a warm pool's member left by the last daemon", "sandbox", sb.ID, "pool", sb.Pool)
		return r.m.destroy(ctx, sb)
	}
	if swept, err := r.m.sleepImages.Sweep(sb.ID); err != nil {
		return err
	} else if swept {
		r.m.log.Info("removing the rest of a dropped sleep image", "sandbox", sb.ID)
	}
	cutRestore := false
	if sb.RestoreTarget != "" && sb.State != api.StateRestoring {
		// A restore cut short while it kept the state.
		if kept, err := r.finishKeptRestore(ctx, sb); kept || err != nil {
			return err
		}
		cutRestore = sb.State == api.StateRunning
	}
	switch sb.State {
	case api.StateCreating, api.StateDeleting:
		// The client of a create cut short got no sandbox; a delete was asked for.
		r.m.log.Info("finishing interrupted operation", "sandbox", sb.ID, "state", sb.State)
		return r.m.destroy(ctx, sb)
	case api.StateRestoring:
		return r.finishRestore(ctx, sb)
	case api.StateSleeping:
		return r.recoverSleeping(ctx, sb)
	case api.StateRunning, api.StateError:
		if cutRestore {
			return r.recoverStoppedForRestore(ctx, sb)
		}
		if sb.State == api.StateRunning {
			if done, err := r.recoverMidSleep(ctx, sb); done || err != nil {
				return err
			}
		}
		st, err := r.m.rt.State(ctx, sb.ID)
		if err == nil && st == runtime.StatusPaused {
			// A crash while a checkpoint had it paused.
			r.m.log.Info("resuming sandbox left paused", "sandbox", sb.ID)
			if rerr := r.m.rt.Resume(ctx, sb.ID); rerr != nil {
				// The runtime's held checkpoint resumes it too, when the
				// daemon that held it goes (runtime.HeldCheckpointer):
				// it may have come first.
				if st, err = r.m.rt.State(ctx, sb.ID); err != nil || st != runtime.StatusRunning {
					return fmt.Errorf("resuming: %w", rerr)
				}
			}
			st = runtime.StatusRunning
		}
		switch {
		case err == nil && st == runtime.StatusRunning:
			// A crash may have come while the limits were lifted (a
			// checkpoint or restore lifts the CPU quota): set them again.
			if err := r.m.machine.applyLimits(ctx, sb); err != nil {
				return err
			}
			ep, err := r.m.Endpoint(sb)
			if err != nil {
				return err
			}
			// The daemon's start installed the firewall afresh, without
			// the policies of the sandboxes that ran on.
			if err := r.m.applyNetwork(ctx, sb); err != nil {
				return err
			}
			if err := r.m.agents.takeBack(ctx, sb, opRecover, ep, r.m.agents.recoveryTokens(sb)...); err != nil {
				return err
			}
			if sb.State != api.StateRunning {
				return r.m.setState(ctx, sb, api.StateRunning, "")
			}
			r.m.log.Info("sandbox taken back", "sandbox", sb.ID, "name", sb.Name)
			return nil
		case err != nil && !errors.Is(err, runtime.ErrNotExist):
			return fmt.Errorf("reading container state: %w", err)
		}
		// The container is gone or dead: boot again on the sandbox's disk.
		if err := r.m.rt.Delete(ctx, sb.ID); err != nil {
			return err
		}
		r.m.log.Info("sandbox container gone; booting it again", "sandbox", sb.ID)
		return r.m.machine.boot(ctx, sb, opRecover, false)
	}
	return nil
}

// finishKeptRestore deals with a sandbox whose restore a crash cut short
// while its state was being kept (its record names the restore's target,
// but its state is not restoring yet). If the automatic checkpoint was
// stored, the state is kept: the restore the user asked for is finished
// (as after it), and kept is true. If not, the restore is forgotten, and
// the sandbox is as before it, but for a running one, which the
// checkpoint that keeps its state may have stopped (see
// recoverStoppedForRestore).
func (r *recovery) finishKeptRestore(ctx context.Context, sb *store.Sandbox) (kept bool, err error) {
	target := sb.RestoreTarget
	auto, err := r.m.store.GetCheckpoint(ctx, sb.ID, checkpoint.AutoID(sb.AutoSeq))
	switch {
	case err == nil && auto.Auto:
		if _, err := r.m.store.GetCheckpoint(ctx, sb.ID, target); err == nil {
			r.m.log.Info("a restore was cut short after keeping the state; finishing it",
				"sandbox", sb.ID, "checkpoint", target, "kept", auto.ID)
			if err := r.m.setState(ctx, sb, api.StateRestoring, ""); err != nil {
				return true, err
			}
			sb.RestoreTarget = target
			if err := r.m.store.UpdateSandbox(ctx, sb); err != nil {
				return true, fmt.Errorf("recording the restore of %s: %w", sb.ID, err)
			}
			return true, r.finishRestore(ctx, sb)
		}
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return true, fmt.Errorf("looking up the automatic checkpoint of %s: %w", sb.ID, err)
	}
	r.m.log.Info("a restore was cut short before its state was kept; forgetting it", "sandbox", sb.ID, "checkpoint", target)
	sb.RestoreTarget = ""
	if err := r.m.store.UpdateSandbox(ctx, sb); err != nil {
		return true, fmt.Errorf("forgetting the restore of %s: %w", sb.ID, err)
	}
	return false, nil
}

// recoverStoppedForRestore takes back a running sandbox whose restore a
// crash cut short before its state was kept. If the checkpoint that keeps
// it had not stopped the container, its agent answers, and the sandbox
// runs on (as before the restore). If it had (or cannot be told from one
// that had: runsc goes on reporting a stopped container as running for a
// while), the memory is lost; the disk was not touched, and the sandbox
// boots again on it. The restore can be asked for again.
func (r *recovery) recoverStoppedForRestore(ctx context.Context, sb *store.Sandbox) error {
	st, err := r.m.rt.State(ctx, sb.ID)
	if err == nil && st == runtime.StatusPaused {
		_ = r.m.rt.Resume(ctx, sb.ID)
		st = runtime.StatusRunning
	}
	if ep, eerr := r.m.Endpoint(sb); err == nil && st == runtime.StatusRunning && eerr == nil {
		cctx, cancel := context.WithTimeout(ctx, midSleepWait)
		err := r.m.agents.takeBack(cctx, sb, opRecover, ep, r.m.agents.recoveryTokens(sb)...)
		cancel()
		if err == nil {
			r.m.log.Info("a restore was cut short before it stopped the sandbox; the sandbox runs on", "sandbox", sb.ID)
			return errors.Join(r.m.machine.applyLimits(ctx, sb), r.m.applyNetwork(ctx, sb))
		}
	}
	if err := r.m.rt.Delete(ctx, sb.ID); err != nil {
		return err
	}
	if r.resumeLeft(ctx, sb, r.m.machine.checkpointsDir(sb.ID), opRestore) {
		return nil
	}
	r.m.log.Warn("a restore was cut short after it stopped the sandbox; booting it again on its disk", "sandbox", sb.ID)
	return r.m.machine.boot(ctx, sb, opRecover, false)
}

// resumeLeft starts a sandbox that a crash left stopped by a memory
// checkpoint (one that keeps its state before a restore, or its sleep
// image) again from the image that checkpoint wrote, if one is left
// unfinished in dir (".tmp-*/mem"): the sandbox is then as before the
// operation (what, for the log), its processes and all. Its disk has not
// changed since: the sandbox was stopped. An image runsc did not finish
// fails to restore; false then says the caller must boot the sandbox on
// its disk. The image itself is removed by the sweep or the caller: the
// restore reads it whole before it answers (no -background).
func (r *recovery) resumeLeft(ctx context.Context, sb *store.Sandbox, dir string, what operation) bool {
	imgs, _ := filepath.Glob(filepath.Join(dir, ".tmp-*", memDir))
	if len(imgs) == 0 {
		return false
	}
	// The newest: an older one is what an earlier crash left, and would
	// not match the disk.
	newest, newestAt := "", time.Time{}
	for _, img := range imgs {
		if fi, err := os.Stat(img); err == nil && fi.IsDir() && fi.ModTime().After(newestAt) {
			newest, newestAt = img, fi.ModTime()
		}
	}
	if newest == "" {
		return false
	}
	// The image holds the agent's token of then: this generation, or the
	// one before if the next was stored (a restore's automatic checkpoint
	// stores it after the image). Neither is in a published image (this
	// one is never published: the sweep removes it), so the generation
	// is not moved on here; connect hands the agent the current token.
	// That keeps the record as it was, so that a crash in here is
	// recovered the same way again.
	holds := r.m.agents.recoveryTokens(sb)
	start := time.Now()
	err := func() error {
		ep, err := r.m.machine.prepare(ctx, sb)
		if err != nil {
			return err
		}
		if err := r.m.rt.Restore(ctx, r.m.machine.spec(ctx, sb, ep), newest); err != nil {
			return fmt.Errorf("restoring memory: %w", err)
		}
		crash.Point("recover.resumed")
		return r.m.agents.takeBack(ctx, sb, opRecover, ep, holds...)
	}()
	if err != nil {
		r.m.log.Warn(what.String()+" was cut short after it stopped the sandbox, and the image it wrote does not restore",
			"sandbox", sb.ID, "image", newest, "err", err)
		_ = r.m.rt.Delete(ctx, sb.ID)
		return false
	}
	r.m.log.Info(what.String()+" was cut short after it stopped the sandbox; resumed from the image it wrote",
		"sandbox", sb.ID, "image", newest, "ms", time.Since(start).Milliseconds())
	return true
}

// finishRestore finishes a restore that a crash cut short: the user asked
// for it, and the sandbox may be half rolled back. When the checkpoint is
// gone too, the sandbox is left in state error, saying why, for the user to
// restore to another.
func (r *recovery) finishRestore(ctx context.Context, sb *store.Sandbox) error {
	target := sb.RestoreTarget
	cp, err := r.m.store.GetCheckpoint(ctx, sb.ID, target)
	if err != nil {
		r.m.log.Error("a restore was cut short and its checkpoint is gone", "sandbox", sb.ID, "checkpoint", target, "err", err)
		return r.m.setState(ctx, sb, api.StateError, fmt.Sprintf("a restore to %s was cut short, and the checkpoint is gone: restore another", target))
	}
	r.m.log.Info("finishing interrupted restore", "sandbox", sb.ID, "checkpoint", target)
	if err := r.m.rollBack(ctx, sb, opRecover, cp, "", nil); err != nil {
		return fmt.Errorf("finishing the restore to %s: %w", target, err)
	}
	return nil
}

// sweep removes disks, network namespaces and sandbox directories that no
// record points at: what a crash between two steps can leave.
func (r *recovery) sweep(ctx context.Context) error {
	var errs []error
	vols, err := r.m.disks.Volumes(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, v := range vols {
		if !r.known[v] {
			r.m.log.Info("removing orphaned disk", "volume", v)
			errs = append(errs, r.m.disks.DeleteVolume(ctx, v))
		}
	}
	// A sandbox's directory is made before its network and container, so
	// one without a record marks what a crashed create or delete left.
	// (Namespaces of other daemons on this host are not ours to touch.)
	entries, _ := os.ReadDir(filepath.Join(r.m.cfg.DataDir, "sandboxes"))
	for _, e := range entries {
		id := e.Name()
		if r.known[id] {
			continue
		}
		if sb, err := r.m.store.GetSandbox(ctx, "", id); err == nil && sb.Node != r.m.cfg.Node {
			// Brought back on another node while this one was away: this
			// copy is stale, and only it goes (not the record, the new
			// owner's data or the stored checkpoints).
			r.m.log.Warn("destroying the stale copy of a sandbox another node owns now", "sandbox", id, "name", sb.Name, "owner", sb.Node)
		} else {
			r.m.log.Info("removing leftovers of sandbox", "sandbox", id)
		}
		errs = append(errs, r.m.rt.Delete(ctx, id))
		if ep, err := r.m.nets.Endpoint(id, 0); err == nil {
			errs = append(errs, r.m.nets.Delete(ctx, ep))
		}
		errs = append(errs, os.RemoveAll(filepath.Join(r.m.cfg.DataDir, "sandboxes", id)))
	}
	errs = append(errs, r.sweepCheckpoints(ctx))
	return errors.Join(errs...)
}

// sweepCheckpoints removes checkpoint data no record points at: what a
// crash while a checkpoint was being taken (or deleted) leaves. A record is
// written only after its data is durable, so such data was never visible.
func (r *recovery) sweepCheckpoints(ctx context.Context) error {
	if err := r.dropBrokenCheckpoints(ctx); err != nil {
		return err
	}
	var errs []error
	root := filepath.Join(r.m.cfg.DataDir, "checkpoints")
	sbDirs, _ := os.ReadDir(root)
	for _, sd := range sbDirs {
		cpDirs, _ := os.ReadDir(filepath.Join(root, sd.Name()))
		for _, cd := range cpDirs {
			path := filepath.Join(root, sd.Name(), cd.Name())
			cp, err := r.m.store.GetCheckpoint(ctx, sd.Name(), cd.Name())
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				errs = append(errs, err)
				continue
			}
			// A directory is a checkpoint's if it is named by the id (a
			// name never looks like one, nor like ".tmp-…").
			if err == nil && cp.ID == cd.Name() {
				continue
			}
			r.m.log.Info("removing unfinished checkpoint data", "path", path)
			errs = append(errs, os.RemoveAll(path))
		}
		if len(cpDirs) == 0 || !r.stored(ctx, sd.Name()) {
			_ = os.Remove(filepath.Join(root, sd.Name()))
		}
	}
	owned, err := r.m.tpl.Sweep()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	snaps, err := r.m.disks.Snapshots(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, snap := range snaps {
		if tpl, held := owned(snap); tpl {
			if !held {
				r.m.log.Info("removing unfinished template snapshot", "snapshot", snap)
				errs = append(errs, r.m.disks.DeleteSnapshot(ctx, snap))
			}
			continue
		}
		sbID, cpID, ok := strings.Cut(snap, ".")
		if ok {
			if _, err := r.m.store.GetCheckpoint(ctx, sbID, cpID); !errors.Is(err, store.ErrNotFound) {
				continue
			}
		}
		r.m.log.Info("removing unfinished checkpoint snapshot", "snapshot", snap)
		errs = append(errs, r.m.disks.DeleteSnapshot(ctx, snap))
	}
	return errors.Join(errs...)
}

// dropBrokenCheckpoints deletes the records of checkpoints whose data is
// gone (removed by hand, or lost with a disk), so that the store never lists
// a checkpoint that cannot be restored. Only data that is certainly not
// there counts as gone: any other error reading it (a data dir on a disk
// that is not mounted yet, a permission) keeps the checkpoint, and fails
// the recovery loudly instead.
func (r *recovery) dropBrokenCheckpoints(ctx context.Context) error {
	snaps, err := r.m.disks.Snapshots(ctx)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, s := range snaps {
		have[s] = true
	}
	sbs, err := r.m.store.ListSandboxes(ctx, r.m.owner.filter())
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range sbs {
		cps, err := r.m.store.ListCheckpoints(ctx, sb.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, cp := range cps {
			data := r.m.machine.checkpointDir(sb.ID, cp.ID)
			if cp.Memory {
				data = filepath.Join(data, memDir)
			}
			_, statErr := os.Stat(data)
			switch {
			case statErr != nil && !errors.Is(statErr, fs.ErrNotExist):
				errs = append(errs, fmt.Errorf("checking the data of checkpoint %s of %s: %w", cp.ID, sb.ID, statErr))
				continue
			case statErr == nil && have[snapName(sb.ID, cp.ID)]:
				continue
			}
			if ok, err := r.m.stored.Stored(ctx, sb.ID, cp.ID); err == nil && ok {
				continue // another node's, brought back here: fetched when used
			}
			r.m.log.Error("checkpoint data is missing; dropping the checkpoint", "sandbox", sb.ID, "checkpoint", cp.ID,
				"image_missing", statErr != nil, "snapshot_missing", !have[snapName(sb.ID, cp.ID)], "path", data)
			errs = append(errs, r.m.RemoveCheckpoint(ctx, sb, cp))
		}
	}
	return errors.Join(errs...)
}

// stored reports whether sandbox id has a record now (the pass may have
// deleted some it found).
func (r *recovery) stored(ctx context.Context, id string) bool {
	_, err := r.m.store.GetSandbox(ctx, "", id)
	return err == nil
}
