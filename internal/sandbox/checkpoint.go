package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/store"
)

// The core's side of checkpoints, restore and fork (package checkpoints
// takes, lists, deletes and restores them, and forks from them): where a
// checkpoint's data lives, its removal (which recovery shares), the lock
// on a sandbox's checkpoints, and the steps that change a sandbox's
// machine (roll it back, boot a fork). The capability reaches them through
// CheckpointCore, which implements its Core interface; the core asks it
// for forks (Forks).

// Forks make new sandboxes from checkpoints, as the core's Create asks
// when a create names a checkpoint (api.CreateSandbox.From).
type Forks interface {
	// Fork makes a new, independent sandbox from the checkpoint req.From
	// names. The caller holds the create's slots (sandbox count, heavy).
	Fork(ctx context.Context, req api.CreateSandbox) (*api.Sandbox, error)
}

// noForks are the forks of a Manager made without any: none is made.
type noForks struct{}

func (noForks) Fork(context.Context, api.CreateSandbox) (*api.Sandbox, error) {
	return nil, api.Errorf(api.CodeUnavailable, "this daemon makes no forks")
}

// CheckpointCore is the core as package checkpoints sees it (it implements
// checkpoints.Core): the steps of taking, restoring and forking that need
// the core's state (operations, holds, streams, the machine), and nothing
// else. It is a type of its own, not methods of the Manager, so that what
// only the checkpoints use is not part of the core's own surface, and the
// Manager keeps what the API and several capabilities share. Make it with
// NewCheckpointCore; the daemon gives it to checkpoints.New.
type CheckpointCore struct{ m *Manager }

// NewCheckpointCore is the checkpoints' side of m.
func NewCheckpointCore(m *Manager) *CheckpointCore { return &CheckpointCore{m: m} }

// Heavy takes a slot among the daemon's heavy operations for what (see
// heavyGate): checkpoints, restores and forks count as heavy.
func (c *CheckpointCore) Heavy(ctx context.Context, what string) (leave func(), err error) {
	return c.m.heavy.enter(ctx, what)
}

// FindCheckpoint finds a checkpoint of a sandbox by id or name, as a user's
// not_found when missing.
func (c *CheckpointCore) FindCheckpoint(ctx context.Context, sb *store.Sandbox, ref string) (*store.Checkpoint, error) {
	return c.m.findCheckpoint(ctx, sb, ref)
}

// RemoveCheckpoint deletes checkpoint cp of sb (see Manager.RemoveCheckpoint,
// which recovery shares). The caller holds sb's checkpoints (LockSource).
func (c *CheckpointCore) RemoveCheckpoint(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint) error {
	return c.m.RemoveCheckpoint(ctx, sb, cp)
}

// LockSource takes sandbox id's checkpoints for writing against forks
// reading them (see lockSource); the func returned lets them go.
func (c *CheckpointCore) LockSource(id string) (unlock func()) { return c.m.lockSource(id) }

// RollBack replaces sb's machine with checkpoint cp's, as a restore in
// place does (see rollBack, which recovery shares). The caller holds sb's
// restore operation (Claim with OpRestore).
func (c *CheckpointCore) RollBack(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint, staged string, done func(step string)) error {
	return c.m.rollBack(ctx, sb, opRestore, cp, staged, done)
}

// SourceCheckpoint finds the checkpoint from names and holds it and its
// sandbox as a fork's source until unlock (see sourceCheckpoint).
func (c *CheckpointCore) SourceCheckpoint(ctx context.Context, from *api.ForkSource) (src *store.Sandbox, cp *store.Checkpoint, unlock func(), err error) {
	return c.m.sourceCheckpoint(ctx, from)
}

// TakeFromCheckpoint gives a fork's record what it takes from its
// checkpoint (see takeFromCheckpoint).
func (c *CheckpointCore) TakeFromCheckpoint(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint, env map[string]string) error {
	return c.m.takeFromCheckpoint(ctx, sb, cp, env)
}

// BootFork gives a fork a copy of the checkpoint's disk and starts it (see
// bootFork).
func (c *CheckpointCore) BootFork(ctx context.Context, sb, src *store.Sandbox, cp *store.Checkpoint) error {
	return c.m.machine.bootFork(ctx, sb, src, cp)
}

// memDir is where a checkpoint keeps its memory image, inside its directory.
const memDir = checkpoint.MemDir

