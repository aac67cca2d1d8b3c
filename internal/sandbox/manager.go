// Package sandbox is the heart of the daemon: the Sandbox life cycle (create,
// boot, exec, delete, recovery after a restart) on top of the runtime, the
// disk pool, the network and the metadata store. Manager is the one place
// that changes a sandbox's state.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/store"
)

// Networks gives sandboxes their network namespaces (package network).
type Networks interface {
	Endpoint(id string, index int) (network.Endpoint, error)
	MaxIndex() int
	Create(ctx context.Context, ep network.Endpoint) error
	Prepare(ctx context.Context, ep network.Endpoint) error
	Delete(ctx context.Context, ep network.Endpoint) error
	// SetPolicy gives the sandbox at ep its egress policy, replacing the
	// one it had; RemovePolicy takes it away (no egress at all).
	SetPolicy(ctx context.Context, ep network.Endpoint, p network.Policy) error
	RemovePolicy(ctx context.Context, ep network.Endpoint) error
	// PrunePolicies removes the policies of every sandbox but keep's:
	// the firewall outlives the daemon, and a crash may leave some.
	PrunePolicies(ctx context.Context, keep []network.Endpoint) error
}

// Insiders serves the API to sandboxes themselves (see server.Inside): a
// listener per sandbox on the host end of its network, with a token that
// reaches only that sandbox.
type Insiders interface {
	Open(id string, addr netip.AddrPort, peer netip.Addr) error
	Close(id string)
	Token(id string) string
}

// Config is the Manager's configuration.
type Config struct {
	// DataDir holds one directory per sandbox (sandboxes/ID): its runtime
	// bundle, its handle and its logs.
	DataDir string
	// AgentBinary is the static loam binary run inside each sandbox.
	AgentBinary string
	// AgentPort is the TCP port the agent listens on inside each sandbox.
	AgentPort int
	// Domain, Org and Scheme make sandbox URLs: SCHEME://NAME--ORG.DOMAIN.
	Domain, Org, Scheme string
	// Node is the name of this daemon's node in a cluster (loam serve
	// --node), "" on one machine: it owns the sandboxes it makes, and its
	// recovery, caps and addresses count only the sandboxes it owns.
	Node string
	// FrontEnd is set for a cluster's API node (loam serve --role api):
	// it makes no sandbox of its own.
	FrontEnd bool
	// Leases, in a cluster, tells which nodes stopped answering: their
	// sandboxes show state unknown, and calls to them are refused naming
	// the node. Nil on one machine.
	Leases Leases
	// DefaultTemplate is used when a create names none.
	DefaultTemplate string
	// Defaults fills in the resources a create leaves out.
	Defaults api.Resources
	// InsidePort is the port of the in-sandbox API on each sandbox's host
	// address.
	InsidePort int
	// Inside makes the in-sandbox API of the Manager being made; nil serves
	// none. It is a constructor, not a value, because that API serves the
	// Manager's own sandboxes: New calls it once, with the Manager whole,
	// so neither is ever seen half made and nothing is set afterwards.
	Inside func(*Manager) Insiders
	// BootTimeout bounds how long a sandbox's agent may take to answer.
	BootTimeout time.Duration
	// IdleMin is the shortest idle a sandbox may ask for (1m unless a test
	// sets it shorter).
	IdleMin time.Duration
	// Secret is the daemon's key that agent tokens are derived from (see
	// AgentToken). It must stay the same across restarts of the daemon.
	Secret []byte
	// Secrets gives the values of the secrets sandboxes are given (see
	// secrets.go); nil for a manager that has none, which refuses creates
	// that name any.
	Secrets Secrets
	// Images pulls the images sandboxes are made from (images.go); nil for
	// a manager without images, which refuses creates that name one.
	Images Images
	// Pools makes the warm pools of the Manager being made (package
	// warmpool); nil keeps none. A constructor, as Inside is: the pools
	// make their members with the Manager, and it asks them for members.
	Pools func(*Manager) Pools
	// Forks makes the forks of the Manager being made (package
	// checkpoints, which takes and restores checkpoints too); nil makes
	// none. A constructor, as Pools is: a fork is made with the Manager,
	// and the Manager's Create asks for one.
	Forks func(*Manager) Forks
	// Sleep makes the sleep images of the Manager being made (package
	// sleep); nil keeps none, and no sandbox sleeps. A constructor, as
	// Pools is: idle sleep asks the Manager, and it asks for the images.
	Sleep func(*Manager) SleepImages
	// MaxSandboxes caps the sandboxes the daemon keeps (see
	// reserveSandbox); 0 is no cap.
	MaxSandboxes int
	// MaxHeavy caps the heavy operations that run at once (see heavyGate);
	// 0 is no cap. HeavyWait is how long one waits for a slot before it
	// fails with api.CodeLimit; 0 is DefaultHeavyWait.
	MaxHeavy  int
	HeavyWait time.Duration
	// Orgs keeps the orgs and their quotas, which every create, fork,
	// wake, restore, checkpoint and pool member is admitted against (see
	// admission); nil admits everything.
	Orgs OrgStore
	// CPUFeatures, when set, says which CPU features a sandbox booted now
	// may see, at most (runtime.Spec.CPUFeatures): an operator's
	// --cpu-features, or what every node of the cluster has. nil, or an
	// empty answer, is all the host has.
	CPUFeatures func() []string
	// Takeover, in a cluster with an object store, moves the record of a
	// lost node's sandbox to this node, to bring it back here from a
	// stored checkpoint (TakeOver); nil on one machine.
	Takeover Takeover
	// Stored is told when checkpoints go (deleted, pruned, their sandbox
	// deleted), so that their copies in the object store go too; nil
	// when the daemon keeps none (loam serve --objects).
	Stored Stored
	// SleepStore, in a cluster with an object store, keeps the sleep
	// images there, so that a sleeping sandbox wakes on any node
	// (adopt.go); nil keeps them on their node alone.
	SleepStore SleepStore
}

