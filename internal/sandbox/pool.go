package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/store"
)

// Warm pools. A pool keeps sandboxes made ahead of time from a checkpoint
// (restored, as forks) or from a template (booted, or restored from a
// memory template), so that a fork or create that matches claims one
// instead of paying for a restore or a boot on the request's path. A member
// is a sandbox in every way but that the API does not show it (its record's
// Pool names its pool): it has its own id, disk, network namespace and
// agent, and claiming it keeps all of those and gives it the request's
// name, labels, env, network and secrets (the agent renames the host and
// rewrites the in-sandbox identity). Members are made one at a time in the
// background; a daemon that restarts deletes the members it finds (they
// are made again) but keeps the pools' sizes (pools.json).
//
// A pool never takes memory user work needs: it fills only while the host
// has its member's memory to spare above PoolReserveMiB, and when the
// host's available memory falls below that, members are deleted, the
// largest pool's first.

// poolFile keeps the pools' sizes in the data dir, so that they outlive a
// restart of the daemon.
const poolFile = "pools.json"

// poolRetry is how long a pool waits after failing to make a member before
// it tries again; poolTick how often pools are looked over (memory, refill).
const (
	poolRetry = 10 * time.Second
	poolTick  = 2 * time.Second
	// poolQuiet is how long after a claim a pool waits before it makes a
	// member again: a burst of forks is answered first, then refilled.
	poolQuiet = 300 * time.Millisecond
)

// poolConfig is what is kept of a pool: what its members are made from
// (sandbox and checkpoint ids, or a template) and how many.
type poolConfig struct {
	Sandbox    string `json:"sandbox,omitempty"`
	Checkpoint string `json:"checkpoint,omitempty"`
	Template   string `json:"template,omitempty"`
	Size       int    `json:"size"`
}

func (c poolConfig) key() string {
	if c.Template != "" {
		return templatePoolKey(c.Template)
	}
	return checkpointPoolKey(c.Sandbox, c.Checkpoint)
}

func checkpointPoolKey(sandboxID, cpID string) string { return "checkpoint:" + sandboxID + "/" + cpID }
func templatePoolKey(name string) string              { return "template:" + name }

// pool is a pool's state, under Manager.poolMu.
type pool struct {
	cfg      poolConfig
	ready    []*store.Sandbox // oldest first: claimed first
	starting int
	filling  bool // a filler runs
	claimed  int
	held     string    // why it is not filling (memory, the last failure)
	failedAt time.Time // when making a member last failed
	// memberBytes is the most memory a member was seen to hold, the
	// estimate of what the next one needs.
	memberBytes int64
	// claimedAt is when a member was last claimed.
	claimedAt time.Time
}

// pools is the Manager's pool state.
type pools struct {
	mu  sync.Mutex
	all map[string]*pool
	// ctx, under mu, is RunPools's: the fillers run under it, and none
	// starts once it has ended (or before RunPools set it); wg counts the
	// fillers, for RunPools to wait for them.
	ctx context.Context
	wg  sync.WaitGroup
	// make serialises the making of members across pools: one restore or
	// boot at a time is what the host's user work will not notice.
	make sync.Mutex
}

// MemoryMeter reads a running container's host memory. The gVisor runtime
// has it; a runtime without it reports pools' memory as 0.
type MemoryMeter interface {
	MemoryBytes(id string) (int64, error)
}

// LoadPools reads the pools' sizes, kept by the last daemon. Call it after
// Recover, which deleted the members a previous daemon left, and before
// the API is served (a pool set then is kept, not read over); RunPools
// fills them.
func (m *Manager) LoadPools() error {
	b, err := os.ReadFile(filepath.Join(m.cfg.DataDir, poolFile))
	var cfgs []poolConfig
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("reading pools: %w", err)
	default:
		if err := json.Unmarshal(b, &cfgs); err != nil {
			return fmt.Errorf("reading pools: %s: %w", poolFile, err)
		}
	}
	m.pools.mu.Lock()
	for _, c := range cfgs {
		if c.Size > 0 {
			m.pools.all[c.key()] = &pool{cfg: c}
		}
	}
	m.pools.mu.Unlock()
	return nil
}

