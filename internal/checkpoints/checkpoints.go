// Package checkpoints is the checkpoint capability: it takes, lists and
// deletes a sandbox's checkpoints, restores a sandbox to one in place, and
// forks new sandboxes from them, for the API (server.Checkpoints) and for
// the core's creates that name a checkpoint (sandbox.Forks).
//
// It is not package checkpoint, which is the checkpoints' format and rules
// that hold however a sandbox runs (ids and names, limits, pruning, where
// the data lives on disk, how it is made durable, archives) and which the
// core imports too. This package is the orchestration over the core: the
// order of the steps, their crash points, the automatic checkpoint a
// restore keeps first. What changes a sandbox's machine or its state (its
// operations, the lock on its checkpoints, boot, roll back, its state's one
// writer) stays in the core (package sandbox), which it reaches through
// Core.
//
// Terms: a memory checkpoint holds a sandbox's memory and disk, and
// restoring it resumes its processes; a disk-only checkpoint holds the
// disk, and restoring it boots fresh; a restore rolls the same sandbox
// back; a fork is a new, independent sandbox made from a checkpoint.
package checkpoints

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/store"
)

// Core is what the checkpoints need of the sandbox core (sandbox.CheckpointCore has it).
// A sandbox is the core's record (store.Sandbox); every method that
// changes one needs its operation held (Claim or Insert).
type Core interface {
	// Lookup finds a sandbox by name or id (a user's not_found when
	// missing); Claim finds one and begins op on it (a conflict while
	// another runs); end ends it. View is a sandbox as the API shows it.
	Lookup(ctx context.Context, ref string) (*store.Sandbox, error)
	Claim(ctx context.Context, ref string, op sandbox.Op) (sb *store.Sandbox, end func(), err error)
	View(sb *store.Sandbox) *api.Sandbox
	// SetState moves a sandbox to another state through the core's state
	// machine, and stores it.
	SetState(ctx context.Context, sb *store.Sandbox, to api.State, why string) error
	// Heavy takes one of the daemon's slots for heavy operations.
	Heavy(ctx context.Context, what string) (leave func(), err error)
	// FindCheckpoint finds a checkpoint of sb by id or name (not_found);
	// RemoveCheckpoint deletes one, record first (crash point
	// checkpoint-delete.record); LockSource holds a sandbox's checkpoints
	// against forks reading them while they are deleted or pruned.
	FindCheckpoint(ctx context.Context, sb *store.Sandbox, ref string) (*store.Checkpoint, error)
	RemoveCheckpoint(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint) error
	LockSource(id string) (unlock func())

	// What taking a checkpoint needs of a running or sleeping sandbox.
	//
	// SleepImage is a sleeping sandbox's memory image and the token
	// generation in it. EndStreams cuts what is in flight to a sandbox
	// before its machine is paused or stopped; HoldCalls makes new calls
	// wait until release; RotateToken hands its agent the next token
	// generation; SyncFiles has its agent write back cached file data;
	// ApplyLimits sets its resource limits again. RotateToken and SyncFiles
	// call the agent from inside op, the operation sb was claimed for,
	// which the core checks (a call from outside it is refused).
	SleepImage(sb *store.Sandbox) (dir string, gen int)
	EndStreams(id, why string)
	HoldCalls(id string) (release func())
	RotateToken(ctx context.Context, sb *store.Sandbox, op sandbox.Op) error
	SyncFiles(ctx context.Context, sb *store.Sandbox, op sandbox.Op) error
	ApplyLimits(ctx context.Context, sb *store.Sandbox) error
	// CheckpointNeed estimates the bytes a checkpoint of sb writes into
	// the data dir; SpaceError is err as the API shows a full data dir.
	CheckpointNeed(sb *store.Sandbox, memory bool) int64
	// AdmitCheckpoint holds a checkpoint of sb to its org's quota, counted
	// until release (call it once the checkpoint is stored or failed);
	// AdmitStart holds sb, which does not run, to it before a restore
	// runs it again, until release (call it when the restore has ended).
	AdmitCheckpoint(ctx context.Context, sb *store.Sandbox, memory bool) (release func(), err error)
	AdmitStart(ctx context.Context, sb *store.Sandbox) (release func(), err error)
	SpaceError(err error, sb *store.Sandbox, what string) error

	// Drain waits for the requests passed on through a sandbox's URL to
	// be answered; RollBack replaces its machine with checkpoint cp's
	// (disk staged, or cloned when staged is ""), as a restore does.
	Drain(id string)
	RollBack(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint, staged string, done func(step string)) error

	// What a fork needs: SourceCheckpoint holds a checkpoint and its
	// sandbox as a fork's source until unlock; NewRecord makes a new
	// sandbox's record from a request; TakeFromCheckpoint gives it the
	// checkpoint's settings; ClaimPooled hands it a warm pool's member
	// (ok false: none); Insert stores it under its create operation;
	// BootFork starts it from the checkpoint; Destroy deletes it again.
	SourceCheckpoint(ctx context.Context, from *api.ForkSource) (src *store.Sandbox, cp *store.Checkpoint, unlock func(), err error)
	// SourceStored is SourceCheckpoint that also finds a source another
	// node owns (remote), for a fork from the object store's copy.
	SourceStored(ctx context.Context, from *api.ForkSource) (src *store.Sandbox, cp *store.Checkpoint, unlock func(), remote bool, err error)
	NewRecord(ctx context.Context, req api.CreateSandbox) (*store.Sandbox, error)
	TakeFromCheckpoint(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint, env map[string]string) error
	ClaimPooled(ctx context.Context, src *store.Sandbox, cp *store.Checkpoint, want *store.Sandbox) (v *api.Sandbox, ok bool, err error)
	Insert(ctx context.Context, sb *store.Sandbox) (end func(), err error)
	BootFork(ctx context.Context, sb, src *store.Sandbox, cp *store.Checkpoint) error
	Destroy(ctx context.Context, sb *store.Sandbox) error

	// What bringing back a lost node's sandbox needs: Orphaned tells
	// whether sb's node stopped answering (since when) or was removed;
	// TakeOver makes it this node's, state error with reason, for a
	// restore to run it here.
	Orphaned(sb *store.Sandbox) (since time.Time, ok bool)
	TakeOver(ctx context.Context, sb *store.Sandbox, reason string) (*store.Sandbox, error)
	// DropLocal removes this node's copy of a sandbox a move hands over
	// (its machine, network and disk), its record left.
	DropLocal(ctx context.Context, id string) error
	// Unpin lets a sleeping sandbox of this node's go once its sleep
	// image is stored: it is tied to no node, and wakes on any.
	Unpin(ctx context.Context, ref string) (*store.Sandbox, error)
}