// checkpointsDir holds the data of a sandbox's checkpoints, one directory each.
func (mc *machine) checkpointsDir(id string) string {
	m := mc.m
	return checkpoint.SandboxDir(m.cfg.DataDir, id)
}

// checkpointDir holds the data of one checkpoint (see checkpoint.Dir).
func (mc *machine) checkpointDir(sandboxID, cpID string) string {
	m := mc.m
	return checkpoint.Dir(m.cfg.DataDir, sandboxID, cpID)
}

// Op is an operation a capability outside the core runs on one sandbox at
// a time (Claim): it is the core's own operation of that name, so that it
// conflicts with every other, and the API's conflict names it the same.
type Op int

// The capabilities' operations.
const (
	OpCheckpoint Op = iota + 1
	OpCheckpointDelete
	OpRestore
	// OpMove is a move to another node (checkpoints.Service.Release).
	OpMove
)

func (o Op) operation() operation {
	switch o {
	case OpCheckpoint:
		return opCheckpoint
	case OpCheckpointDelete:
		return opCheckpointDelete
	case OpRestore:
		return opRestore
	case OpMove:
		return opMove
	}
	return opNone
}

// Claim finds sandbox ref (a user's not_found when missing) and begins op
// on it, or refuses with a conflict while another operation runs. The
// record returned is read after the operation began; end ends it.
func (c *CheckpointCore) Claim(ctx context.Context, ref string, op Op) (sb *store.Sandbox, end func(), err error) {
	if op.operation() == opNone {
		return nil, nil, fmt.Errorf("claiming %s: unknown operation %d", ref, op)
	}
	return c.m.claim(ctx, ref, op.operation())
}

// Lookup finds a sandbox by name or id, as a user's not_found when missing
// (a warm pool's member is not the API's).
func (c *CheckpointCore) Lookup(ctx context.Context, ref string) (*store.Sandbox, error) {
	return c.m.lookup(ctx, ref)
}

// View is sb as the API shows it.
func (c *CheckpointCore) View(sb *store.Sandbox) *api.Sandbox { return c.m.view(sb) }

// SetState moves sb to state to (why says why, for an error) and stores
// it, refusing a transition the state machine does not have. The caller
// holds sb's operation.
func (c *CheckpointCore) SetState(ctx context.Context, sb *store.Sandbox, to api.State, why string) error {
	return c.m.setState(ctx, sb, to, why)
}

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

// RemoveCheckpoint deletes checkpoint cp of sb: its pools, then its record,
// so that it is gone at once, then its data (what is left of that is the
// next start's sweep). The caller holds sb's checkpoints (lockSource).
func (m *Manager) RemoveCheckpoint(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint) error {
	m.pools.Forget(ctx, PoolSource{Sandbox: sb.ID, Checkpoint: cp.ID})
	if err := m.store.DeleteCheckpoint(ctx, sb.ID, cp.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("deleting checkpoint %s of %s: %w", cp.ID, sb.ID, err)
	}
	crash.Point("checkpoint-delete.record")
	m.stored.Forget(ctx, sb.ID, cp.ID)
	err := errors.Join(
		m.disks.DeleteSnapshot(ctx, snapName(sb.ID, cp.ID)),
		os.RemoveAll(m.machine.checkpointDir(sb.ID, cp.ID)))
	if err != nil {
		// The record is gone; the next start sweeps what is left.
		m.log.Warn("removing checkpoint data", "sandbox", sb.ID, "checkpoint", cp.ID, "err", err)
	}
	return nil
}

// SleepImage is where sleeping sandbox sb keeps its memory image, and the
// token generation its agent holds in it.
func (c *CheckpointCore) SleepImage(sb *store.Sandbox) (dir string, gen int) {
	return c.m.sleepImages.Image(sb.ID), c.m.sleepImages.HeldGen(sb.ID, sb.AgentGen)
}

// EndStreams ends the streams and calls in flight to sandbox id (why is
// what they are told), and drops the agents' idle connections: a
// checkpoint is about to stop or pause the machine they reach.
func (c *CheckpointCore) EndStreams(id, why string) {
	c.m.closeStreams(id, why)
	c.m.agents.dropAgentConns()
}

// HoldCalls makes the calls that come to sandbox id wait until release
// (see holdCalls): a memory checkpoint holds them until its agent takes
// its new token.
func (c *CheckpointCore) HoldCalls(id string) (release func()) { return c.m.holdCalls(id) }

