// Package warmpool keeps warm pools: sandboxes made ahead of time from a
// checkpoint (restored, as forks) or from a template (booted, or restored
// from a memory template), so that a fork or create that matches claims one
// instead of paying for a restore or a boot on the request's path.
//
// A member is a sandbox in every way but that the API does not show it (its
// record's Pool names its pool): it has its own id, disk, network namespace
// and agent, and claiming it keeps all of those and gives it the request's
// name, labels, env, network and secrets (the agent renames the host and
// rewrites the in-sandbox identity). The core (package sandbox) makes,
// deletes and hands over members (Core); this package decides when, keeps
// the ready ones, and answers the core's claims (sandbox.Pools). Members
// are made one at a time in the background (Run); a daemon that restarts
// deletes the members it finds (the core's Recover: they are made again)
// but keeps the pools' sizes (pools.json, Load).
//
// A pool never takes memory user work needs: it fills only while the host
// has its member's memory to spare above Config.ReserveMiB, and when the
// host's available memory falls below that, members are deleted, the
// largest pool's first.
package warmpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/host"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/store"
)

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

// Core is what the pools need of the sandbox core (sandbox.PoolCore): to
// find what members are made from, and to make, hand over and delete them.
type Core interface {
	// PoolCheckpoint finds the checkpoint the user's references name and
	// holds it until unlock; PoolTemplate checks that a template of the
	// caller's org may have a pool, and names that org's pool of it.
	PoolCheckpoint(ctx context.Context, ref, cpRef string) (from sandbox.PoolSource, unlock func(), err error)
	PoolTemplate(ctx context.Context, name string) (sandbox.PoolSource, error)
	// MakePoolMember makes a member of pool from what from names, stored
	// and running (api.ErrNotFound: from is gone); DeletePoolMember deletes
	// one.
	MakePoolMember(ctx context.Context, from sandbox.PoolSource, pool string) (*store.Sandbox, error)
	DeletePoolMember(ctx context.Context, member *store.Sandbox)
	// ClaimPoolMember makes member the sandbox want describes; used says
	// whether the member was taken (see sandbox.PoolCore.ClaimPoolMember).
	ClaimPoolMember(ctx context.Context, pool string, member, want *store.Sandbox, services []api.Service) (v *api.Sandbox, used bool, err error)
	// ContainerMemory is the host memory a member holds (0 if unknown);
	// MemoryImageBytes the size of the memory image one of from is
	// restored from (0 if none).
	ContainerMemory(id string) int64
	MemoryImageBytes(from sandbox.PoolSource) int64
}

// Config is the pools' configuration.
type Config struct {
	// DataDir is the daemon's data dir, where pools.json is kept.
	DataDir string
	// ReserveMiB is the host memory warm pools leave to sandboxes (1024 MiB
	// unless set): a pool fills only while more is available, and gives
	// members up when less is. MemAvailable reads the host's available
	// memory; nil reads /proc/meminfo.
	ReserveMiB   int
	MemAvailable func() (int64, error)
	// Org is the daemon's own org (loam serve --org): a template pool kept
	// before pools were each org's is its.
	Org string
}

// config is what is kept of a pool (an entry of pools.json): what its
// members are made from (sandbox and checkpoint ids, or an org's template)
// and how many.
type config struct {
	Sandbox    string `json:"sandbox,omitempty"`
	Checkpoint string `json:"checkpoint,omitempty"`
	Org        string `json:"org,omitempty"`
	Template   string `json:"template,omitempty"`
	Size       int    `json:"size"`
}

func configOf(from sandbox.PoolSource, size int) config {
	return config{Sandbox: from.Sandbox, Checkpoint: from.Checkpoint, Org: from.Org, Template: from.Template, Size: size}
}

func (c config) source() sandbox.PoolSource {
	return sandbox.PoolSource{Sandbox: c.Sandbox, Checkpoint: c.Checkpoint, Org: c.Org, Template: c.Template}
}

// key names a pool: in the pools' map and in its members' records (Pool).
// Each org has its own pool of a template, built-ins included.
func (c config) key() string {
	if c.Template != "" {
		return "template:" + c.Org + "/" + c.Template
	}
	return "checkpoint:" + c.Sandbox + "/" + c.Checkpoint
}