// Config is the checkpoints' configuration.
type Config struct {
	// DataDir is the daemon's data dir: checkpoints' data is under it (see
	// checkpoint.Dir).
	DataDir string
	// Limits are the two shares of a sandbox's checkpoints: how many the
	// owner may take, and how many the sandbox may take of itself (see
	// checkpoint.Limits). 0 is no limit.
	Limits checkpoint.Limits
	// Fetch brings a checkpoint another node took here from the object
	// store, for a fork; nil makes forks of this node's checkpoints only.
	Fetch Fetcher
	// Node is this daemon's node of a cluster ("" alone): a checkpoint of
	// another node's sandbox is told stored by the object store.
	Node string
	// Uploads stores checkpoints in the object store as they are taken;
	// nil on a daemon without one (loam serve --objects), whose
	// checkpoints show no storage.
	Uploads Uploads
}

// Service takes, lists, deletes and restores checkpoints, and makes forks.
// Make it with New (given as the core's sandbox.Config.Forks); it is safe
// for concurrent use: what must not run at once on a sandbox is kept apart
// by the core's operations.
type Service struct {
	core  Core
	cfg   Config
	store store.Store
	rt    runtime.Runtime
	disks disk.Pool
	log   *slog.Logger
}

// New makes the checkpoints over core, whose store, runtime and disk pool
// are st, rt and disks: a checkpoint's record is the store's, its memory
// image the runtime's, its disk snapshot the pool's.
func New(core Core, cfg Config, st store.Store, rt runtime.Runtime, disks disk.Pool, log *slog.Logger) *Service {
	return &Service{core: core, cfg: cfg, store: st, rt: rt, disks: disks, log: log}
}