// RotateToken moves running sandbox sb's agent to its token's next
// generation (see rotate): after every memory checkpoint, before the
// checkpoint is visible. op is the operation the caller claimed sb for
// (a checkpoint, or the restore that keeps the state before it): the
// proof the core's door to the agent asks for (see within).
func (c *CheckpointCore) RotateToken(ctx context.Context, sb *store.Sandbox, op Op) error {
	return c.m.agents.rotate(ctx, sb, op.operation())
}

// Drain waits, up to a bound, for the requests already passed on through
// sandbox id's URL to be answered (see drain): a restore replaces the
// machine next.
func (c *CheckpointCore) Drain(id string) { c.m.drain(id) }

// SpaceError is err as the API shows a host's disk that is full (see
// spaceError), for host-side work (what) of sandbox sb in the data dir.
func (c *CheckpointCore) SpaceError(err error, sb *store.Sandbox, what string) error {
	return c.m.machine.spaceError(err, sb, c.m.cfg.DataDir, what)
}

// CheckpointNeed estimates the bytes a checkpoint of sb writes into the
// data dir (see checkpointNeed).
func (c *CheckpointCore) CheckpointNeed(sb *store.Sandbox, memory bool) int64 {
	return c.m.machine.checkpointNeed(sb, memory)
}

// SyncFiles has a running sandbox write back what gVisor holds of its
// files in its own memory, so that a snapshot of its disk taken next, with
// no pause, holds every write made before it (see agent's serveSync).
// Other writes reach the host file at once, and the snapshot is atomic.
// An agent too old to sync (restored from an old checkpoint) is not asked:
// its snapshot is as consistent as before. op is the operation the caller
// claimed sb for, as for RotateToken.
func (c *CheckpointCore) SyncFiles(ctx context.Context, sb *store.Sandbox, op Op) error {
	if sb.State != api.StateRunning || c.m.agents.require(sb, 5, "a sync") != nil {
		return nil
	}
	ep, err := c.m.Endpoint(sb)
	if err != nil {
		return err
	}
	call, err := c.m.agents.within(ctx, sb, op.operation(), ep, c.m.agents.token(sb))
	if err != nil {
		return fmt.Errorf("syncing its files: %w", err)
	}
	defer call.End()
	ctx, cancel := context.WithTimeout(call.Ctx, c.m.cfg.BootTimeout)
	defer cancel()
	if err := call.Agent.Sync(ctx); err != nil {
		return fmt.Errorf("syncing its files: %w", err)
	}
	return nil
}

// ApplyLimits sets a running sandbox's resource limits again, as its
// record says (see applyLimits).
func (c *CheckpointCore) ApplyLimits(ctx context.Context, sb *store.Sandbox) error {
	return c.m.machine.applyLimits(ctx, sb)
}

// applyLimits sets a running sandbox's resource limits again, as its
// record says. Checkpoints and restores lift the CPU quota for speed; every
// path that may have been cut short while it was lifted calls this.
func (mc *machine) applyLimits(ctx context.Context, sb *store.Sandbox) error {
	m := mc.m
	l := runtime.Limits{CPUs: sb.Resources.CPUs, MemoryMiB: sb.Resources.MemoryMiB}
	if err := m.rt.SetLimits(ctx, sb.ID, l); err != nil {
		return fmt.Errorf("setting the limits of %s: %w", sb.ID, err)
	}
	return nil
}

// rollBack stops the sandbox, puts its disk back to the checkpoint's, and
// restores the checkpoint's memory (or boots fresh for a disk-only one):
// the machine's part of a restore in place, which recovery finishes too;
// op is the operation that holds the sandbox (a restore, or recovery).
// The disk is the volume staged, a clone of the checkpoint's already made,
// or (staged "") one cloned now. done, when not nil, is told of each step
// as it ends (for the restore's timing log).
func (m *Manager) rollBack(ctx context.Context, sb *store.Sandbox, op operation, cp *store.Checkpoint, staged string, done func(step string)) error {
	step := func(name string) {
		if done != nil {
			done(name)
		}
	}
	m.closeStreams(sb.ID, "the sandbox is being restored")
	m.agents.dropAgentConns()
	if err := m.rt.Delete(ctx, sb.ID); err != nil {
		return fmt.Errorf("stopping: %w", err)
	}
	crash.Point("rollback.stopped")
	step("delete")
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
	if err := m.machine.limitDisk(ctx, sb); err != nil {
		return fmt.Errorf("putting the disk back: %w", err)
	}
	crash.Point("rollback.disk-back")
	step("disk")
	if !cp.Memory {
		return m.machine.boot(ctx, sb, op, false)
	}
	err := m.machine.resume(ctx, sb, op, cp)
	step("resume")
	return err
}

