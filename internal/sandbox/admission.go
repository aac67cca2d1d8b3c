package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/quota"
	"loam.dev/loam/internal/store"
)

// OrgStore keeps the orgs and their quotas (store/sqlite has it).
type OrgStore interface {
	// EnsureOrg makes an org if there is none by that name, and gives it
	// the sandboxes that have no org (those of an older data dir).
	EnsureOrg(ctx context.Context, org string) error
	// CreateOrg makes an org; store.ErrExists if there is one.
	CreateOrg(ctx context.Context, org string) error
	// DeleteOrg deletes an org, its keys, secrets and registry
	// credentials; store.ErrNotFound for none, a *store.NotEmptyError
	// while it has sandboxes or (unless secrets) secrets.
	DeleteOrg(ctx context.Context, org string, secrets bool) error
	GetOrg(ctx context.Context, name string) (*store.Org, error)
	ListOrgs(ctx context.Context) ([]*store.Org, error)
	// SetQuota replaces an org's quota; store.ErrNotFound for none.
	SetQuota(ctx context.Context, org string, q api.Quota) error
	// CheckpointUse counts the checkpoints of an org's sandboxes and the
	// memory (MiB) their memory checkpoints were taken of.
	CheckpointUse(ctx context.Context, org string) (count, memoryMiB int, err error)
}

// admission holds every org to its quota (Config.Orgs). Each check and
// the change it admits are ordered by mu, so that racing calls at a
// quota's edge are let in one at a time against what the others made:
//   - a new record (a create, a fork, a pool's member) is checked and
//     stored under mu (insert), so the next check counts it;
//   - a warm pool's member handed to a create is checked and turned into
//     the user's sandbox under mu (claim);
//   - a sandbox that starts to run again (wake, boot, restore) is checked
//     and counted as running (starting) from then until its operation
//     ends, whatever its record says meanwhile;
//   - a checkpoint, or a checkpoint template, is checked and counted
//     (taking) until its record (or manifest) is stored or it fails; for
//     that short while after its record is stored it counts twice, which
//     can only refuse, never let too many in.
//
// An admission with no store (no Config.Orgs) lets everything through.
type admission struct {
	m     *Manager
	store OrgStore

	mu       sync.Mutex
	starting map[string]bool
	// taking is what the checkpoints being taken add, per org.
	taking map[string]api.OrgUse
	// deleting counts the deletes of each org under way (Orgs.Delete):
	// nothing new is admitted into one meanwhile, so that a delete of
	// everything in it is not raced by a create.
	deleting map[string]int
}

func newAdmission(m *Manager, st OrgStore) *admission {
	return &admission{m: m, store: st, starting: map[string]bool{}, taking: map[string]api.OrgUse{}, deleting: map[string]int{}}
}

// orgOf is the org a call of ctx makes things in: its caller's, or the
// daemon's own for the daemon's own work (recovery; a pool member is given
// its pool's org).
func (m *Manager) orgOf(ctx context.Context) string { return auth.OrgOr(ctx, m.cfg.Org) }

// runs reports whether a sandbox in state s counts as running for a quota.
func runs(s api.State) bool {
	return s == api.StateCreating || s == api.StateRunning || s == api.StateRestoring
}

// running is what sb adds to its org's running use.
func running(sb *store.Sandbox) api.OrgUse {
	return api.OrgUse{Sandboxes: 1, MemoryMiB: sb.Resources.MemoryMiB, CPUs: sb.Resources.CPUs}
}

// use is what org uses now. The caller holds a.mu.
func (a *admission) use(ctx context.Context, org string) (api.OrgUse, error) {
	var u api.OrgUse
	sbs, err := a.m.store.ListSandboxes(ctx, store.Filter{})
	if err != nil {
		return u, fmt.Errorf("counting the use of org %s: %w", org, err)
	}
	for _, sb := range sbs {
		if sb.Org != org {
			continue
		}
		if sb.Pool != "" {
			u.PoolMembers++
			continue
		}
		u.DiskMiB += sb.Resources.DiskMiB
		if runs(sb.State) || a.starting[sb.ID] {
			u = u.Add(running(sb))
		}
	}
	n, mem, err := a.store.CheckpointUse(ctx, org)
	if err != nil {
		return u, fmt.Errorf("counting the use of org %s: %w", org, err)
	}
	u.Checkpoints += n
	u.DiskMiB += mem
	// The org's checkpoint templates, by what they hold: a template's
	// disk is a copy of a checkpoint's, its own once that goes.
	_, b, err := a.m.tpl.Usage(org)
	if err != nil {
		return u, fmt.Errorf("counting the use of org %s: %w", org, err)
	}
	u.DiskMiB += int((b + 1<<20 - 1) >> 20)
	return u.Add(a.taking[org]), nil
}

