package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/store"
)

// The core's side of warm pools (package warmpool keeps them): a pool's
// member is a sandbox in every way but that the API does not show it (its
// record's Pool names its pool). The core makes, deletes and hands over
// members when the pools ask (PoolCore, below), and asks the
// pools for a member when a create or fork matches one (Pools).

// Pools are the warm pools as the core sees them: sandboxes made ahead of
// time that a create or fork may take instead of booting or restoring one.
type Pools interface {
	// Claim gives want a member made from what from names, if its pool has
	// one ready (handed over by PoolCore.ClaimPoolMember). ok is false when the
	// caller should make the sandbox itself; otherwise v is the sandbox
	// made, or err why the create failed.
	Claim(ctx context.Context, from PoolSource, want *store.Sandbox, services []api.Service) (v *api.Sandbox, ok bool, err error)
	// Keep keeps a pool of size members of from (0 drains it), as the API
	// does when it is asked to (a template made with a pool).
	Keep(ctx context.Context, from PoolSource, size int) error
	// Forget drains and removes the pools of what gone names, which is
	// being deleted: a sandbox (every pool of its checkpoints), one of its
	// checkpoints, an org's template, or an org (Org alone: every pool of
	// a template it keeps).
	Forget(ctx context.Context, gone PoolSource)
	// Lost takes member, whose sandbox process died, out of its pool,
	// deletes it and makes another. The caller holds the member's
	// operation, so no claim takes it meanwhile.
	Lost(ctx context.Context, member *store.Sandbox)
}

// PoolSource names what a pool's members are made from: a checkpoint
// (Sandbox and Checkpoint ids, forks of it; the members are the source's
// org's) or a template of an org (Org and Template; each org keeps its own
// pools of the built-ins and of its checkpoint templates, and their
// members are its).
type PoolSource struct {
	Sandbox, Checkpoint string
	Org, Template       string
}

// MemoryMeter reads a running container's host memory. The gVisor runtime
// has it; a runtime without it reports memory as 0.
type MemoryMeter interface {
	MemoryBytes(id string) (int64, error)
}

// PoolCore is the core as package warmpool sees it (it implements
// warmpool.Core): making a pool's members, handing one over to a create,
// and deleting them. It is a type of its own, not methods of the Manager,
// because only the pools make and hand over members: the core's own
// surface keeps what the API and several capabilities share. Make it with
// NewPoolCore; the daemon gives it to warmpool.New.
type PoolCore struct{ m *Manager }

// NewPoolCore is the warm pools' side of m.
func NewPoolCore(m *Manager) *PoolCore { return &PoolCore{m: m} }

// ContainerMemory is the host memory member id holds, 0 if unknown (see
// containerMemory).
func (p *PoolCore) ContainerMemory(id string) int64 { return p.m.machine.containerMemory(id) }

// PoolCheckpoint finds the checkpoint a pool of forks is made from, by the
// user's references, as a fork does, and holds it (and its sandbox) until
// unlock, so that neither is deleted while its pool is set.
func (p *PoolCore) PoolCheckpoint(ctx context.Context, ref, cpRef string) (from PoolSource, unlock func(), err error) {
	src, cp, unlock, err := p.m.sourceCheckpoint(ctx, &api.ForkSource{Sandbox: ref, Checkpoint: cpRef})
	if err != nil {
		return PoolSource{}, nil, err
	}
	return PoolSource{Sandbox: src.ID, Checkpoint: cp.ID}, unlock, nil
}

// PoolTemplate checks that template name can have a pool of the caller's
// org: a built-in template or one of the org's checkpoint templates (an
// image cannot), and names that pool.
func (p *PoolCore) PoolTemplate(ctx context.Context, name string) (PoolSource, error) {
	from := PoolSource{Org: p.m.orgOf(ctx), Template: name}
	if p.m.tpl.Builtin(name) {
		return from, nil
	}
	man, err := p.m.tpl.Kept(from.Org, name)
	if err != nil {
		return PoolSource{}, err
	}
	if man == nil {
		return PoolSource{}, api.Errorf(api.CodeNotFound, "template %q not found (images have no pools: make a template of one with loam template build)", name)
	}
	return from, nil
}

// MemoryImageBytes is the size of the memory image a member of from is
// restored from (a checkpoint's or a memory template's), 0 if none.
func (p *PoolCore) MemoryImageBytes(from PoolSource) int64 {
	if from.Checkpoint != "" {
		if n := checkpoint.TreeBytes(filepath.Join(p.m.machine.checkpointDir(from.Sandbox, from.Checkpoint), memDir)); n > 0 {
			return n
		}
	}
	if from.Template != "" {
		if n := checkpoint.TreeBytes(p.m.tpl.MemDir(from.Org, from.Template)); n > 0 {
			return n
		}
	}
	return 0
}