// resume starts a sandbox from a memory checkpoint's image, on the disk
// already in place, and waits for its agent. The agent wakes up holding the
// token it had when the checkpoint was taken; it is given the sandbox's own.
func (mc *machine) resume(ctx context.Context, sb *store.Sandbox, op operation, cp *store.Checkpoint) error {
	m := mc.m
	return m.machine.resumeImage(ctx, sb, op, filepath.Join(m.machine.checkpointDir(cp.Sandbox, cp.ID), memDir), m.agents.heldToken(cp), cp.ID)
}

// resumeImage starts a sandbox from the memory image in imageDir, whose
// agent holds token held, on the disk already in place; what names the
// image in logs; op is the operation that holds the sandbox.
func (mc *machine) resumeImage(ctx context.Context, sb *store.Sandbox, op operation, imageDir, held, what string) error {
	m := mc.m
	prep := time.Now()
	ep, err := m.machine.prepare(ctx, sb)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := m.rt.Restore(ctx, m.machine.spec(ctx, sb, ep), imageDir); err != nil {
		return fmt.Errorf("restoring memory: %w", err)
	}
	crash.Point("resume.restored")
	restored := time.Now()
	if err := m.agents.connect(ctx, sb, op, ep, held); err != nil {
		return err
	}
	crash.Point("resume.connected")
	m.log.Info("memory restored", "sandbox", sb.ID, "image", what, "prepare_ms", start.Sub(prep).Milliseconds(),
		"runtime_ms", restored.Sub(start).Milliseconds(), "agent_ms", time.Since(restored).Milliseconds())
	// The write that makes a create's change (see Create).
	return m.setState(store.ReleaseAudit(ctx), sb, api.StateRunning, "")
}

// lockSource takes sandbox id's checkpoints for writing (deleting or
// pruning them, or deleting the sandbox) against forks reading them; the
// func returned lets them go. The lock is the live object's: it goes with
// it once the sandbox is deleted (forgetLive), and a fork still waiting on
// the old one finds the sandbox gone once it gets it.
func (m *Manager) lockSource(id string) (unlock func()) {
	l := &m.live(id).source
	l.Lock()
	return l.Unlock
}

// sourceCheckpoint finds the checkpoint from names (a fork's, a pool's or
// a template's source) and holds its sandbox as a source, so that neither
// is deleted while the caller reads it; the caller calls unlock when done.
func (m *Manager) sourceCheckpoint(ctx context.Context, from *api.ForkSource) (src *store.Sandbox, cp *store.Checkpoint, unlock func(), err error) {
	if from == nil || from.Sandbox == "" || from.Checkpoint == "" {
		return nil, nil, nil, api.Errorf(api.CodeInvalid, "from: give both sandbox and checkpoint")
	}
	if src, err = lookupOwn(ctx, m, from.Sandbox); err != nil {
		return nil, nil, nil, err
	}
	// Read-locked: many forks of one checkpoint may be made at once.
	l := &m.live(src.ID).source
	l.RLock()
	unlock = l.RUnlock
	if cp, err = m.findCheckpoint(ctx, src, from.Checkpoint); err != nil {
		unlock()
		return nil, nil, nil, err
	}
	return src, cp, unlock, nil
}

// SourceStored is SourceCheckpoint for a fork that may be made from the
// object store's copy of the checkpoint: a source another node owns (even
// one that stopped answering) is found too, and remote says so; the
// caller then fetches the checkpoint here (checkpoints.Fetcher) before it
// boots the fork. The read lock keeps that copy as SourceCheckpoint's
// keeps a local checkpoint: no delete of it while the fork reads it.
func (c *CheckpointCore) SourceStored(ctx context.Context, from *api.ForkSource) (src *store.Sandbox, cp *store.Checkpoint, unlock func(), remote bool, err error) {
	m := c.m
	if from == nil || from.Sandbox == "" || from.Checkpoint == "" {
		return nil, nil, nil, false, api.Errorf(api.CodeInvalid, "from: give both sandbox and checkpoint")
	}
	src, err = m.lookup(ctx, from.Sandbox)
	if err != nil {
		return nil, nil, nil, false, err
	}
	if m.owner.refuse(src) == nil {
		src, cp, unlock, err = m.sourceCheckpoint(ctx, from)
		return src, cp, unlock, false, err
	}
	l := &m.live(src.ID).source
	l.RLock()
	if cp, err = m.findCheckpoint(ctx, src, from.Checkpoint); err != nil {
		l.RUnlock()
		return nil, nil, nil, false, err
	}
	return src, cp, l.RUnlock, true, nil
}

