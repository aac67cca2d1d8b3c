package checkpoints

import (
	"context"
	"errors"
	"fmt"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/store"
)

// moveUploadWait bounds how long a move waits for its checkpoint to be
// stored before it gives up (and the sandbox runs on here again).
const moveUploadWait = 10 * time.Minute

// Release is the owner's half of a move of sandbox ref to node to (loam
// move, a node's drain): the record names to as the node it is handed to
// (calls to it wait for the move's end, through every node), a memory
// checkpoint that stops it is taken (an automatic one, "before moving to
// node …"; a sleeping sandbox's is its sleep image), it is stored in the
// object store, and this node's copy goes (its machine, network and disk;
// the record and the checkpoints stay). The caller then has node to
// restore that checkpoint (which takes the sandbox over: same id, name
// and URL), or, if that fails, Reclaim. It answers the sandbox and the
// checkpoint. A move that fails before its checkpoint is stored leaves
// the sandbox running here, as it was.
func (s *Service) Release(ctx context.Context, ref, to string) (*store.Sandbox, string, error) {
	if s.cfg.Uploads == nil || s.cfg.Node == "" {
		return nil, "", api.Errorf(api.CodeInvalid, "a move is from one node of a cluster to another, through the object store: this daemon has no object store (loam serve --objects)")
	}
	if to == s.cfg.Node {
		return nil, "", api.Errorf(api.CodeInvalid, "to: the sandbox is on node %s already", to)
	}
	sb, cp, err := s.release(ctx, ref, to)
	if err == errNotStored {
		// Stopped by its checkpoint, and still this node's: it runs on
		// here from that checkpoint.
		if _, rerr := s.Reclaim(ctx, sb.ID, cp); rerr != nil {
			s.log.Error("restoring a sandbox here after a failed move", "sandbox", sb.ID, "err", rerr)
		}
		return nil, "", api.Errorf(api.CodeUnavailable, "moving %s to node %s: its checkpoint %s was not stored in the object store in %v; it runs on here", sb.Name, to, cp, moveUploadWait)
	}
	return sb, cp, err
}

// Unpin is a drain's move of a sleeping sandbox (cluster.Releaser): it is
// let go once its sleep image is stored, tied to no node, and wakes on
// the node of the first call that needs it running.
func (s *Service) Unpin(ctx context.Context, ref string) (*api.Sandbox, error) {
	sb, err := s.core.Unpin(ctx, ref)
	if err != nil {
		return nil, err
	}
	return s.core.View(sb), nil
}

// errNotStored is release's answer when the move's checkpoint, taken, was
// not stored in time.
var errNotStored = errors.New("the move's checkpoint was not stored")

// release is Release while sb is claimed for the move.
func (s *Service) release(ctx context.Context, ref, to string) (*store.Sandbox, string, error) {
	leave, err := s.core.Heavy(ctx, "moving a sandbox")
	if err != nil {
		return nil, "", err
	}
	defer leave()
	sb, end, err := s.core.Claim(ctx, ref, sandbox.OpMove)
	if err != nil {
		return nil, "", err
	}
	defer end()
	ctx = context.WithoutCancel(ctx)
	if err := sandbox.RequireState(sb.Name, sb.State, api.StateRunning, api.StateSleeping, api.StateStopped); err != nil {
		return nil, "", err
	}
	memory := sb.State != api.StateStopped
	if err := s.requireSpace(sb, memory); err != nil {
		return nil, "", err
	}
	admitted, err := s.core.AdmitCheckpoint(ctx, sb, memory)
	if err != nil {
		return nil, "", err
	}
	defer admitted()
	start := time.Now()
	s.core.Drain(sb.ID)
	unlock := s.core.LockSource(sb.ID)
	defer unlock()
	sb.Handover = to
	sb.AutoSeq++
	if err := s.store.UpdateSandbox(ctx, sb); err != nil {
		return nil, "", fmt.Errorf("handing %s to node %s: %w", sb.Name, to, err)
	}
	undo := func() {
		sb.Handover = ""
		if err := s.store.UpdateSandbox(ctx, sb); err != nil {
			s.log.Error("taking back a sandbox a move failed to hand over", "sandbox", sb.ID, "err", err)
		}
	}
	cps, err := s.store.ListCheckpoints(ctx, sb.ID)
	if err != nil {
		undo()
		return nil, "", err
	}
	name, _ := pickName(cps, "")
	running := sb.State == api.StateRunning
	cp, err := s.take(ctx, sb, take{
		id: checkpoint.AutoID(sb.AutoSeq), name: name, comment: "before moving to node " + to,
		memory: memory, auto: true, stop: false, op: sandbox.OpMove,
	})
	if err != nil {
		undo()
		s.log.Error("a move's checkpoint", "sandbox", sb.ID, "to", to, "err", err)
		return nil, "", agentconn.Failed(s.core.SpaceError(fmt.Errorf("moving %s to node %s: its checkpoint: %w", sb.Name, to, err), sb, "a move's checkpoint"))
	}
	took := time.Since(start)
	wctx, cancel := context.WithTimeout(ctx, moveUploadWait)
	err = s.cfg.Uploads.Wait(wctx, sb.ID, cp.ID)
	cancel()
	if err != nil {
		s.log.Error("a move's checkpoint was not stored", "sandbox", sb.ID, "to", to, "err", err)
		undo()
		if !running {
			return nil, "", api.Errorf(api.CodeUnavailable, "moving %s to node %s: its checkpoint %s was not stored in the object store (%v); it stays here", sb.Name, to, cp.ID, err)
		}
		_ = s.core.SetState(ctx, sb, api.StateError, fmt.Sprintf("a move to node %s failed: its checkpoint %s was not stored", to, cp.ID))
		return sb, cp.ID, errNotStored
	}
	stored := time.Since(start)
	if err := s.core.DropLocal(ctx, sb.ID); err != nil {
		s.log.Warn("removing the copy of a sandbox handed over", "sandbox", sb.ID, "err", err)
	}
	if err := s.core.SetState(ctx, sb, api.StateError, fmt.Sprintf("moving to node %s from checkpoint %s", to, cp.ID)); err != nil {
		return nil, "", err
	}
	s.log.Info("released a sandbox to another node", "sandbox", sb.ID, "name", sb.Name, "to", to, "checkpoint", cp.ID,
		"checkpoint_ms", took.Milliseconds(), "stored_ms", stored.Milliseconds())
	return sb, cp.ID, nil
}

// Reclaim takes back a sandbox this node released (Release) when the node
// it was handed to could not take it: the hand-over undone, and the
// sandbox restored here from the move's checkpoint (cpID).
func (s *Service) Reclaim(ctx context.Context, id, cpID string) (*api.Sandbox, error) {
	ctx = context.WithoutCancel(ctx)
	sb, err := s.store.GetSandbox(ctx, "", id)
	if err != nil {
		return nil, err
	}
	if sb.Node != s.cfg.Node {
		return nil, api.Errorf(api.CodeConflict, "sandbox %s is node %s's now", sb.Name, sb.Node)
	}
	if sb.Handover != "" {
		sb.Handover = ""
		if err := s.store.UpdateSandbox(ctx, sb); err != nil {
			return nil, err
		}
	}
	return s.RestoreCheckpoint(ctx, id, cpID)
}