// containerMemory is the host memory container id holds, 0 if unknown.
func (mc *machine) containerMemory(id string) int64 {
	m := mc.m
	mm, ok := m.rt.(MemoryMeter)
	if !ok {
		return 0
	}
	n, err := mm.MemoryBytes(id)
	if err != nil {
		return 0
	}
	return n
}

// MakePoolMember makes one member of pool (the name its record keeps), from
// what from names, stored and running, or nothing. An error that is
// api.ErrNotFound says from is gone.
func (p *PoolCore) MakePoolMember(ctx context.Context, from PoolSource, pool string) (*store.Sandbox, error) {
	if p.m.cfg.FrontEnd {
		return nil, api.Errorf(api.CodeUnavailable, "node %s is an API front end (--role api): it keeps no warm pool's members", p.m.cfg.Node)
	}
	if from.Template != "" {
		return p.makeTemplateMember(ctx, pool, from.Org, from.Template)
	}
	src, cp, unlock, err := p.m.sourceCheckpoint(ctx, &api.ForkSource{Sandbox: from.Sandbox, Checkpoint: from.Checkpoint})
	if err != nil {
		return nil, err
	}
	defer unlock()
	sb, err := p.m.newRecord(ctx, api.CreateSandbox{})
	if err != nil {
		return nil, err
	}
	// The source's org's: a member counts against its pool_members quota,
	// finds its images, and is claimed by its forks alone.
	sb.Org = src.Org
	// A fork's settings (see checkpoints.Service.Fork), but no secrets: a
	// member gets those of the request that claims it.
	if err := p.m.takeFromCheckpoint(ctx, sb, cp, nil); err != nil {
		return nil, err
	}
	sb.From = &api.ForkSource{Sandbox: src.Name, Checkpoint: cp.ID}
	sb.Network = src.Network
	return p.bootMember(ctx, sb, pool, func(ctx context.Context) error { return p.m.machine.bootFork(ctx, sb, src, cp) })
}

// makeTemplateMember makes a member of org's pool of a template: a
// checkpoint template's sandbox (see createFromTemplate) or a built-in
// template's, with the daemon's default resources. It is org's: it counts
// against its pool_members quota and is claimed by its creates alone.
func (p *PoolCore) makeTemplateMember(ctx context.Context, pool, org, name string) (*store.Sandbox, error) {
	sb, err := p.m.newRecord(ctx, api.CreateSandbox{Template: name})
	if err != nil {
		return nil, err
	}
	sb.Org = org
	man, release, err := p.m.tpl.Use(org, name)
	if err != nil {
		return nil, err
	}
	if man != nil {
		defer release()
	}
	if man == nil {
		if err := p.m.checkTemplate(ctx, sb); err != nil {
			return nil, err
		}
		return p.bootMember(ctx, sb, pool, func(ctx context.Context) error { return p.m.machine.boot(ctx, sb, opCreate, true) })
	}
	sb.Template, sb.Image = man.Name, man.Image
	if man.Memory {
		sb.Resources = man.Resources
	}
	return p.bootMember(ctx, sb, pool, func(ctx context.Context) error { return p.m.machine.bootTemplate(ctx, sb, man, nil) })
}

// bootMember stores sb as a member of pool and boots it; a member that
// fails to boot is deleted.
func (p *PoolCore) bootMember(ctx context.Context, sb *store.Sandbox, pool string, boot func(context.Context) error) (*store.Sandbox, error) {
	sb.Pool = pool
	end, _ := p.m.begin(sb, opCreate)
	defer end()
	if err := p.m.insert(ctx, sb); err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	if err := boot(ctx); err != nil {
		p.DeletePoolMember(ctx, sb)
		return nil, publicError(err)
	}
	return sb, nil
}

// DeletePoolMember deletes a member that is not (or no longer) in a pool;
// a failure is logged.
func (p *PoolCore) DeletePoolMember(ctx context.Context, sb *store.Sandbox) {
	if err := p.m.destroy(ctx, sb); err != nil {
		p.m.log.Error("warm pool: deleting a member", "sandbox", sb.ID, "err", err)
	}
}