// AdmitCheckpoint holds a checkpoint of sb to its org's quota (see
// admission.checkpoint).
func (c *CheckpointCore) AdmitCheckpoint(ctx context.Context, sb *store.Sandbox, memory bool) (func(), error) {
	return c.m.admit.checkpoint(ctx, sb, memory)
}

// AdmitStart holds sb, about to run again, to its org's quota (see
// admission.start).
func (c *CheckpointCore) AdmitStart(ctx context.Context, sb *store.Sandbox) (func(), error) {
	return c.m.admit.start(ctx, sb)
}

// NewRecord validates a create request and makes the record it asks for,
// not stored yet (see Insert).
func (c *CheckpointCore) NewRecord(ctx context.Context, req api.CreateSandbox) (*store.Sandbox, error) {
	return c.m.newRecord(ctx, req)
}

// takeFromCheckpoint gives a fork's record what it takes from its
// checkpoint: template, image and resources, and, for a sandbox of an
// image, the image's env under env (the request's).
func (m *Manager) takeFromCheckpoint(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint, env map[string]string) error {
	sb.Template, sb.Image, sb.Resources = cp.Template, cp.Image, cp.Resources
	if sb.Image == "" {
		return nil
	}
	// The image's env is part of every sandbox of it, a fork's too.
	if m.cfg.Images == nil {
		return errNoImages
	}
	res, err := m.cfg.Images.Lookup(ctx, sb.Org, sb.Image)
	if err != nil {
		return err
	}
	sb.Env = imageEnv(res.Config, env)
	return nil
}

// ClaimPooled gives want a warm pool's member made from checkpoint cp of
// sandbox src, if its pool has one ready (see Pools.Claim): ok false
// says the caller makes the sandbox itself.
func (c *CheckpointCore) ClaimPooled(ctx context.Context, src *store.Sandbox, cp *store.Checkpoint, want *store.Sandbox) (v *api.Sandbox, ok bool, err error) {
	return c.m.pools.Claim(ctx, PoolSource{Sandbox: src.ID, Checkpoint: cp.ID}, want, nil)
}

// Insert stores sb, a new sandbox's record made by NewRecord, with a
// network slot of its own, under its create operation, begun before it is
// stored so that no other operation (a delete) runs on it while it boots;
// end ends the operation. A sandbox that then fails to boot is Destroyed.
func (c *CheckpointCore) Insert(ctx context.Context, sb *store.Sandbox) (end func(), err error) {
	end, _ = c.m.begin(sb, opCreate) // the id is new: the claim cannot fail
	if err := c.m.insert(ctx, sb); err != nil {
		end()
		return nil, err
	}
	return end, nil
}

// Destroy removes everything sandbox sb has, then its record (see destroy).
func (c *CheckpointCore) Destroy(ctx context.Context, sb *store.Sandbox) error {
	return c.m.destroy(ctx, sb)
}

// bootFork gives a fork a copy of the checkpoint's disk and starts it: from
// the checkpoint's memory, or fresh on the disk for a disk-only checkpoint.
func (mc *machine) bootFork(ctx context.Context, sb *store.Sandbox, src *store.Sandbox, cp *store.Checkpoint) error {
	m := mc.m
	if _, err := m.disks.CloneSnapshot(ctx, snapName(src.ID, cp.ID), sb.ID); err != nil {
		return fmt.Errorf("copying the disk: %w", err)
	}
	if err := m.machine.limitDisk(ctx, sb); err != nil {
		return fmt.Errorf("copying the disk: %w", err)
	}
	crash.Point("fork.disk")
	// A fork boots under its create (CheckpointCore.Insert, or a warm
	// pool's member's).
	if !cp.Memory {
		return m.machine.boot(ctx, sb, opCreate, false)
	}
	return m.machine.resume(ctx, sb, opCreate, cp)
}

// RequireState refuses, as a user's conflict, a sandbox (named name) that
// is not in one of the states want: "sandbox x is sleeping".
func RequireState(name string, have api.State, want ...api.State) error {
	return requireState(name, have, want...)
}