// Stored is what keeps checkpoints in the object store (package
// checkpoints' Uploader), as the core tells it what went.
type Stored interface {
	// Forget drops checkpoint cpID of sandbox sandboxID from the object
	// store (every one of the sandbox's when cpID is ""), and any upload
	// of it. A failure is its own to log: what is left is its sweep's.
	Forget(ctx context.Context, sandboxID, cpID string)
	// Stored reports whether checkpoint ref of sandbox sandboxID is in
	// the object store, complete: a checkpoint whose data this node lacks
	// (one of a sandbox brought back here from another node) is fetched
	// when used, not dropped.
	Stored(ctx context.Context, sandboxID, ref string) (bool, error)
}

// noStored is Stored for a daemon without an object store.
type noStored struct{}

func (noStored) Forget(context.Context, string, string) {}

func (noStored) Stored(context.Context, string, string) (bool, error) { return false, nil }

// Manager creates, runs and deletes sandboxes. It is safe for concurrent
// use; operations that change one sandbox (delete, and later checkpoint,
// restore, sleep) are serialised per sandbox, and a second one while the
// first runs is refused with a conflict.
type Manager struct {
	cfg   Config
	owner ownership
	store store.Store
	rt    runtime.Runtime
	disks disk.Pool
	nets  Networks
	tpl   Templates
	log   *slog.Logger
	// inside is the in-sandbox API; nil serves none.
	inside Insiders

	// conns are the connections to every sandbox's agent: the transport
	// every request goes by, and the spare exec sockets.
	conns *agentconn.Conns

	// mu guards lives, the registry of the sandboxes' live objects
	// (live.go): everything the daemon knows of one sandbox while it runs
	// is there, under that object's own lock.
	mu    sync.Mutex
	lives map[string]*live
	// insertMu orders the creates' allocations of network slots: reserved
	// holds the slots handed out but not yet stored.
	insertMu sync.Mutex
	// adopting keeps one adoption of a sandbox at a time (adopt.go).
	adopting adoptions
	reserved map[int]bool
	// agents is the link to the sandboxes' agents (agent.go): their
	// tokens, the connect after every boot, their protocol version.
	agents *agentLink
	// machine makes what a sandbox runs on (its dir, disk limit,
	// network, spec) and boots it (manager.go, diskquota.go, handle.go).
	machine *machine
	// deaths watches the sandboxes' processes (death.go): the goroutines
	// the Manager runs on its own (the spare dials are conns'), ended by
	// Close.
	deaths *deaths
	// pools are the warm pools (pool.go): Config.Pools's, or noPools.
	pools Pools
	// forks make sandboxes from checkpoints: Config.Forks's, or noForks.
	forks Forks
	// stored keeps checkpoints in the object store: Config.Stored, or
	// noStored.
	stored Stored
	// sleepImages are the sleep images (sleep.go): Config.Sleep's, or noSleep.
	sleepImages SleepImages

	// heavy and count hold the daemon's caps (caps.go).
	heavy *heavyGate
	count sandboxCount
	// admit holds the orgs to their quotas (admission.go).
	admit *admission
}