// ClaimPoolMember makes member, taken out of pool, the sandbox want
// describes (want's id, address and agent generation become the member's),
// stored and told who it is, and sets want to it. used says whether the
// member was taken:
//   - used: it is the user's sandbox now (v), or it failed and was deleted
//     (err, the request's failure, as a failed boot's);
//   - not used, err nil: it was no good (deleted, or being deleted); the
//     caller makes the sandbox the slow way;
//   - not used, err set: the request is refused (a name in use), and the
//     member is whole, for its pool to keep.
func (p *PoolCore) ClaimPoolMember(ctx context.Context, pool string, member, want *store.Sandbox, services []api.Service) (v *api.Sandbox, used bool, err error) {
	start := time.Now()
	claimed := *want
	claimed.ID, claimed.NetIndex, claimed.AgentGen = member.ID, member.NetIndex, member.AgentGen
	claimed.Node = member.Node
	// The update replaces the member's record as it was read: a member
	// another writer changed meanwhile (deleted, claimed) is refused.
	claimed.Version = member.Version
	// Creating until the agent is told who it is and its services run: a
	// crash before that leaves a sandbox recovery deletes (no sandbox, as
	// before the create), never one running without its services.
	claimed.State, claimed.Pool = api.StateCreating, ""
	claimed.CreatedAt = store.Now()
	store.AuditFrom(store.ReleaseAudit(ctx)).SetTarget("sandboxes/" + claimed.Name)
	end, err := p.m.begin(&claimed, opCreate)
	if err != nil {
		// A member has no operations; this one is being deleted.
		return nil, false, nil
	}
	defer end()
	ctx = context.WithoutCancel(ctx)
	if err := p.m.admit.claim(ctx, &claimed, func() error { return p.m.store.UpdateSandbox(ctx, &claimed) }); err != nil {
		var ae *api.Error
		if errors.Is(err, store.ErrExists) {
			return nil, false, api.Errorf(api.CodeConflict, "name %q is in use", claimed.Name)
		} else if errors.As(err, &ae) {
			return nil, false, err // over the org's quota: the member stays
		}
		p.m.log.Error("warm pool: claiming a member", "pool", pool, "sandbox", member.ID, "err", err)
		p.DeletePoolMember(ctx, member)
		return nil, false, nil
	}
	crash.Point("pool.claimed")
	// From here on it is the user's sandbox: a failure is the request's,
	// as a failed boot or restore is.
	fail := func(err error) (*api.Sandbox, bool, error) {
		p.m.log.Error("warm pool: handing over a member failed", "sandbox", claimed.ID, "err", err)
		if derr := p.m.destroy(ctx, &claimed); derr != nil {
			p.m.log.Error("cleaning up after a failed claim", "sandbox", claimed.ID, "err", derr)
		}
		return nil, true, publicError(fmt.Errorf("creating sandbox %s: %w", claimed.Name, err))
	}
	stored := time.Now()
	ep, err := p.m.Endpoint(&claimed)
	if err != nil {
		return fail(err)
	}
	if !reflect.DeepEqual(claimed.Network, member.Network) {
		if err := p.m.applyNetwork(ctx, &claimed); err != nil {
			return fail(err)
		}
	}
	if claimed.Resources.DiskMiB != member.Resources.DiskMiB {
		if err := p.m.machine.limitDisk(ctx, &claimed); err != nil {
			return fail(err)
		}
	}
	networked := time.Now()
	c, err := p.m.agents.within(ctx, &claimed, opCreate, ep, p.m.agents.token(&claimed))
	if err != nil {
		return fail(err)
	}
	err = p.m.agents.identify(c.Ctx, &claimed, ep, c.Agent)
	c.End()
	if err != nil {
		return fail(err)
	}
	if err := p.m.startServicesOrDelete(ctx, &claimed, services); err != nil {
		return nil, true, err
	}
	// The write that makes the create's change (see Create).
	if err := p.m.setState(store.ReleaseAudit(ctx), &claimed, api.StateRunning, ""); err != nil {
		return fail(err)
	}
	p.m.touch(claimed.ID)
	*want = claimed
	p.m.log.Info("sandbox made from a warm pool", "sandbox", claimed.ID, "name", claimed.Name, "pool", pool,
		"ms", time.Since(start).Milliseconds(), "store_ms", stored.Sub(start).Milliseconds(),
		"network_ms", networked.Sub(stored).Milliseconds(), "agent_ms", time.Since(networked).Milliseconds())
	return p.m.view(&claimed), true, nil
}

// noPools are the pools of a Manager made without any: none has a member,
// none is kept, and a member (there is none) would be deleted.
type noPools struct{ m *Manager }

func (noPools) Claim(context.Context, PoolSource, *store.Sandbox, []api.Service) (*api.Sandbox, bool, error) {
	return nil, false, nil
}
func (noPools) Keep(context.Context, PoolSource, int) error { return nil }
func (noPools) Forget(context.Context, PoolSource)          {}
func (p noPools) Lost(ctx context.Context, member *store.Sandbox) {
	NewPoolCore(p.m).DeletePoolMember(ctx, member)
}

// defaultResources reports whether a create asks for no CPUs or memory of
// its own: only such a create may take a template pool's member, made with
// the daemon's defaults (or a memory template's).
func defaultResources(req api.CreateSandbox) bool {
	return req.Resources == nil || req.Resources.CPUs == 0 && req.Resources.MemoryMiB == 0
}