// check refuses add to org's use when its quota does not allow it. The
// caller holds a.mu.
func (a *admission) check(ctx context.Context, org string, add api.OrgUse) error {
	if a.deleting[org] > 0 {
		return api.Errorf(api.CodeConflict, "org %s is being deleted", org)
	}
	rec, err := a.store.GetOrg(ctx, org)
	if errors.Is(err, store.ErrNotFound) {
		if org != a.m.cfg.Org {
			// Deleted since the call's key was checked: under a.mu,
			// as DeleteOrg runs, so nothing is stored in an org gone.
			return api.Errorf(api.CodeNotFound, "org %q not found", org)
		}
		return nil // the daemon's own org may have no record: no quota
	}
	if err != nil {
		return fmt.Errorf("reading the quota of org %s: %w", org, err)
	}
	if rec.Quota == (api.Quota{}) {
		return nil
	}
	use, err := a.use(ctx, org)
	if err != nil {
		return err
	}
	return quota.Check(org, rec.Quota, use, add)
}

// insert checks what new record sb adds to its org, and runs write (which
// stores it) if it fits, both under a.mu.
func (a *admission) insert(ctx context.Context, sb *store.Sandbox, write func() error) error {
	if a.store == nil {
		return write()
	}
	add := api.OrgUse{PoolMembers: 1}
	if sb.Pool == "" {
		add = running(sb)
		add.DiskMiB = sb.Resources.DiskMiB
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.check(ctx, sb.Org, add); err != nil {
		return err
	}
	return write()
}

// claim checks what turning a warm pool's member into want adds (a
// running sandbox, one member fewer), and runs write (which stores want)
// if it fits, both under a.mu.
func (a *admission) claim(ctx context.Context, want *store.Sandbox, write func() error) error {
	if a.store == nil {
		return write()
	}
	add := running(want)
	add.DiskMiB, add.PoolMembers = want.Resources.DiskMiB, -1
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.check(ctx, want.Org, add); err != nil {
		return err
	}
	return write()
}

// start admits sb, which does not run, to run again (a wake, a boot on
// its disk, a restore): it counts as running until release, which the
// caller calls once its operation has ended (its record then says).
func (a *admission) start(ctx context.Context, sb *store.Sandbox) (release func(), err error) {
	if a.store == nil || runs(sb.State) {
		return func() {}, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.check(ctx, sb.Org, running(sb)); err != nil {
		return nil, err
	}
	a.starting[sb.ID] = true
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			delete(a.starting, sb.ID)
			a.mu.Unlock()
		})
	}, nil
}

// checkpoint admits a checkpoint of sb, counted until release: call it
// once its record is stored, or it failed.
func (a *admission) checkpoint(ctx context.Context, sb *store.Sandbox, memory bool) (release func(), err error) {
	add := api.OrgUse{Checkpoints: 1}
	if memory {
		add.DiskMiB = sb.Resources.MemoryMiB
	}
	return a.hold(ctx, sb.Org, add)
}

// template admits a checkpoint template of org that will hold bytes,
// counted until release: call it once the template is published (its
// manifest then counts it), or it failed.
func (a *admission) template(ctx context.Context, org string, bytes int64) (release func(), err error) {
	return a.hold(ctx, org, api.OrgUse{DiskMiB: int((bytes + 1<<20 - 1) >> 20)})
}

// hold checks add against org's quota and counts it as being made until
// release. For the short while between the thing's own record (or
// manifest) and release it counts twice, which can only refuse, never let
// too many in.
func (a *admission) hold(ctx context.Context, org string, add api.OrgUse) (release func(), err error) {
	if a.store == nil {
		return func() {}, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.check(ctx, org, add); err != nil {
		return nil, err
	}
	a.taking[org] = a.taking[org].Add(add)
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			left := a.taking[org].Sub(add)
			if left == (api.OrgUse{}) {
				delete(a.taking, org)
			} else {
				a.taking[org] = left
			}
		})
	}, nil
}

// Orgs serves the orgs' records and their use (GET /v1/org, GET
// /v1/orgs, POST /v1/orgs, DELETE /v1/orgs/{org}, PUT
// /v1/orgs/{org}/quota). Make it with NewOrgs.
type Orgs struct{ a *admission }

// Create makes org, with no quota; conflict if there is one by that name.
func (o *Orgs) Create(ctx context.Context, org string) (*api.Org, error) {
	if o.a.store == nil {
		return nil, errNoOrgs
	}
	if err := CheckOrg(org); err != nil {
		return nil, api.Errorf(api.CodeInvalid, "%v", err)
	}
	store.AuditFrom(ctx).SetTarget("orgs/" + org)
	err := o.a.store.CreateOrg(ctx, org)
	if errors.Is(err, store.ErrExists) {
		return nil, api.Errorf(api.CodeConflict, "org %q already exists", org)
	}
	if err != nil {
		return nil, err
	}
	return o.Get(ctx, org)
}