// New makes a Manager. Call Recover before serving requests.
func New(cfg Config, st store.Store, rt runtime.Runtime, disks disk.Pool, nets Networks, tpl Templates, log *slog.Logger) *Manager {
	if cfg.AgentPort == 0 {
		cfg.AgentPort = agent.DefaultPort
	}
	if cfg.InsidePort == 0 {
		cfg.InsidePort = network.DefaultInsidePort
	}
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 60 * time.Second
	}
	if cfg.IdleMin == 0 {
		cfg.IdleMin = time.Minute
	}
	if cfg.Scheme == "" {
		cfg.Scheme = "http"
	}
	if cfg.HeavyWait == 0 {
		cfg.HeavyWait = DefaultHeavyWait
	}
	m := &Manager{
		cfg: cfg, owner: ownership{node: cfg.Node, leases: cfg.Leases}, store: st, rt: rt, disks: disks, nets: nets, tpl: tpl, log: log,
		conns:    agentconn.NewConns(cfg.AgentPort),
		lives:    map[string]*live{},
		reserved: map[int]bool{},
		heavy:    newHeavyGate(cfg.MaxHeavy, cfg.HeavyWait),
	}
	m.agents = &agentLink{m: m}
	m.admit = newAdmission(m, cfg.Orgs)
	m.machine = &machine{m: m}
	m.deaths = newDeaths(m)
	// Before Inside: the in-sandbox API serves the capability too.
	m.stored = cfg.Stored
	if m.stored == nil {
		m.stored = noStored{}
	}
	m.forks = noForks{}
	if cfg.Forks != nil {
		m.forks = cfg.Forks(m)
	}
	if cfg.Inside != nil {
		m.inside = cfg.Inside(m)
	}
	m.pools = noPools{m}
	if cfg.Pools != nil {
		m.pools = cfg.Pools(m)
	}
	m.sleepImages = noSleep{}
	if cfg.Sleep != nil {
		m.sleepImages = cfg.Sleep(m)
	}
	return m
}

// URL is the public address of sandbox name of org ("" for the daemon's
// own, --org).
func (m *Manager) URL(org, name string) string {
	if org == "" {
		org = m.cfg.Org
	}
	return fmt.Sprintf("%s://%s--%s.%s", m.cfg.Scheme, name, org, m.cfg.Domain)
}

func (m *Manager) view(sb *store.Sandbox) *api.Sandbox {
	v := sb.Sandbox
	v.URL = m.URL(sb.Org, v.Name)
	if v.State == api.StateError || v.State == api.StateRunning {
		// Running, it is what a takeover said: brought back on this node
		// from a checkpoint, and what was lost (until its next change).
		v.Reason = sb.Error
	}
	if since, lapsed := m.owner.lapsed(sb); lapsed {
		v.State, v.Reason = api.StateUnknown, nodeSilent(sb.Node, since)
	}
	v.Env = maps.Clone(v.Env)
	v.Labels = maps.Clone(v.Labels)
	v.Secrets, v.SecretFiles = orNil(v.Secrets), orNil(v.SecretFiles)
	if v.Env == nil {
		v.Env = map[string]string{}
	}
	if v.Labels == nil {
		v.Labels = map[string]string{}
	}
	return &v
}

// lookup finds a sandbox by name or id, as a user's not_found when missing.
// It is the one place a caller's reference to a sandbox is resolved, so a
// caller finds only the sandboxes of its own org (auth.From), and a key
// limited by labels only those of its selector: any other answers exactly
// as one that does not exist.
func (m *Manager) lookup(ctx context.Context, ref string) (*store.Sandbox, error) {
	sb, err := m.store.GetSandbox(ctx, auth.Scope(ctx), ref)
	p, limited := auth.From(ctx)
	if errors.Is(err, store.ErrNotFound) || err == nil && sb.Pool != "" || err == nil && limited && !p.Matches(sb.Labels) {
		// A warm pool's member is not a sandbox of the API's.
		return nil, api.Errorf(api.CodeNotFound, "sandbox %q not found", ref)
	}
	if err != nil {
		return nil, fmt.Errorf("looking up sandbox %s: %w", ref, err)
	}
	return sb, nil
}

// Get returns one sandbox.
func (m *Manager) Get(ctx context.Context, ref string) (*api.Sandbox, error) {
	sb, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	v := m.view(sb)
	if sb.Node == m.owner.node {
		// What it uses is on its own node's host alone.
		v.Disk = m.machine.diskUse(ctx, sb)
		v.Usage = m.usage(sb)
	}
	return v, nil
}

// usageMeter is a runtime that reads what a container uses now.
type usageMeter interface {
	MemoryBytes(id string) (int64, error)
	CPUSeconds(id string) (float64, error)
}