// pool is a pool's state, under Pools.mu.
type pool struct {
	cfg      config
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

// Pools are the daemon's warm pools. Make them with New (given as the
// core's sandbox.Config.Pools), read the kept sizes with Load, and Run
// them; the API sets and reads them (SetCheckpointPool and the rest), and
// the core claims their members (sandbox.Pools).
type Pools struct {
	core Core
	cfg  Config
	log  *slog.Logger

	mu  sync.Mutex
	all map[string]*pool
	// ctx, under mu, is Run's: the fillers run under it, and none starts
	// once it has ended (or before Run set it); wg counts the fillers, for
	// Run to wait for them.
	ctx context.Context
	wg  sync.WaitGroup
	// make serialises the making of members across pools: one restore or
	// boot at a time is what the host's user work will not notice.
	make sync.Mutex
}

var _ sandbox.Pools = (*Pools)(nil)

// New makes the pools, empty, over core.
func New(core Core, cfg Config, log *slog.Logger) *Pools {
	if cfg.ReserveMiB == 0 {
		cfg.ReserveMiB = 1024
	}
	return &Pools{core: core, cfg: cfg, log: log, all: map[string]*pool{}}
}

// Load reads the pools' sizes, kept by the last daemon. Call it after the
// core's Recover, which deleted the members a previous daemon left, and
// before the API is served (a pool set then is kept, not read over); Run
// fills them.
func (ps *Pools) Load() error {
	b, err := os.ReadFile(filepath.Join(ps.cfg.DataDir, poolFile))
	var cfgs []config
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("reading pools: %w", err)
	default:
		if err := json.Unmarshal(b, &cfgs); err != nil {
			return fmt.Errorf("reading pools: %s: %w", poolFile, err)
		}
	}
	ps.mu.Lock()
	for _, c := range cfgs {
		if c.Template != "" && c.Org == "" {
			c.Org = ps.cfg.Org
		}
		if c.Size > 0 {
			ps.all[c.key()] = &pool{cfg: c}
		}
	}
	ps.mu.Unlock()
	return nil
}