// Delete deletes org and its keys. An org that still has sandboxes or
// secrets is refused with a conflict unless all is set: then its
// sandboxes (and their checkpoints) are deleted first, each as its own
// DELETE would, and its secrets with the org. The
// daemon's own org (--org) is never deleted: the admin token acts in it.
func (o *Orgs) Delete(ctx context.Context, org string, all bool) error {
	if o.a.store == nil {
		return errNoOrgs
	}
	if org == o.a.m.cfg.Org {
		return api.Errorf(api.CodeConflict, "org %s is this daemon's own (loam serve --org): it cannot be deleted", org)
	}
	if _, err := o.a.store.GetOrg(ctx, org); errors.Is(err, store.ErrNotFound) {
		return api.Errorf(api.CodeNotFound, "org %q not found", org)
	} else if err != nil {
		return err
	}
	// Nothing new is admitted into the org until the delete is done, and
	// the org's record goes under a.mu, as creates are checked and
	// stored: a create racing the delete is refused, or stored before the
	// record goes (then a delete of everything deletes it, and one of an
	// org "empty" is refused), never stored in an org gone.
	o.a.mu.Lock()
	o.a.deleting[org]++
	o.a.mu.Unlock()
	defer func() {
		o.a.mu.Lock()
		defer o.a.mu.Unlock()
		if o.a.deleting[org]--; o.a.deleting[org] == 0 {
			delete(o.a.deleting, org)
		}
	}()
	if all {
		// As the org's own admin: the lookups see its sandboxes.
		p, _ := auth.From(ctx)
		p.Org, p.Labels = org, nil
		in := auth.WithPrincipal(ctx, p)
		list, err := o.a.m.List(in, nil)
		if err != nil {
			return err
		}
		for _, sb := range list {
			if err := deleteWhenFree(in, o.a.m, sb.ID); err != nil && !errors.Is(err, api.ErrNotFound) {
				return fmt.Errorf("deleting sandbox %s of org %s: %w", sb.Name, org, err)
			}
		}
	}
	n, _, err := o.a.m.tpl.Usage(org)
	if err != nil {
		return err
	}
	if n > 0 && !all {
		return api.Errorf(api.CodeConflict, "org %s still has %d checkpoint templates: delete them first, or delete the org with everything in it (?all=true)", org, n)
	}
	store.AuditFrom(ctx).SetTarget("orgs/" + org)
	o.a.mu.Lock()
	err = o.a.store.DeleteOrg(ctx, org, all)
	o.a.mu.Unlock()
	if err == nil {
		// Its warm pools' members (no sandboxes of the API, which the
		// store's check let through) and its templates go with it; a
		// crash part-way leaves what the next start sweeps (Recover
		// deletes every member it finds).
		o.a.m.pools.Forget(context.WithoutCancel(ctx), PoolSource{Org: org})
		err = o.a.m.tpl.DropOrg(context.WithoutCancel(ctx), org)
	}
	var in *store.NotEmptyError
	switch {
	case errors.Is(err, store.ErrNotFound):
		return api.Errorf(api.CodeNotFound, "org %q not found", org)
	case errors.As(err, &in):
		return api.Errorf(api.CodeConflict, "org %s still has %d sandboxes and %d secrets: delete them first, or delete the org with everything in it (?all=true)", org, in.Sandboxes, in.Secrets)
	}
	return err
}

// NewOrgs makes the orgs' service of m. Without Config.Orgs its calls
// answer unavailable.
func NewOrgs(m *Manager) *Orgs { return &Orgs{a: m.admit} }

var errNoOrgs = api.Errorf(api.CodeUnavailable, "this daemon keeps no orgs")

// Get is org with its quota and what it uses now; not_found if none.
func (o *Orgs) Get(ctx context.Context, org string) (*api.Org, error) {
	if o.a.store == nil {
		return nil, errNoOrgs
	}
	rec, err := o.a.store.GetOrg(ctx, org)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.Errorf(api.CodeNotFound, "org %q not found", org)
	}
	if err != nil {
		return nil, err
	}
	return o.view(ctx, rec)
}

// List lists the orgs by name, each with its quota and use.
func (o *Orgs) List(ctx context.Context) ([]api.Org, error) {
	if o.a.store == nil {
		return nil, errNoOrgs
	}
	recs, err := o.a.store.ListOrgs(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Org, 0, len(recs))
	for _, rec := range recs {
		v, err := o.view(ctx, rec)
		if err != nil {
			return nil, err
		}
		out = append(out, *v)
	}
	return out, nil
}

// SetQuota replaces org's quota. A quota below what the org uses now is
// taken: nothing running stops, but nothing more is admitted until the
// use is under it.
func (o *Orgs) SetQuota(ctx context.Context, org string, q api.Quota) (*api.Org, error) {
	if o.a.store == nil {
		return nil, errNoOrgs
	}
	if err := quota.Validate(q); err != nil {
		return nil, err
	}
	store.AuditFrom(ctx).SetTarget("orgs/" + org + "/quota")
	err := o.a.store.SetQuota(ctx, org, q)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.Errorf(api.CodeNotFound, "org %q not found", org)
	}
	if err != nil {
		return nil, err
	}
	return o.Get(ctx, org)
}

func (o *Orgs) view(ctx context.Context, rec *store.Org) (*api.Org, error) {
	o.a.mu.Lock()
	use, err := o.a.use(ctx, rec.Name)
	o.a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &api.Org{Name: rec.Name, Quota: rec.Quota, Use: use, CreatedAt: rec.CreatedAt}, nil
}