// usage is what running sandbox sb uses now, nil for one not running or
// whose cgroup cannot be read (it is being stopped, or the runtime keeps
// no counters).
func (m *Manager) usage(sb *store.Sandbox) *api.Usage {
	um, ok := m.rt.(usageMeter)
	if !ok || sb.State != api.StateRunning {
		return nil
	}
	mem, err := um.MemoryBytes(sb.ID)
	if err != nil {
		return nil
	}
	cpu, err := um.CPUSeconds(sb.ID)
	if err != nil {
		return nil
	}
	return &api.Usage{MemoryBytes: mem, CPUSeconds: cpu}
}

// List lists sandboxes, oldest first, filtered by labels.
func (m *Manager) List(ctx context.Context, labels map[string]string) ([]api.Sandbox, error) {
	sbs, err := m.store.ListSandboxes(ctx, store.Filter{Org: auth.Scope(ctx), Labels: labels})
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	out := make([]api.Sandbox, 0, len(sbs))
	for _, sb := range sbs {
		if sb.Pool != "" {
			continue
		}
		v := m.view(sb)
		if sb.Node == m.owner.node {
			v.Disk = m.machine.diskUse(ctx, sb)
			v.Usage = m.usage(sb)
		}
		out = append(out, *v)
	}
	return out, nil
}

// claim finds a sandbox and begins an operation on it. The record is read
// again once the operation is ours: one read before could be stale (another
// operation may have finished in between and, say, spent a checkpoint id).
func (m *Manager) claim(ctx context.Context, ref string, what operation) (*store.Sandbox, func(), error) {
	sb, err := lookupAdopt(ctx, m, ref)
	if err != nil {
		return nil, nil, err
	}
	end, err := m.begin(sb, what)
	if err != nil {
		return nil, nil, err
	}
	fresh, err := m.lookup(ctx, sb.ID)
	if err != nil {
		end()
		return nil, nil, err
	}
	return fresh, end, nil
}

// setState moves a sandbox to a new state and stores it.
func (m *Manager) setState(ctx context.Context, sb *store.Sandbox, to api.State, why string) error {
	if !canTransition(sb.State, to) {
		return errTransition(sb.ID, sb.State, to)
	}
	sb.State = to
	sb.Error = why
	if to != api.StateRestoring {
		sb.RestoreTarget = "" // only a restore in progress has one
	}
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		return fmt.Errorf("storing state %s of sandbox %s: %w", to, sb.ID, err)
	}
	m.log.Info("sandbox state", "sandbox", sb.ID, "name", sb.Name, "state", to)
	return nil
}

// allocIndex hands out the lowest free slot of the address range.
func (m *Manager) allocIndex(ctx context.Context) (int, error) {
	used, err := m.store.UsedNetIndexes(ctx, m.cfg.Node)
	if err != nil {
		return 0, fmt.Errorf("reading used addresses: %w", err)
	}
	taken := map[int]bool{}
	for _, i := range used {
		taken[i] = true
	}
	for i := 0; i <= m.nets.MaxIndex(); i++ {
		if !taken[i] && !m.reserved[i] {
			m.reserved[i] = true
			return i, nil
		}
	}
	return 0, api.Errorf(api.CodeLimit, "no free network address for another sandbox (at most %d)", m.nets.MaxIndex()+1)
}