// RunPools keeps the pools filled until ctx ends: every poolTick it frees
// memory when the host is short of it, and starts filling the pools below
// their size. The daemon runs it as a component. When ctx ends it waits
// for the members being made, and deletes the members: unlike sandboxes,
// they are not worth keeping across a restart of the daemon (a crash
// leaves them to the next daemon's Recover). The pools' sizes are kept.
// It returns nil then; it runs once per Manager.
func (m *Manager) RunPools(ctx context.Context) error {
	m.pools.mu.Lock()
	if m.pools.ctx != nil {
		m.pools.mu.Unlock()
		return errors.New("running warm pools: they run already")
	}
	m.pools.ctx = ctx
	m.pools.mu.Unlock()
	t := time.NewTicker(poolTick)
	defer t.Stop()
	for ctx.Err() == nil {
		m.shrinkPools(ctx)
		m.pools.mu.Lock()
		for key := range m.pools.all {
			m.fillLocked(key)
		}
		m.pools.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	// ctx has ended, so no filler starts after this lock is taken
	// (fillLocked checks it under the lock), and every one that started
	// before has been counted: the wait cannot miss one.
	m.pools.mu.Lock()
	m.pools.mu.Unlock()
	m.pools.wg.Wait()
	m.pools.mu.Lock()
	var members []*store.Sandbox
	for _, p := range m.pools.all {
		members = append(members, p.ready...)
		p.ready = nil
	}
	m.pools.mu.Unlock()
	for _, sb := range members {
		m.deleteMember(context.WithoutCancel(ctx), sb)
	}
	return nil
}

// fillLocked starts a filler for pool key unless one runs or the pool is
// full or waiting out a failure. m.pools.mu is held.
func (m *Manager) fillLocked(key string) {
	p := m.pools.all[key]
	if p == nil || p.filling || m.pools.ctx == nil || m.pools.ctx.Err() != nil ||
		len(p.ready)+p.starting >= p.cfg.Size || time.Since(p.failedAt) < poolRetry {
		return
	}
	p.filling = true
	m.pools.wg.Add(1)
	go m.fill(m.pools.ctx, key)
}

// fill makes members of pool key, under ctx (RunPools's), one at a time, until it is full, gone,
// short of memory, or making one failed.
func (m *Manager) fill(ctx context.Context, key string) {
	defer m.pools.wg.Done()
	for {
		m.pools.mu.Lock()
		p := m.pools.all[key]
		if p == nil {
			m.pools.mu.Unlock()
			return
		}
		if ctx.Err() != nil || len(p.ready)+p.starting >= p.cfg.Size {
			p.filling = false
			m.pools.mu.Unlock()
			return
		}
		if short := m.memoryShort(p); short != "" {
			p.held, p.filling = short, false
			m.pools.mu.Unlock()
			return
		}
		if wait := poolQuiet - time.Since(p.claimedAt); wait > 0 {
			m.pools.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			continue
		}
		p.starting++
		cfg := p.cfg
		m.pools.mu.Unlock()

		m.pools.make.Lock()
		start := time.Now()
		sb, err := m.makeMember(ctx, key, cfg)
		m.pools.make.Unlock()
		var used int64
		if err == nil {
			used = m.memberMemory(sb.ID)
		}

		m.pools.mu.Lock()
		p.starting--
		if m.pools.all[key] != p || len(p.ready) >= p.cfg.Size || err != nil {
			if err != nil {
				p.held, p.failedAt, p.filling = "making a member failed: "+err.Error(), time.Now(), false
			}
			m.pools.mu.Unlock()
			if errors.Is(err, api.ErrNotFound) {
				// Its checkpoint, sandbox or template is gone (a pool kept
				// across a restart that missed the delete): no pool.
				m.log.Warn("warm pool: its source is gone; dropping it", "pool", key, "err", err)
				m.dropPools(context.WithoutCancel(ctx), func(c poolConfig) bool { return c.key() == key })
				return
			}
			if err != nil {
				m.log.Error("warm pool: making a member failed", "pool", key, "err", err)
				return
			}
			// Drained or shrunk meanwhile: the member is not wanted.
			m.deleteMember(context.WithoutCancel(ctx), sb)
			continue
		}
		p.ready = append(p.ready, sb)
		p.held = ""
		p.memberBytes = max(p.memberBytes, used)
		m.pools.mu.Unlock()
		m.log.Info("warm pool: member ready", "pool", key, "sandbox", sb.ID, "ms", time.Since(start).Milliseconds())
	}
}

// makeMember makes one member of a pool, stored and running, or nothing.
func (m *Manager) makeMember(ctx context.Context, key string, cfg poolConfig) (*store.Sandbox, error) {
	if cfg.Template != "" {
		return m.makeTemplateMember(ctx, key, cfg.Template)
	}
	src, cp, unlock, err := m.sourceCheckpoint(ctx, &api.ForkSource{Sandbox: cfg.Sandbox, Checkpoint: cfg.Checkpoint})
	if err != nil {
		return nil, err
	}
	defer unlock()
	sb, err := m.newRecord(ctx, api.CreateSandbox{})
	if err != nil {
		return nil, err
	}
	// A fork's settings (see fork), but no secrets: a member gets those of
	// the request that claims it.
	if err := m.takeFromCheckpoint(ctx, sb, cp, nil); err != nil {
		return nil, err
	}
	sb.From = &api.ForkSource{Sandbox: src.Name, Checkpoint: cp.ID}
	sb.Network = src.Network
	return m.bootMember(ctx, sb, key, func(ctx context.Context) error { return m.bootFork(ctx, sb, src, cp) })
}

// makeTemplateMember makes a member of a template's pool: a checkpoint
// template's sandbox (see createFromTemplate) or a built-in template's,
// with the daemon's default resources.
func (m *Manager) makeTemplateMember(ctx context.Context, key, name string) (*store.Sandbox, error) {
	sb, err := m.newRecord(ctx, api.CreateSandbox{Template: name})
	if err != nil {
		return nil, err
	}
	man, release, err := m.tpl.Use(name)
	if err != nil {
		return nil, err
	}
	if man != nil {
		defer release()
	}
	if man == nil {
		if err := m.checkTemplate(ctx, sb); err != nil {
			return nil, err
		}
		return m.bootMember(ctx, sb, key, func(ctx context.Context) error { return m.boot(ctx, sb, true) })
	}
	sb.Template, sb.Image = man.Name, man.Image
	if man.Memory {
		sb.Resources = man.Resources
	}
	return m.bootMember(ctx, sb, key, func(ctx context.Context) error { return m.bootTemplate(ctx, sb, man, nil) })
}

// bootMember stores sb as a member of pool key and boots it; a member that
// fails to boot is deleted.
func (m *Manager) bootMember(ctx context.Context, sb *store.Sandbox, key string, boot func(context.Context) error) (*store.Sandbox, error) {
	sb.Pool = key
	end, _ := m.begin(sb, opCreate)
	defer end()
	if err := m.insert(ctx, sb); err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	if err := boot(ctx); err != nil {
		m.deleteMember(ctx, sb)
		return nil, publicError(err)
	}
	return sb, nil
}

// deleteMember deletes a member that is not (or no longer) in a pool.
func (m *Manager) deleteMember(ctx context.Context, sb *store.Sandbox) {
	if err := m.destroy(ctx, sb); err != nil {
		m.log.Error("warm pool: deleting a member", "sandbox", sb.ID, "err", err)
	}
}

// claimMember gives want a member of pool key, if it has one ready: the
// member becomes the sandbox want describes (want's id, address and agent
// generation become the member's), stored and told who it is. ok is false
// when there was no member to take, or the one taken was no good: the
// caller then makes the sandbox the slow way. A name in use is the
// caller's conflict, and the member goes back.
func (m *Manager) claimMember(ctx context.Context, key string, want *store.Sandbox, services []api.Service) (v *api.Sandbox, ok bool, err error) {
	m.pools.mu.Lock()
	p := m.pools.all[key]
	if p == nil || len(p.ready) == 0 {
		m.pools.mu.Unlock()
		return nil, false, nil
	}
	mem := p.ready[0]
	p.ready = p.ready[1:]
	p.claimedAt = time.Now()
	m.pools.mu.Unlock()
	// The next member is made once this one is handed over: a restore
	// beside the claim would take the CPU it needs.
	defer func() {
		m.pools.mu.Lock()
		m.fillLocked(key)
		m.pools.mu.Unlock()
	}()

	start := time.Now()
	claimed := *want
	claimed.ID, claimed.NetIndex, claimed.AgentGen = mem.ID, mem.NetIndex, mem.AgentGen
	// Creating until the agent is told who it is and its services run: a
	// crash before that leaves a sandbox recovery deletes (no sandbox, as
	// before the create), never one running without its services.
	claimed.State, claimed.Pool = api.StateCreating, ""
	claimed.CreatedAt = store.Now()
	end, err := m.begin(&claimed, opCreate)
	if err != nil {
		// A member has no operations; this one is being deleted.
		return nil, false, nil
	}
	defer end()
	ctx = context.WithoutCancel(ctx)
	if err := m.store.UpdateSandbox(ctx, &claimed); err != nil {
		if errors.Is(err, store.ErrExists) {
			m.returnMember(key, mem)
			return nil, true, api.Errorf(api.CodeConflict, "name %q is in use", claimed.Name)
		}
		m.log.Error("warm pool: claiming a member", "pool", key, "sandbox", mem.ID, "err", err)
		m.deleteMember(ctx, mem)
		return nil, false, nil
	}
	crash.Point("pool.claimed")
	// From here on it is the user's sandbox: a failure is the request's,
	// as a failed boot or restore is.
	fail := func(err error) (*api.Sandbox, bool, error) {
		m.log.Error("warm pool: handing over a member failed", "sandbox", claimed.ID, "err", err)
		if derr := m.destroy(ctx, &claimed); derr != nil {
			m.log.Error("cleaning up after a failed claim", "sandbox", claimed.ID, "err", derr)
		}
		return nil, true, publicError(fmt.Errorf("creating sandbox %s: %w", claimed.Name, err))
	}
	stored := time.Now()
	ep, err := m.Endpoint(&claimed)
	if err != nil {
		return fail(err)
	}
	if !reflect.DeepEqual(claimed.Network, mem.Network) {
		if err := m.applyNetwork(ctx, &claimed); err != nil {
			return fail(err)
		}
	}
	if claimed.Resources.DiskMiB != mem.Resources.DiskMiB {
		if err := m.limitDisk(ctx, &claimed); err != nil {
			return fail(err)
		}
	}
	networked := time.Now()
	if err := m.identify(ctx, &claimed, ep, m.agentClient(ep, m.agentToken(&claimed))); err != nil {
		return fail(err)
	}
	if err := m.startServicesOrDelete(ctx, &claimed, services); err != nil {
		return nil, true, err
	}
	if err := m.setState(ctx, &claimed, api.StateRunning, ""); err != nil {
		return fail(err)
	}
	m.touch(claimed.ID)
	*want = claimed
	m.pools.mu.Lock()
	if p := m.pools.all[key]; p != nil {
		p.claimed++
	}
	m.pools.mu.Unlock()
	m.log.Info("sandbox made from a warm pool", "sandbox", claimed.ID, "name", claimed.Name, "pool", key,
		"ms", time.Since(start).Milliseconds(), "store_ms", stored.Sub(start).Milliseconds(),
		"network_ms", networked.Sub(stored).Milliseconds(), "agent_ms", time.Since(networked).Milliseconds())
	return m.view(&claimed), true, nil
}

// returnMember puts an unused member back at the front of its pool, or
// deletes it if the pool is gone or full.
func (m *Manager) returnMember(key string, sb *store.Sandbox) {
	m.pools.mu.Lock()
	p := m.pools.all[key]
	if p != nil && len(p.ready)+p.starting < p.cfg.Size {
		p.ready = append([]*store.Sandbox{sb}, p.ready...)
		m.pools.mu.Unlock()
		return
	}
	m.pools.mu.Unlock()
	m.deleteMember(context.Background(), sb)
}

// SetCheckpointPool keeps a warm pool of size forks of a checkpoint; 0
// drains it.
func (m *Manager) SetCheckpointPool(ctx context.Context, ref, cpRef string, size int) (*api.Pool, error) {
	if err := checkPoolSize(size); err != nil {
		return nil, err
	}
	src, cp, unlock, err := m.sourceCheckpoint(ctx, &api.ForkSource{Sandbox: ref, Checkpoint: cpRef})
	if err != nil {
		return nil, err
	}
	defer unlock()
	return m.setPool(ctx, poolConfig{Sandbox: src.ID, Checkpoint: cp.ID, Size: size})
}

// CheckpointPool reports a checkpoint's warm pool (size 0 when it has none).
func (m *Manager) CheckpointPool(ctx context.Context, ref, cpRef string) (*api.Pool, error) {
	src, cp, unlock, err := m.sourceCheckpoint(ctx, &api.ForkSource{Sandbox: ref, Checkpoint: cpRef})
	if err != nil {
		return nil, err
	}
	defer unlock()
	return m.poolView(poolConfig{Sandbox: src.ID, Checkpoint: cp.ID}), nil
}

// SetTemplatePool keeps a warm pool of size sandboxes of a template: a
// built-in one (made with the daemon's default resources) or a checkpoint
// template. 0 drains it.
func (m *Manager) SetTemplatePool(ctx context.Context, name string, size int) (*api.Pool, error) {
	if err := checkPoolSize(size); err != nil {
		return nil, err
	}
	if err := m.poolTemplate(ctx, name); err != nil {
		return nil, err
	}
	return m.setPool(ctx, poolConfig{Template: name, Size: size})
}

// TemplatePool reports a template's warm pool (size 0 when it has none).
func (m *Manager) TemplatePool(ctx context.Context, name string) (*api.Pool, error) {
	if err := m.poolTemplate(ctx, name); err != nil {
		return nil, err
	}
	return m.poolView(poolConfig{Template: name}), nil
}

// poolTemplate checks that a template can have a pool.
func (m *Manager) poolTemplate(ctx context.Context, name string) error {
	if m.tpl.Builtin(name) {
		return nil
	}
	man, err := m.tpl.Kept(name)
	if err != nil {
		return err
	}
	if man == nil {
		return api.Errorf(api.CodeNotFound, "template %q not found (images have no pools: make a template of one with loam template build)", name)
	}
	return nil
}

func checkPoolSize(size int) error {
	if size < 0 || size > api.MaxPoolSize {
		return api.Errorf(api.CodeInvalid, "size: %d; a pool keeps 0 to %d sandboxes", size, api.MaxPoolSize)
	}
	return nil
}

// setPool sets a pool's size, stores the sizes, and starts filling it or
// deletes the members beyond the size.
func (m *Manager) setPool(ctx context.Context, cfg poolConfig) (*api.Pool, error) {
	key := cfg.key()
	m.pools.mu.Lock()
	p := m.pools.all[key]
	old := 0
	if p != nil {
		old = p.cfg.Size
	}
	if cfg.Size == 0 {
		delete(m.pools.all, key)
	} else if p == nil {
		p = &pool{cfg: cfg}
		m.pools.all[key] = p
	}
	var extra []*store.Sandbox
	if p != nil {
		p.cfg.Size = cfg.Size
		if n := len(p.ready) - cfg.Size; n > 0 {
			extra = p.ready[cfg.Size:]
			p.ready = slices.Clone(p.ready[:cfg.Size])
		}
		p.held, p.failedAt = "", time.Time{}
	}
	err := m.savePoolsLocked()
	if err != nil {
		// Not kept: put the old size back, as if the call had not come.
		if old == 0 {
			delete(m.pools.all, key)
		} else {
			p.cfg.Size = old
			m.pools.all[key] = p
			p.ready = append(p.ready, extra...)
			extra = nil
		}
	}
	if cfg.Size > 0 {
		m.fillLocked(key)
	}
	m.pools.mu.Unlock()
	for _, sb := range extra {
		m.deleteMember(context.WithoutCancel(ctx), sb)
	}
	if err != nil {
		return nil, err
	}
	m.log.Info("warm pool set", "pool", key, "size", cfg.Size)
	return m.poolView(cfg), nil
}

// dropPools drains and removes every pool whose members are made from
// what match says: a checkpoint or sandbox being deleted, a template.
func (m *Manager) dropPools(ctx context.Context, match func(poolConfig) bool) {
	m.pools.mu.Lock()
	var members []*store.Sandbox
	changed := false
	for key, p := range m.pools.all {
		if match(p.cfg) {
			members = append(members, p.ready...)
			delete(m.pools.all, key)
			changed = true
		}
	}
	if changed {
		if err := m.savePoolsLocked(); err != nil {
			m.log.Error("warm pool: storing the pools", "err", err)
		}
	}
	m.pools.mu.Unlock()
	for _, sb := range members {
		m.deleteMember(context.WithoutCancel(ctx), sb)
	}
}

// savePoolsLocked writes the pools' sizes whole. m.pools.mu is held.
func (m *Manager) savePoolsLocked() error {
	cfgs := []poolConfig{}
	for _, p := range m.pools.all {
		cfgs = append(cfgs, p.cfg)
	}
	slices.SortFunc(cfgs, func(a, b poolConfig) int { return strings.Compare(a.key(), b.key()) })
	b, err := json.MarshalIndent(cfgs, "", "\t")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(m.cfg.DataDir, poolFile), b, 0o600); err != nil {
		return fmt.Errorf("storing pools: %w", err)
	}
	return nil
}