// Run keeps the pools filled until ctx ends: every poolTick it frees
// memory when the host is short of it, and starts filling the pools below
// their size. The daemon runs it as a component. When ctx ends it waits
// for the members being made, and deletes the members: unlike sandboxes,
// they are not worth keeping across a restart of the daemon (a crash
// leaves them to the next daemon's Recover). The pools' sizes are kept.
// It returns nil then; it runs once per Pools.
func (ps *Pools) Run(ctx context.Context) error {
	ps.mu.Lock()
	if ps.ctx != nil {
		ps.mu.Unlock()
		return errors.New("running warm pools: they run already")
	}
	ps.ctx = ctx
	ps.mu.Unlock()
	t := time.NewTicker(poolTick)
	defer t.Stop()
	for ctx.Err() == nil {
		ps.shrink(ctx)
		ps.mu.Lock()
		for key := range ps.all {
			ps.fillLocked(key)
		}
		ps.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	// ctx has ended, so no filler starts after this lock is taken
	// (fillLocked checks it under the lock), and every one that started
	// before has been counted: the wait cannot miss one.
	ps.mu.Lock()
	ps.mu.Unlock()
	ps.wg.Wait()
	ps.mu.Lock()
	var members []*store.Sandbox
	for _, p := range ps.all {
		members = append(members, p.ready...)
		p.ready = nil
	}
	ps.mu.Unlock()
	for _, sb := range members {
		ps.core.DeletePoolMember(context.WithoutCancel(ctx), sb)
	}
	return nil
}

// fillLocked starts a filler for pool key unless one runs or the pool is
// full or waiting out a failure. ps.mu is held.
func (ps *Pools) fillLocked(key string) {
	p := ps.all[key]
	if p == nil || p.filling || ps.ctx == nil || ps.ctx.Err() != nil ||
		len(p.ready)+p.starting >= p.cfg.Size || time.Since(p.failedAt) < poolRetry {
		return
	}
	p.filling = true
	ps.wg.Add(1)
	go ps.fill(ps.ctx, key)
}

// fill makes members of pool key, under ctx (Run's), one at a time, until
// it is full, gone, short of memory, or making one failed.
func (ps *Pools) fill(ctx context.Context, key string) {
	defer ps.wg.Done()
	for {
		ps.mu.Lock()
		p := ps.all[key]
		if p == nil {
			ps.mu.Unlock()
			return
		}
		if ctx.Err() != nil || len(p.ready)+p.starting >= p.cfg.Size {
			p.filling = false
			ps.mu.Unlock()
			return
		}
		if short := ps.memoryShort(p); short != "" {
			p.held, p.filling = short, false
			ps.mu.Unlock()
			return
		}
		if wait := poolQuiet - time.Since(p.claimedAt); wait > 0 {
			ps.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			continue
		}
		p.starting++
		cfg := p.cfg
		ps.mu.Unlock()

		ps.make.Lock()
		start := time.Now()
		sb, err := ps.core.MakePoolMember(ctx, cfg.source(), key)
		ps.make.Unlock()
		var used int64
		if err == nil {
			used = ps.core.ContainerMemory(sb.ID)
		}

		ps.mu.Lock()
		p.starting--
		if ps.all[key] != p || len(p.ready) >= p.cfg.Size || err != nil {
			if err != nil {
				p.held, p.failedAt, p.filling = "making a member failed: "+err.Error(), time.Now(), false
			}
			ps.mu.Unlock()
			if errors.Is(err, api.ErrNotFound) {
				// Its checkpoint, sandbox or template is gone (a pool kept
				// across a restart that missed the delete): no pool.
				ps.log.Warn("warm pool: its source is gone; dropping it", "pool", key, "err", err)
				ps.drop(context.WithoutCancel(ctx), func(c config) bool { return c.key() == key })
				return
			}
			if err != nil {
				ps.log.Error("warm pool: making a member failed", "pool", key, "err", err)
				return
			}
			// Drained or shrunk meanwhile: the member is not wanted.
			ps.core.DeletePoolMember(context.WithoutCancel(ctx), sb)
			continue
		}
		p.ready = append(p.ready, sb)
		p.held = ""
		p.memberBytes = max(p.memberBytes, used)
		ps.mu.Unlock()
		ps.log.Info("warm pool: member ready", "pool", key, "sandbox", sb.ID, "ms", time.Since(start).Milliseconds())
	}
}

// Claim gives want a member of from's pool, if it has one ready: the core
// makes it the sandbox want describes (sandbox.PoolCore.ClaimPoolMember).
// ok is false when there was no member to take, or the one taken was no
// good: the caller then makes the sandbox the slow way. A name in use is
// the caller's conflict, and the member goes back.
func (ps *Pools) Claim(ctx context.Context, from sandbox.PoolSource, want *store.Sandbox, services []api.Service) (v *api.Sandbox, ok bool, err error) {
	key := configOf(from, 0).key()
	ps.mu.Lock()
	p := ps.all[key]
	if p == nil || len(p.ready) == 0 {
		ps.mu.Unlock()
		return nil, false, nil
	}
	mem := p.ready[0]
	p.ready = p.ready[1:]
	p.claimedAt = time.Now()
	ps.mu.Unlock()
	// The next member is made once this one is handed over: a restore
	// beside the claim would take the CPU it needs.
	defer func() {
		ps.mu.Lock()
		ps.fillLocked(key)
		ps.mu.Unlock()
	}()
	v, used, err := ps.core.ClaimPoolMember(ctx, key, mem, want, services)
	if !used {
		if err != nil {
			ps.giveBack(key, mem)
			return nil, true, err
		}
		return nil, false, nil
	}
	if err == nil {
		ps.mu.Lock()
		if p := ps.all[key]; p != nil {
			p.claimed++
		}
		ps.mu.Unlock()
	}
	return v, true, err
}

// giveBack puts an unused member back at the front of its pool, or
// deletes it if the pool is gone or full.
func (ps *Pools) giveBack(key string, sb *store.Sandbox) {
	ps.mu.Lock()
	p := ps.all[key]
	if p != nil && len(p.ready)+p.starting < p.cfg.Size {
		p.ready = append([]*store.Sandbox{sb}, p.ready...)
		ps.mu.Unlock()
		return
	}
	ps.mu.Unlock()
	ps.core.DeletePoolMember(context.Background(), sb)
}

// Lost takes member, whose sandbox process died, out of its pool, deletes
// it, and has the pool make another (sandbox.Pools).
func (ps *Pools) Lost(ctx context.Context, member *store.Sandbox) {
	ps.mu.Lock()
	var key string
	for k, p := range ps.all {
		if i := slices.IndexFunc(p.ready, func(r *store.Sandbox) bool { return r.ID == member.ID }); i >= 0 {
			p.ready = slices.Delete(p.ready, i, i+1)
			key = k
		}
	}
	ps.mu.Unlock()
	ps.core.DeletePoolMember(ctx, member)
	if key != "" {
		ps.mu.Lock()
		ps.fillLocked(key)
		ps.mu.Unlock()
	}
}

// Forget drains and removes the pools of what gone names: a sandbox's
// (every checkpoint's of it), a checkpoint's, an org's template's, or
// every template pool of an org (sandbox.Pools).
func (ps *Pools) Forget(ctx context.Context, gone sandbox.PoolSource) {
	ps.drop(ctx, func(c config) bool {
		if gone.Org != "" {
			return c.Template != "" && c.Org == gone.Org && (gone.Template == "" || c.Template == gone.Template)
		}
		return c.Template == "" && c.Sandbox == gone.Sandbox && (gone.Checkpoint == "" || c.Checkpoint == gone.Checkpoint)
	})
}

// Keep keeps a pool of size members of from; 0 drains it (sandbox.Pools).
func (ps *Pools) Keep(ctx context.Context, from sandbox.PoolSource, size int) error {
	_, err := ps.set(ctx, configOf(from, size))
	return err
}

// SetCheckpointPool keeps a warm pool of size forks of a checkpoint; 0
// drains it.
func (ps *Pools) SetCheckpointPool(ctx context.Context, ref, cpRef string, size int) (*api.Pool, error) {
	if err := api.CheckPoolSize(size); err != nil {
		return nil, err
	}
	from, unlock, err := ps.core.PoolCheckpoint(ctx, ref, cpRef)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return ps.set(ctx, configOf(from, size))
}

// CheckpointPool reports a checkpoint's warm pool (size 0 when it has none).
func (ps *Pools) CheckpointPool(ctx context.Context, ref, cpRef string) (*api.Pool, error) {
	from, unlock, err := ps.core.PoolCheckpoint(ctx, ref, cpRef)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return ps.view(configOf(from, 0)), nil
}

// SetTemplatePool keeps the caller's org's warm pool of size sandboxes of
// a template: a built-in one (made with the daemon's default resources) or
// one of the org's checkpoint templates. 0 drains it.
func (ps *Pools) SetTemplatePool(ctx context.Context, name string, size int) (*api.Pool, error) {
	if err := api.CheckPoolSize(size); err != nil {
		return nil, err
	}
	from, err := ps.core.PoolTemplate(ctx, name)
	if err != nil {
		return nil, err
	}
	return ps.set(ctx, configOf(from, size))
}

// DropTemplatePools drains and removes org's pool of template name, as
// the template is deleted.
func (ps *Pools) DropTemplatePools(ctx context.Context, org, name string) {
	ps.Forget(ctx, sandbox.PoolSource{Org: org, Template: name})
}

// TemplatePool reports the caller's org's warm pool of a template (size 0
// when it has none).
func (ps *Pools) TemplatePool(ctx context.Context, name string) (*api.Pool, error) {
	from, err := ps.core.PoolTemplate(ctx, name)
	if err != nil {
		return nil, err
	}
	return ps.view(configOf(from, 0)), nil
}

// set sets a pool's size, stores the sizes, and starts filling it or
// deletes the members beyond the size.
func (ps *Pools) set(ctx context.Context, cfg config) (*api.Pool, error) {
	key := cfg.key()
	ps.mu.Lock()
	p := ps.all[key]
	old := 0
	if p != nil {
		old = p.cfg.Size
	}
	if cfg.Size == 0 {
		delete(ps.all, key)
	} else if p == nil {
		p = &pool{cfg: cfg}
		ps.all[key] = p
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
	err := ps.saveLocked()
	if err != nil {
		// Not kept: put the old size back, as if the call had not come.
		if old == 0 {
			delete(ps.all, key)
		} else {
			p.cfg.Size = old
			ps.all[key] = p
			p.ready = append(p.ready, extra...)
			extra = nil
		}
	}
	if cfg.Size > 0 {
		ps.fillLocked(key)
	}
	ps.mu.Unlock()
	for _, sb := range extra {
		ps.core.DeletePoolMember(context.WithoutCancel(ctx), sb)
	}
	if err != nil {
		return nil, err
	}
	ps.log.Info("warm pool set", "pool", key, "size", cfg.Size)
	return ps.view(cfg), nil
}

// drop drains and removes every pool whose members are made from what
// match says: a checkpoint or sandbox being deleted, a template.
func (ps *Pools) drop(ctx context.Context, match func(config) bool) {
	ps.mu.Lock()
	var members []*store.Sandbox
	changed := false
	for key, p := range ps.all {
		if match(p.cfg) {
			members = append(members, p.ready...)
			delete(ps.all, key)
			changed = true
		}
	}
	if changed {
		if err := ps.saveLocked(); err != nil {
			ps.log.Error("warm pool: storing the pools", "err", err)
		}
	}
	ps.mu.Unlock()
	for _, sb := range members {
		ps.core.DeletePoolMember(context.WithoutCancel(ctx), sb)
	}
}

// saveLocked writes the pools' sizes whole. ps.mu is held.
func (ps *Pools) saveLocked() error {
	cfgs := []config{}
	for _, p := range ps.all {
		cfgs = append(cfgs, p.cfg)
	}
	slices.SortFunc(cfgs, func(a, b config) int { return strings.Compare(a.key(), b.key()) })
	b, err := json.MarshalIndent(cfgs, "", "\t")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(ps.cfg.DataDir, poolFile), b, 0o600); err != nil {
		return fmt.Errorf("storing pools: %w", err)
	}
	return nil
}

// view is the API's view of the pool cfg names.
func (ps *Pools) view(cfg config) *api.Pool {
	v := &api.Pool{Template: cfg.Template}
	if cfg.Template == "" {
		v.From = &api.ForkSource{Sandbox: cfg.Sandbox, Checkpoint: cfg.Checkpoint}
	}
	ps.mu.Lock()
	p := ps.all[cfg.key()]
	var ids []string
	if p != nil {
		v.Size, v.Ready, v.Starting, v.Claimed, v.Held = p.cfg.Size, len(p.ready), p.starting, p.claimed, p.held
		for _, sb := range p.ready {
			ids = append(ids, sb.ID)
		}
	}
	ps.mu.Unlock()
	for _, id := range ids {
		v.MemoryBytes += ps.core.ContainerMemory(id)
	}
	return v
}

// memoryShort says why pool p may not make a member now, or "" if it may:
// the host must have the member's memory (the most a member was seen to
// hold; the checkpoint's memory image or the sandbox's memory limit before
// any was) to spare above the reserve.
func (ps *Pools) memoryShort(p *pool) string {
	avail, err := ps.memAvailable()
	if err != nil || avail < 0 {
		return ""
	}
	need := p.memberBytes
	if need == 0 {
		need = ps.memberEstimate(p.cfg)
	}
	reserve := int64(ps.cfg.ReserveMiB) << 20
	if avail-need < reserve {
		return fmt.Sprintf("host memory is short: %d MiB available, a member needs about %d MiB and %d MiB are kept for sandboxes",
			avail>>20, need>>20, reserve>>20)
	}
	return ""
}

// memberEstimate is what a first member of a pool is expected to hold.
func (ps *Pools) memberEstimate(cfg config) int64 {
	if n := ps.core.MemoryImageBytes(cfg.source()); n > 0 {
		return n
	}
	return 64 << 20
}

// shrink deletes ready members, from the pool holding the most memory,
// while the host's available memory is below the reserve.
func (ps *Pools) shrink(ctx context.Context) {
	for ctx.Err() == nil {
		avail, err := ps.memAvailable()
		if err != nil || avail < 0 || avail >= int64(ps.cfg.ReserveMiB)<<20 {
			return
		}
		ps.mu.Lock()
		var victim *pool
		for _, p := range ps.all {
			if len(p.ready) > 0 && (victim == nil || int64(len(p.ready))*p.memberBytes > int64(len(victim.ready))*victim.memberBytes) {
				victim = p
			}
		}
		if victim == nil {
			ps.mu.Unlock()
			return
		}
		sb := victim.ready[len(victim.ready)-1]
		victim.ready = victim.ready[:len(victim.ready)-1]
		victim.held = fmt.Sprintf("host memory is short: %d MiB available, %d MiB are kept for sandboxes", avail>>20, ps.cfg.ReserveMiB)
		key := victim.cfg.key()
		ps.mu.Unlock()
		ps.log.Warn("warm pool: host memory is short; deleting a member", "pool", key, "sandbox", sb.ID, "available_mib", avail>>20)
		ps.core.DeletePoolMember(context.WithoutCancel(ctx), sb)
	}
}

// memAvailable is the host's available memory in bytes (Config.MemAvailable
// or /proc/meminfo's MemAvailable); -1 when unknown.
func (ps *Pools) memAvailable() (int64, error) {
	if ps.cfg.MemAvailable != nil {
		return ps.cfg.MemAvailable()
	}
	_, avail, err := host.Memory()
	if err != nil {
		return -1, err
	}
	return avail, nil
}