// Create makes a sandbox and boots it. It returns once the sandbox's agent
// answers. A create that fails leaves nothing behind.
func (m *Manager) Create(ctx context.Context, req api.CreateSandbox) (*api.Sandbox, error) {
	// The call's audit record goes with the write that stores the sandbox
	// running (bootWith, resumeImage, ClaimPoolMember), not with its
	// first: recovery deletes one a crash leaves creating.
	ctx = store.HoldAudit(ctx)
	if m.cfg.FrontEnd {
		return nil, api.Errorf(api.CodeUnavailable, "node %s is an API front end (--role api): it runs no sandbox; placement found no other node for this one", m.cfg.Node)
	}
	if req.Node != "" && req.Node != m.cfg.Node {
		// A cluster passes a pinned create to its node before it gets
		// here (internal/cluster); alone, a daemon has no other node.
		if m.cfg.Node == "" {
			return nil, api.Errorf(api.CodeInvalid, "node: this daemon runs alone, not as a node of a cluster")
		}
		return nil, api.Errorf(api.CodeUnavailable, "node: the create was for node %s, and reached node %s", req.Node, m.cfg.Node)
	}
	release, err := m.reserveSandbox(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	leave, err := m.heavy.enter(ctx, "creating a sandbox")
	if err != nil {
		return nil, err
	}
	defer leave()
	if req.From != nil {
		return m.forks.Fork(ctx, req)
	}
	if req.Template != "" && req.Image == "" {
		man, err := m.tpl.Kept(m.orgOf(ctx), req.Template)
		if err != nil {
			return nil, err
		}
		if man != nil {
			return m.createFromTemplate(ctx, req, man)
		}
	}
	if err := checkServices(req.Services); err != nil {
		return nil, err
	}
	sb, err := m.newRecord(ctx, req)
	if err != nil {
		return nil, err
	}
	if req.Image != "" {
		done, err := m.machine.prepareImage(ctx, sb, &req)
		if err != nil {
			return nil, err
		}
		defer done()
	} else if err := m.checkTemplate(ctx, sb); err != nil {
		return nil, err
	} else if defaultResources(req) {
		if v, ok, err := m.pools.Claim(ctx, PoolSource{Org: m.orgOf(ctx), Template: sb.Template}, sb, req.Services); ok {
			return v, err
		}
	}
	// Claimed before it is stored, so that no other operation (a delete)
	// can run on it while it boots. The id is new: the claim cannot fail.
	end, _ := m.begin(sb, opCreate)
	defer end()
	if err := m.insert(ctx, sb); err != nil {
		return nil, err
	}
	crash.Point("create.stored")
	// The work goes on even if the client goes away: stopping half-way would
	// only leave more to clean up.
	ctx = context.WithoutCancel(ctx)
	start := time.Now()
	if err := m.machine.bootWith(ctx, sb, opCreate, true, req.Services); err != nil {
		m.log.Error("create failed", "sandbox", sb.ID, "err", err)
		if derr := m.destroy(ctx, sb); derr != nil {
			m.log.Error("cleaning up after failed create", "sandbox", sb.ID, "err", derr)
		}
		var ae *api.Error
		if errors.As(err, &ae) {
			return nil, err // a service the sandbox cannot run: the client's
		}
		return nil, publicError(fmt.Errorf("creating sandbox %s: %w", sb.Name, err))
	}
	m.log.Info("sandbox created", "sandbox", sb.ID, "name", sb.Name, "ms", time.Since(start).Milliseconds())
	return m.view(sb), nil
}

// checkTemplate gives a record the default template when it names none,
// and refuses a template that does not exist.
func (m *Manager) checkTemplate(ctx context.Context, sb *store.Sandbox) error {
	if sb.Template == "" {
		sb.Template = m.cfg.DefaultTemplate
	}
	if m.tpl.Builtin(sb.Template) {
		return nil
	}
	return api.Errorf(api.CodeInvalid, "template: %q does not exist (GET /v1/templates lists them)", sb.Template)
}

// newRecord validates a create request and makes the record it asks for.
func (m *Manager) newRecord(ctx context.Context, req api.CreateSandbox) (*store.Sandbox, error) {
	id := newID()
	name := req.Name
	if name == "" {
		name = id
	} else if err := checkName(name, m.maxNameLen(ctx)); err != nil {
		return nil, err
	}
	res := m.cfg.Defaults
	if req.Resources != nil {
		if err := checkResources(*req.Resources); err != nil {
			return nil, err
		}
		if req.Resources.CPUs != 0 {
			res.CPUs = req.Resources.CPUs
		}
		if req.Resources.MemoryMiB != 0 {
			res.MemoryMiB = req.Resources.MemoryMiB
		}
		if req.Resources.DiskMiB != 0 {
			res.DiskMiB = req.Resources.DiskMiB
		}
	}
	for _, check := range []error{checkEnv(req.Env), checkLabels(req.Labels), checkIdle(req.Idle, m.cfg.IdleMin), checkPort(req.HTTPPort), checkRecover(req.Recover)} {
		if check != nil {
			return nil, check
		}
	}
	if err := m.checkSecretRefs(ctx, req); err != nil {
		return nil, err
	}
	policy := api.NetworkPolicy{Egress: api.EgressAll, Allow: []string{}, Deny: []string{}}
	if req.Network != nil {
		var err error
		if policy, err = checkNetwork(*req.Network); err != nil {
			return nil, err
		}
	}
	port := req.HTTPPort
	if port == 0 {
		port = 8080
	}
	if port == m.cfg.AgentPort {
		return nil, api.Errorf(api.CodeInvalid, "http_port: %d is the agent's port", port)
	}
	return &store.Sandbox{
		Sandbox: api.Sandbox{
			ID: id, Name: name, State: api.StateCreating,
			Template: req.Template, Resources: res,
			Env: orEmpty(req.Env), Labels: orEmpty(req.Labels),
			Idle: req.Idle, HTTPPort: port, Public: req.Public, From: req.From,
			Recover: req.Recover,
			Secrets: orNil(req.Secrets), SecretFiles: orNil(req.SecretFiles),
			Network:   policy,
			CreatedAt: store.Now(),
		},
		Org: m.orgOf(ctx),
	}, nil
}

// insert gives the record a network slot and stores it.
func (m *Manager) insert(ctx context.Context, sb *store.Sandbox) error {
	m.insertMu.Lock()
	defer m.insertMu.Unlock()
	idx, err := m.allocIndex(ctx)
	if err != nil {
		return err
	}
	defer delete(m.reserved, idx)
	sb.NetIndex = idx
	sb.Node = m.cfg.Node
	if sb.Pool == "" {
		// The audit record of the call that makes it names it, id or name.
		store.AuditFrom(store.ReleaseAudit(ctx)).SetTarget("sandboxes/" + sb.Name)
	}
	if sb.Org == "" {
		sb.Org = m.orgOf(ctx)
	}
	if err := m.admit.insert(ctx, sb, func() error { return m.store.CreateSandbox(ctx, sb) }); err != nil {
		var ae *api.Error
		if errors.Is(err, store.ErrExists) {
			return api.Errorf(api.CodeConflict, "name %q is in use", sb.Name)
		} else if errors.As(err, &ae) {
			return err // over the org's quota
		}
		return fmt.Errorf("storing sandbox %s: %w", sb.ID, err)
	}
	return nil
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}

// maxNameLen is the longest name a sandbox may have in the caller's org.
func (m *Manager) maxNameLen(ctx context.Context) int { return MaxNameLen(m.orgOf(ctx)) }

// machine is how a sandbox runs on this host: its own directory and the
// handle in it, where its checkpoints' files are, its disk, the disk's
// limit and the space a checkpoint of it needs, its network made ready, an
// image's root made ready, the runtime's spec of its container and its
// resource limits, and a boot on its disk: fresh, from a template's or a
// checkpoint's memory (a fork), or a resume of a paused one. It is a unit of
// its own because a create, a wake, a restore, a fork and a recovery all
// make a sandbox's machine the same way, whatever the operation around it
// (which, with the sandbox's state, stays the Manager's).
type machine struct {
	m *Manager
}

// dir is the sandbox's own directory on the host.
func (mc *machine) dir(id string) string { return filepath.Join(mc.m.cfg.DataDir, "sandboxes", id) }

// spec is the runtime spec of a sandbox; env is more of the agent's
// environment (its image's defaults, for a fresh boot).
func (mc *machine) spec(ctx context.Context, sb *store.Sandbox, ep network.Endpoint, env ...string) runtime.Spec {
	m := mc.m
	return runtime.Spec{
		ID:          sb.ID,
		BundleDir:   filepath.Join(mc.dir(sb.ID), "bundle"),
		Rootfs:      m.disks.VolumePath(sb.ID),
		Netns:       ep.Netns,
		Hostname:    sb.Name,
		AgentBinary: m.cfg.AgentBinary,
		Env: append([]string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"LOAM_AGENT_TOKEN=" + m.agents.token(sb),
			"LOAM_AGENT_LISTEN=:" + strconv.Itoa(m.cfg.AgentPort),
		}, env...),
		CPUs:        sb.Resources.CPUs,
		MemoryMiB:   sb.Resources.MemoryMiB,
		DiskQuota:   mc.diskQuota(ctx, sb),
		CPUFeatures: mc.cpuFeatures(),
	}
}

