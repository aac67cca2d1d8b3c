package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Takeover moves a sandbox's record from a node that stopped answering to
// this one, in one step the database decides (postgres.Nodes has it): of
// two nodes that try, or a node that tries while the lost one comes back,
// one alone wins, the other gets store.ErrStale.
type Takeover interface {
	TakeOverSandbox(ctx context.Context, id, from, to string, netIndex int, reason string) (*store.Sandbox, error)
	// TakeOverSleeping takes over a sandbox asleep, whose record says
	// token generation gen, keeping it asleep: to wake it here from its
	// stored sleep image (adopt.go).
	TakeOverSleeping(ctx context.Context, id, from, to string, netIndex, gen int) (*store.Sandbox, error)
}

// Orphaned tells whether sb is another node's that stopped answering (or
// was removed), or that its owner hands to this node (a move), so that
// this node may bring it back from a stored checkpoint (TakeOver); since
// is when its node stopped answering, zero for a removed node or a move.
func (c *CheckpointCore) Orphaned(sb *store.Sandbox) (since time.Time, ok bool) {
	m := c.m
	if m.cfg.Takeover == nil || m.cfg.FrontEnd || sb.Node == "" || sb.Node == m.cfg.Node || sb.Pool != "" {
		return time.Time{}, false
	}
	if removedNode(sb) || sb.Handover == m.cfg.Node {
		return time.Time{}, true
	}
	return m.owner.lapsed(sb)
}

// TakeOver makes sb, an orphan (Orphaned), this node's: a network slot of
// this node's range, state error with reason (nothing runs it here yet),
// its record owned here from then on. The caller then restores it from a
// stored checkpoint, as a restore of a sandbox left without a machine. It
// answers the record as it now is.
func (c *CheckpointCore) TakeOver(ctx context.Context, sb *store.Sandbox, reason string) (*store.Sandbox, error) {
	m := c.m
	if _, ok := c.Orphaned(sb); !ok {
		return nil, m.owner.refuse(sb)
	}
	got, err := inNewSlot(ctx, m, func(idx int) (*store.Sandbox, error) {
		return m.cfg.Takeover.TakeOverSandbox(ctx, sb.ID, sb.Node, m.cfg.Node, idx, reason)
	})
	if errors.Is(err, store.ErrStale) {
		return nil, api.Errorf(api.CodeConflict, "sandbox %s is not node %s's any more, or that node answers again (or took it back): read it again (another node may have brought it back)", sb.Name, sb.Node)
	}
	if err != nil {
		return nil, err
	}
	if sb.Handover == m.cfg.Node {
		m.log.Info("took over a sandbox its node hands over", "sandbox", sb.ID, "name", sb.Name, "from_node", sb.Node)
	} else {
		m.log.Warn("took over a sandbox of a node that stopped answering", "sandbox", sb.ID, "name", sb.Name, "from_node", sb.Node, "reason", reason)
	}
	return got, nil
}

// inNewSlot runs take, a takeover, with a network slot of this node's
// range that no create takes meanwhile.
func inNewSlot(ctx context.Context, m *Manager, take func(idx int) (*store.Sandbox, error)) (*store.Sandbox, error) {
	m.insertMu.Lock()
	defer m.insertMu.Unlock()
	idx, err := m.allocIndex(ctx)
	if err != nil {
		return nil, err
	}
	defer delete(m.reserved, idx)
	return take(idx)
}

// DropStale destroys what this node still runs of sandboxes that are not
// its own any more: brought back on another node while this one was cut
// off (or dead), or deleted there. It touches only this node's copy (its
// machine, network and disk); the records, the new owner's data and the
// stored checkpoints are not this node's to change. A sandbox whose
// record still names this node, or one whose record the store cannot
// read now, is left; a directory younger than a minute with no record
// at all may be a create under way, and is left too. It returns how many
// it destroyed.
func (c *CheckpointCore) DropStale(ctx context.Context) (int, error) {
	m := c.m
	if m.cfg.Node == "" {
		return 0, nil
	}
	entries, err := os.ReadDir(filepath.Join(m.cfg.DataDir, "sandboxes"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		return 0, err
	}
	own, err := m.store.ListSandboxes(ctx, m.owner.filter())
	if err != nil {
		return 0, err
	}
	mine := map[string]bool{}
	for _, sb := range own {
		mine[sb.ID] = true
	}
	n := 0
	var errs []error
	for _, e := range entries {
		id := e.Name()
		if mine[id] || !e.IsDir() {
			continue
		}
		sb, err := m.store.GetSandbox(ctx, "", id)
		switch {
		case err == nil && (sb.Node == m.cfg.Node || sb.Node == ""):
			continue // made or taken back meanwhile
		case err == nil:
			m.log.Warn("destroying the stale copy of a sandbox another node owns now", "sandbox", id, "name", sb.Name, "owner", sb.Node)
		case errors.Is(err, store.ErrNotFound):
			if info, ierr := e.Info(); ierr != nil || time.Since(info.ModTime()) < time.Minute {
				continue
			}
			m.log.Warn("destroying the stale copy of a sandbox deleted while this node was away", "sandbox", id)
		default:
			errs = append(errs, err)
			continue
		}
		if err := c.dropLocal(ctx, id, true); err != nil {
			errs = append(errs, fmt.Errorf("destroying the stale copy of sandbox %s: %w", id, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// DropLocal removes this node's copy of sandbox id, once a move handed it
// to another node (see dropLocal); its record is left.
// The caller holds its operation, and the live object stays for it.
func (c *CheckpointCore) DropLocal(ctx context.Context, id string) error {
	return c.dropLocal(ctx, id, false)
}

// dropLocal removes this node's copy of sandbox id: its machine, its
// network, its disk and its directory, as the recovery's sweep does for
// what no record points at. Its checkpoints' local data is left to the
// sweeps (a fetched copy is a cache's).
func (c *CheckpointCore) dropLocal(ctx context.Context, id string, forgetLive bool) error {
	m := c.m
	// Unwatched first: its machine's end is not a death to record.
	m.deaths.unwatch(id)
	m.closeStreams(id, "the sandbox runs on another node now")
	if m.inside != nil {
		m.inside.Close(id)
	}
	errs := []error{m.rt.Delete(ctx, id)}
	m.forget(id)
	// Its namespace is named by its id; the record's slot is the new
	// owner's, not the one it had here.
	if ep, err := m.nets.Endpoint(id, 0); err == nil {
		errs = append(errs, m.nets.Delete(ctx, ep))
	}
	errs = append(errs, m.disks.DeleteVolume(ctx, id))
	errs = append(errs, os.RemoveAll(m.machine.dir(id)))
	if forgetLive {
		m.forgetLive(id)
	}
	return errors.Join(errs...)
}