// poolView is the API's view of the pool cfg names.
func (m *Manager) poolView(cfg poolConfig) *api.Pool {
	v := &api.Pool{Template: cfg.Template}
	if cfg.Template == "" {
		v.From = &api.ForkSource{Sandbox: cfg.Sandbox, Checkpoint: cfg.Checkpoint}
	}
	m.pools.mu.Lock()
	p := m.pools.all[cfg.key()]
	var ids []string
	if p != nil {
		v.Size, v.Ready, v.Starting, v.Claimed, v.Held = p.cfg.Size, len(p.ready), p.starting, p.claimed, p.held
		for _, sb := range p.ready {
			ids = append(ids, sb.ID)
		}
	}
	m.pools.mu.Unlock()
	for _, id := range ids {
		v.MemoryBytes += m.memberMemory(id)
	}
	return v
}

// memberMemory is the host memory container id holds, 0 if unknown.
func (m *Manager) memberMemory(id string) int64 {
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

// memoryShort says why pool p may not make a member now, or "" if it may:
// the host must have the member's memory (the most a member was seen to
// hold; the checkpoint's memory image or the sandbox's memory limit before
// any was) to spare above the reserve.
func (m *Manager) memoryShort(p *pool) string {
	avail, err := m.memAvailable()
	if err != nil || avail < 0 {
		return ""
	}
	need := p.memberBytes
	if need == 0 {
		need = m.memberEstimate(p.cfg)
	}
	reserve := int64(m.cfg.PoolReserveMiB) << 20
	if avail-need < reserve {
		return fmt.Sprintf("host memory is short: %d MiB available, a member needs about %d MiB and %d MiB are kept for sandboxes",
			avail>>20, need>>20, reserve>>20)
	}
	return ""
}

// memberEstimate is what a first member of a pool is expected to hold.
func (m *Manager) memberEstimate(cfg poolConfig) int64 {
	if cfg.Checkpoint != "" {
		if n := checkpoint.TreeBytes(filepath.Join(m.checkpointDir(cfg.Sandbox, cfg.Checkpoint), memDir)); n > 0 {
			return n
		}
	}
	if cfg.Template != "" {
		if n := checkpoint.TreeBytes(m.tpl.MemDir(cfg.Template)); n > 0 {
			return n
		}
	}
	return 64 << 20
}

// shrinkPools deletes ready members, from the pool holding the most
// memory, while the host's available memory is below the reserve.
func (m *Manager) shrinkPools(ctx context.Context) {
	for ctx.Err() == nil {
		avail, err := m.memAvailable()
		if err != nil || avail < 0 || avail >= int64(m.cfg.PoolReserveMiB)<<20 {
			return
		}
		m.pools.mu.Lock()
		var victim *pool
		for _, p := range m.pools.all {
			if len(p.ready) > 0 && (victim == nil || int64(len(p.ready))*p.memberBytes > int64(len(victim.ready))*victim.memberBytes) {
				victim = p
			}
		}
		if victim == nil {
			m.pools.mu.Unlock()
			return
		}
		sb := victim.ready[len(victim.ready)-1]
		victim.ready = victim.ready[:len(victim.ready)-1]
		victim.held = fmt.Sprintf("host memory is short: %d MiB available, %d MiB are kept for sandboxes", avail>>20, m.cfg.PoolReserveMiB)
		key := victim.cfg.key()
		m.pools.mu.Unlock()
		m.log.Warn("warm pool: host memory is short; deleting a member", "pool", key, "sandbox", sb.ID, "available_mib", avail>>20)
		m.deleteMember(context.WithoutCancel(ctx), sb)
	}
}

// memAvailable is the host's available memory in bytes (Config.MemAvailable
// or /proc/meminfo's MemAvailable); -1 when unknown.
func (m *Manager) memAvailable() (int64, error) {
	if m.cfg.MemAvailable != nil {
		return m.cfg.MemAvailable()
	}
	return procMemAvailable()
}

func procMemAvailable() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return -1, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return -1, fmt.Errorf("reading MemAvailable: %w", err)
			}
			return kb << 10, nil
		}
	}
	return -1, sc.Err()
}

// defaultResources reports whether a create asks for no CPUs or memory of
// its own: only such a create may take a template pool's member, made with
// the daemon's defaults (or a memory template's).
func defaultResources(req api.CreateSandbox) bool {
	return req.Resources == nil || req.Resources.CPUs == 0 && req.Resources.MemoryMiB == 0
}