// cpuFeatures are the CPU features a sandbox booted now may see
// (Config.CPUFeatures), nil for all the host has.
func (mc *machine) cpuFeatures() []string {
	if f := mc.m.cfg.CPUFeatures; f != nil {
		return f()
	}
	return nil
}

// boot starts a sandbox fresh on its disk (making the disk from the
// template when fresh is true) and waits for its agent, for op, the
// operation that holds the sandbox.
func (mc *machine) boot(ctx context.Context, sb *store.Sandbox, op operation, fresh bool) error {
	return mc.bootWith(ctx, sb, op, fresh, nil)
}

// bootWith is boot for a create that gives services: they are defined and
// started before the state says running, so that a crash before they are
// leaves a sandbox still creating, which recovery deletes (as before the
// create), never one running without them. A service the sandbox cannot
// run is the client's mistake (see startServicesOrDelete), told as it is.
func (mc *machine) bootWith(ctx context.Context, sb *store.Sandbox, op operation, fresh bool, services []api.Service) error {
	m := mc.m
	agentEnv, err := m.machine.imageAgentEnv(ctx, sb)
	if err != nil {
		return err
	}
	if fresh {
		tpl := sb.Template
		if sb.Image != "" {
			if tpl, err = m.machine.imageTemplate(ctx, sb); err != nil {
				return err
			}
		} else if err := m.tpl.Ensure(ctx, sb.Template); err != nil {
			return fmt.Errorf("preparing template %s: %w", sb.Template, err)
		}
		root, err := m.disks.CreateVolume(ctx, sb.ID, tpl)
		if err != nil {
			return fmt.Errorf("making disk: %w", err)
		}
		if err := personalize(root, sb.Name); err != nil {
			return fmt.Errorf("making disk: %w", err)
		}
		if err := mc.limitDisk(ctx, sb); err != nil {
			return fmt.Errorf("making disk: %w", err)
		}
		crash.Point("boot.disk")
	}
	ep, err := mc.prepare(ctx, sb)
	if err != nil {
		return err
	}
	if err := m.rt.Start(ctx, mc.spec(ctx, sb, ep, agentEnv...)); err != nil {
		return fmt.Errorf("starting: %w", err)
	}
	crash.Point("boot.started")
	if err := m.agents.connect(ctx, sb, op, ep, m.agents.token(sb)); err != nil {
		return err
	}
	crash.Point("boot.connected")
	if err := m.agents.startServices(ctx, sb, op, services); err != nil {
		return err
	}
	if len(services) > 0 {
		crash.Point("create.services")
	}
	// The write that makes a create's change (see Create).
	return m.setState(store.ReleaseAudit(ctx), sb, api.StateRunning, "")
}