var _ sandbox.Forks = (*Service)(nil)

// view is cp as the API shows it: with where its data is, on a daemon
// with an object store.
func (s *Service) view(cp *store.Checkpoint) api.Checkpoint {
	v := cp.Checkpoint
	if s.cfg.Uploads != nil {
		v.Storage = s.cfg.Uploads.Status(cp.Sandbox, cp.ID)
	}
	return v
}

// viewOf is view for a checkpoint of sb: one of another node's sandboxes
// (answered here because its node stopped answering) is told stored or
// not by the object store itself, since this node holds no mark of it.
func (s *Service) viewOf(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint) api.Checkpoint {
	if s.cfg.Uploads == nil || sb.Node == "" || sb.Node == s.cfg.Node {
		return s.view(cp)
	}
	v := cp.Checkpoint
	v.Storage = &api.CheckpointStorage{State: api.StorageLocal}
	if stored, _ := s.cfg.Uploads.Stored(ctx, cp.Sandbox, cp.ID); stored {
		v.Storage.State = api.StorageStored
	}
	return v
}

// checkWait refuses a wait the daemon cannot keep.
func (s *Service) checkWait(wait string) error {
	switch {
	case wait == "":
		return nil
	case wait != api.WaitStored:
		return api.Errorf(api.CodeInvalid, "wait: %q is not a wait; the one there is is %q", wait, api.WaitStored)
	case s.cfg.Uploads == nil:
		return api.Errorf(api.CodeInvalid, "wait: this daemon keeps no object store (loam serve --objects): its checkpoints stay on its disk")
	}
	return nil
}

// WaitCheckpoint returns one checkpoint once wait holds of it
// (api.WaitStored: it is in the object store), or ctx ends.
func (s *Service) WaitCheckpoint(ctx context.Context, ref, cpRef, wait string) (*api.Checkpoint, error) {
	if err := s.checkWait(wait); err != nil {
		return nil, err
	}
	v, err := s.GetCheckpoint(ctx, ref, cpRef)
	if err != nil || wait == "" {
		return v, err
	}
	if err := s.cfg.Uploads.Wait(ctx, v.Sandbox, v.ID); err != nil {
		return nil, fmt.Errorf("waiting for checkpoint %s of %s to be stored: %w", v.ID, ref, err)
	}
	return s.GetCheckpoint(ctx, ref, cpRef)
}

// ListCheckpoints lists a sandbox's checkpoints, oldest first. It never
// wakes the sandbox.
func (s *Service) ListCheckpoints(ctx context.Context, ref string) ([]api.Checkpoint, error) {
	sb, err := s.core.Lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	cps, err := s.store.ListCheckpoints(ctx, sb.ID)
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints of %s: %w", sb.ID, err)
	}
	out := make([]api.Checkpoint, 0, len(cps))
	for _, cp := range cps {
		out = append(out, s.viewOf(ctx, sb, cp))
	}
	return out, nil
}

// GetCheckpoint returns one checkpoint. It never wakes the sandbox.
func (s *Service) GetCheckpoint(ctx context.Context, ref, cpRef string) (*api.Checkpoint, error) {
	sb, err := s.core.Lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	cp, err := s.core.FindCheckpoint(ctx, sb, cpRef)
	if err != nil {
		return nil, err
	}
	v := s.viewOf(ctx, sb, cp)
	return &v, nil
}

// DeleteCheckpoint deletes one checkpoint: its record first, so that it is
// gone at once, then its data. It never wakes the sandbox.
func (s *Service) DeleteCheckpoint(ctx context.Context, ref, cpRef string) error {
	sb, end, err := s.core.Claim(ctx, ref, sandbox.OpCheckpointDelete)
	if err != nil {
		return err
	}
	defer end()
	cp, err := s.core.FindCheckpoint(ctx, sb, cpRef)
	if err != nil {
		return err
	}
	if err := checkpoint.CheckDelete(checkpoint.CallerOf(ctx), cp); err != nil {
		return err
	}
	unlock := s.core.LockSource(sb.ID)
	defer unlock()
	return s.core.RemoveCheckpoint(context.WithoutCancel(ctx), sb, cp)
}