// personalize writes the files that name a new sandbox in its own root:
// its hostname, and hosts and resolv.conf to match. resolv.conf names the
// daemon's resolver at network.ResolverAddr, the same address in every
// sandbox, so that forks and restores, which keep the disk, resolve too.
//
// The root is a new copy of a template, but it is written through an
// os.Root all the same: no path in a sandbox's disk is followed out of it.
func personalize(rootDir, name string) error {
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return err
	}
	defer root.Close()
	files := map[string]string{
		"etc/hostname": name + "\n",
		"etc/hosts": "127.0.0.1\tlocalhost\n127.0.1.1\t" + name + "\n" +
			"::1\tlocalhost ip6-localhost ip6-loopback\n",
		"etc/resolv.conf": "# loam: the daemon's resolver, which applies this sandbox's network policy.\n" +
			"nameserver " + network.ResolverAddr.String() + "\noptions timeout:2 attempts:2\n",
	}
	for rel, content := range files {
		// A template's resolv.conf may be a symlink; replace it, never follow it.
		if err := root.Remove(rel); err != nil && !os.IsNotExist(err) {
			return err
		}
		if err := root.WriteFile(rel, []byte(content), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", rel, err)
		}
	}
	return nil
}

// prepare makes what a sandbox's container needs before it starts or is
// restored: its directory first (start-up sweeps leftovers by it), then its
// network, configured afresh, and its handle.
func (mc *machine) prepare(ctx context.Context, sb *store.Sandbox) (network.Endpoint, error) {
	m := mc.m
	ep, err := m.Endpoint(sb)
	if err != nil {
		return ep, err
	}
	if err := os.MkdirAll(filepath.Join(mc.dir(sb.ID), "bundle"), 0o700); err != nil {
		return ep, err
	}
	if err := m.nets.Create(ctx, ep); err != nil {
		return ep, fmt.Errorf("making network: %w", err)
	}
	if err := m.nets.Prepare(ctx, ep); err != nil {
		return ep, fmt.Errorf("configuring network: %w", err)
	}
	crash.Point("prepare.netns")
	if err := m.applyNetwork(ctx, sb); err != nil {
		return ep, err
	}
	crash.Point("prepare.policy")
	return ep, mc.writeHandle(sb, ep)
}

// dropAgentConns closes the idle connections and spare exec sockets to
// agents, so that none is open into a sandbox whose memory is about to be
// written or replaced (see agentconn.Conns.DropAll).
func (a *agentLink) dropAgentConns() { a.m.conns.DropAll() }

// dropSpare closes sandbox id's spare exec sockets and turns away those
// being opened (see closeStreams).
func (a *agentLink) dropSpare(id string) { a.m.conns.Drop(id) }

// Delete frees a sandbox: its processes, disk, network and checkpoints.
func (m *Manager) Delete(ctx context.Context, ref string) error {
	if sb, err := m.lookup(ctx, ref); err == nil && sb.Node != m.cfg.Node && (removedNode(sb) || unpinned(sb)) {
		// A removed node's sandbox, or one asleep on no node: nothing of
		// it is on this host (its address, disk and container were the
		// removed node's; the other's are in the object store), so only
		// its records go, and its stored objects.
		if err := m.store.DeleteSandbox(ctx, sb.ID); err != nil {
			return fmt.Errorf("deleting sandbox %s of node %q: %w", sb.Name, sb.Node, err)
		}
		m.stored.Forget(ctx, sb.ID, "")
		m.log.Info("deleted the records of a sandbox on no live node", "sandbox", sb.ID, "node", sb.Node)
		return nil
	}
	sb, end, err := m.claim(ctx, ref, opDelete)
	if err != nil {
		return err
	}
	defer end()
	ctx = context.WithoutCancel(ctx)
	unlock := m.lockSource(sb.ID)
	defer unlock()
	if err := m.setState(ctx, sb, api.StateDeleting, ""); err != nil {
		return err
	}
	crash.Point("delete.marked")
	return m.destroy(ctx, sb)
}

// deleteWhenFree is Delete of sandbox id, which waits for an operation in
// progress on it (a create, a checkpoint) to end rather than refusing it as
// busy: a delete of everything in an org (Orgs.Delete) must not fail on a
// sandbox one of its keys was still making.
func deleteWhenFree(ctx context.Context, m *Manager, id string) error {
	for {
		err := m.Delete(ctx, id)
		if !errors.Is(err, api.ErrConflict) {
			return err
		}
		l := m.peek(id)
		if l == nil {
			return err
		}
		op, done := l.current()
		if op == opNone || done == nil {
			return err // not busy: a conflict of its own
		}
		select {
		case <-done:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// destroy removes everything a sandbox has, then its record. Each step is
// idempotent, so a destroy cut short by a crash is finished at the next start.
func (m *Manager) destroy(ctx context.Context, sb *store.Sandbox) error {
	if sb.Pool == "" {
		m.pools.Forget(ctx, PoolSource{Sandbox: sb.ID})
	}
	var errs []error
	m.deaths.unwatch(sb.ID)
	m.closeStreams(sb.ID, "the sandbox was deleted")
	if m.inside != nil {
		m.inside.Close(sb.ID)
	}
	if err := m.rt.Delete(ctx, sb.ID); err != nil {
		errs = append(errs, fmt.Errorf("deleting container: %w", err))
	}
	crash.Point("destroy.container")
	m.forget(sb.ID)
	if ep, err := m.Endpoint(sb); err == nil {
		if err := m.nets.RemovePolicy(ctx, ep); err != nil {
			errs = append(errs, fmt.Errorf("removing network policy: %w", err))
		}
		if err := m.nets.Delete(ctx, ep); err != nil {
			errs = append(errs, fmt.Errorf("deleting network: %w", err))
		}
	}
	crash.Point("destroy.network")
	if err := m.disks.DeleteVolume(ctx, sb.ID); err != nil {
		errs = append(errs, fmt.Errorf("deleting disk: %w", err))
	}
	crash.Point("destroy.disk")
	if err := m.deleteCheckpointData(ctx, sb.ID); err != nil {
		errs = append(errs, err)
	}
	if sb.Pool == "" {
		m.stored.Forget(ctx, sb.ID, "")
	}
	crash.Point("destroy.checkpoints")
	for _, dir := range []string{m.machine.dir(sb.ID), m.machine.checkpointsDir(sb.ID)} {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	crash.Point("destroy.dirs")
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", sb.ID, err)
	}
	if err := m.store.DeleteSandbox(ctx, sb.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("deleting record of sandbox %s: %w", sb.ID, err)
	}
	m.forgetLive(sb.ID)
	m.log.Info("sandbox deleted", "sandbox", sb.ID, "name", sb.Name)
	return nil
}

// deleteCheckpointData removes the data of every checkpoint of a sandbox.
// The records go with the sandbox's record.
func (m *Manager) deleteCheckpointData(ctx context.Context, id string) error {
	cps, err := m.store.ListCheckpoints(ctx, id)
	if err != nil {
		return fmt.Errorf("listing checkpoints of %s: %w", id, err)
	}
	var errs []error
	for _, cp := range cps {
		if err := m.disks.DeleteSnapshot(ctx, snapName(id, cp.ID)); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, os.RemoveAll(m.machine.checkpointDir(id, cp.ID)))
	}
	return errors.Join(errs...)
}

// snapName is the disk snapshot of a checkpoint.
func snapName(sandboxID, cpID string) string { return checkpoint.Snapshot(sandboxID, cpID) }

// Endpoint is the network endpoint of a sandbox.
func (m *Manager) Endpoint(sb *store.Sandbox) (network.Endpoint, error) {
	return m.nets.Endpoint(sb.ID, sb.NetIndex)
}