// CreateCheckpoint takes a checkpoint of a sandbox on request.
func (s *Service) CreateCheckpoint(ctx context.Context, ref string, req api.CreateCheckpoint) (*api.Checkpoint, error) {
	if _, err := s.core.Lookup(ctx, ref); err != nil {
		return nil, err
	}
	// The wait for its upload (req.Wait) must hold up nothing else: the
	// slot, the sandbox's operation and its admission are let go of
	// first, once each.
	waitCtx := ctx
	heavy, err := s.core.Heavy(ctx, "taking a checkpoint")
	if err != nil {
		return nil, err
	}
	leave := sync.OnceFunc(heavy)
	defer leave()
	if err := checkpoint.CheckComment(req.Comment); err != nil {
		return nil, err
	}
	if err := s.checkWait(req.Wait); err != nil {
		return nil, err
	}
	if req.Name != "" {
		if err := checkpoint.CheckName(req.Name); err != nil {
			return nil, err
		}
	}
	memory := req.Memory == nil || *req.Memory
	sb, claimed, err := s.core.Claim(ctx, ref, sandbox.OpCheckpoint)
	if err != nil {
		return nil, err
	}
	end := sync.OnceFunc(claimed)
	defer end()
	ctx = context.WithoutCancel(ctx)
	if memory {
		if sb.State != api.StateRunning && sb.State != api.StateSleeping {
			return nil, api.Errorf(api.CodeConflict, "sandbox %s is %s: a memory checkpoint needs it running (take a disk-only one with \"memory\":false)", sb.Name, sb.State)
		}
	} else if err := sandbox.RequireState(sb.Name, sb.State, api.StateRunning, api.StateStopped, api.StateSleeping, api.StateError); err != nil {
		return nil, err
	}
	if err := s.requireSpace(sb, memory); err != nil {
		return nil, err
	}
	release, err := s.core.AdmitCheckpoint(ctx, sb, memory)
	if err != nil {
		return nil, err
	}
	admitted := sync.OnceFunc(release)
	defer admitted()
	cps, err := s.store.ListCheckpoints(ctx, sb.ID)
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints of %s: %w", sb.ID, err)
	}
	if err := checkpoint.CheckLimit(checkpoint.CallerOf(ctx), cps, s.cfg.Limits); err != nil {
		return nil, err
	}
	name, err := pickName(cps, req.Name)
	if err != nil {
		return nil, err
	}
	// The id is spent before the work starts, so that a crash part-way can
	// never hand the same id out twice.
	sb.CheckpointSeq++
	// Not the call's change: its audit record goes with the checkpoint's.
	if err := s.store.UpdateSandbox(store.WithoutAudit(ctx), sb); err != nil {
		return nil, fmt.Errorf("numbering checkpoint of %s: %w", sb.ID, err)
	}
	crash.Point("checkpoint.numbered")
	cp, err := s.take(ctx, sb, take{
		id: checkpoint.UserID(sb.CheckpointSeq), name: name, comment: req.Comment,
		memory: memory, inside: checkpoint.CallerOf(ctx) == checkpoint.Inside,
		op: sandbox.OpCheckpoint,
	})
	if err != nil {
		what := "a disk-only checkpoint"
		if memory {
			what = "a memory checkpoint"
		}
		return nil, agentconn.Failed(s.core.SpaceError(err, sb, what))
	}
	if req.Wait == api.WaitStored {
		// The upload reads the checkpoint alone: the sandbox takes calls
		// meanwhile. The wait ends with the caller's call.
		admitted()
		end()
		leave()
		if err := s.cfg.Uploads.Wait(waitCtx, sb.ID, cp.ID); err != nil {
			return nil, fmt.Errorf("waiting for checkpoint %s of %s to be stored: %w", cp.ID, sb.Name, err)
		}
	}
	v := s.view(cp)
	return &v, nil
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
