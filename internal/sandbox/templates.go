package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/store"
)

// Templates are the templates of this host, as the core makes sandboxes
// of them (template.Store has it): built-in ones, which Ensure builds, and
// checkpoint templates, which a sandbox is forked from. The catalog the
// API serves (package template) is made over TemplateCore.
type Templates interface {
	// Builtin reports whether name is a built-in template.
	Builtin(name string) bool
	// Ensure builds built-in template name if needed and imports it into
	// the disk pool.
	Ensure(ctx context.Context, name string) error
	// Kept resolves org's checkpoint template name to its manifest (its
	// disk snapshot, memory, resources); nil when there is none.
	Kept(org, name string) (*checkpoint.Manifest, error)
	// Use is Kept for a sandbox being made of the template: it cannot be
	// deleted until release is called, once the sandbox is stored (and so
	// counted as a use of it). man is nil when there is no such template.
	Use(org, name string) (man *checkpoint.Manifest, release func(), err error)
	// MemDir is where org's checkpoint template name keeps its memory
	// image.
	MemDir(org, name string) string
	// Usage is how many checkpoint templates org has and what they hold,
	// for its disk quota; DropOrg deletes them, with their org.
	Usage(org string) (count int, bytes int64, err error)
	DropOrg(ctx context.Context, org string) error
	// Sweep removes what a crash left of templates being made or deleted;
	// owned tells of a disk snapshot whether it is a template's, and
	// whether a template holds it.
	Sweep() (owned func(snap string) (template, held bool), err error)
}

// createFromTemplate makes a sandbox from checkpoint template man, as a
// fork of its checkpoint: a copy of its disk and, for a memory template,
// its memory, so the template's processes run on in the new sandbox under
// its own id, name, token and identity. From a disk-only template it boots
// fresh on the copy.
func (m *Manager) createFromTemplate(ctx context.Context, req api.CreateSandbox, man *checkpoint.Manifest) (*api.Sandbox, error) {
	if man.Memory && req.Resources != nil {
		return nil, api.Errorf(api.CodeInvalid, "resources: a sandbox of memory template %s takes its resources from the template; don't give them", man.Name)
	}
	if man.Memory && len(req.Services) > 0 {
		return nil, api.Errorf(api.CodeInvalid, "services: a sandbox of memory template %s takes its services from the template's disk; don't give any", man.Name)
	}
	if err := checkServices(req.Services); err != nil {
		return nil, err
	}
	sb, err := m.newRecord(ctx, req)
	if err != nil {
		return nil, err
	}
	sb.Template, sb.Image = man.Name, man.Image
	if man.Memory {
		sb.Resources = man.Resources
	}
	// Held until the sandbox is stored (and counted as a use), so that the
	// template cannot be deleted under it.
	again, release, err := m.tpl.Use(man.Org, man.Name)
	if err != nil || again == nil {
		return nil, api.Errorf(api.CodeNotFound, "template %q not found", man.Name)
	}
	defer release()
	if defaultResources(req) {
		// A memory template gives no services (refused above). The
		// pool is the sandbox's org's.
		if v, ok, err := m.pools.Claim(ctx, PoolSource{Org: m.orgOf(ctx), Template: man.Name}, sb, req.Services); ok {
			return v, err
		}
	}
	end, _ := m.begin(sb, opCreate) // before it is stored: see Create
	defer end()
	if err := m.insert(ctx, sb); err != nil {
		return nil, err
	}
	crash.Point("template-sandbox.stored")
	ctx = context.WithoutCancel(ctx)
	start := time.Now()
	if err = m.machine.bootTemplate(ctx, sb, man, req.Services); err != nil {
		m.log.Error("create from template failed", "sandbox", sb.ID, "template", man.Name, "err", err)
		if derr := m.destroy(ctx, sb); derr != nil {
			m.log.Error("cleaning up after failed create", "sandbox", sb.ID, "err", derr)
		}
		var ae *api.Error
		if errors.As(err, &ae) {
			return nil, err
		}
		return nil, publicError(fmt.Errorf("creating sandbox %s from template %s: %w", sb.Name, man.Name, err))
	}
	m.log.Info("sandbox created from template", "sandbox", sb.ID, "name", sb.Name, "template", man.Name, "ms", time.Since(start).Milliseconds())
	return m.view(sb), nil
}

// bootTemplate makes a sandbox from checkpoint template man, with services
// (a disk-only template's: a memory template's are on its disk), under its
// create operation (a create's, or a warm pool's member's).
func (mc *machine) bootTemplate(ctx context.Context, sb *store.Sandbox, man *checkpoint.Manifest, services []api.Service) error {
	m := mc.m
	root, err := m.disks.CloneSnapshot(ctx, man.Snapshot, sb.ID)
	if err != nil {
		return fmt.Errorf("copying the template's disk: %w", err)
	}
	if err := m.machine.limitDisk(ctx, sb); err != nil {
		return fmt.Errorf("copying the template's disk: %w", err)
	}
	crash.Point("template-sandbox.disk")
	if !man.Memory {
		// A fresh boot: the disk names the new sandbox, as a template's does.
		if err := personalize(root, sb.Name); err != nil {
			return fmt.Errorf("making disk: %w", err)
		}
		return m.machine.bootWith(ctx, sb, opCreate, false, services)
	}
	return m.machine.resumeImage(ctx, sb, opCreate, m.tpl.MemDir(man.Org, man.Name), man.AgentToken, "template "+man.Name)
}

// TemplateCore is the core as the template catalog (package template)
// sees it (it implements template.Core): what making a template of a
// checkpoint needs, a heavy slot and a held checkpoint. It is a type of its
// own, not methods of the Manager, because only the catalog copies a
// checkpoint out of the core; the Manager keeps what the API and several
// capabilities share. Make it with NewTemplateCore; the daemon gives it to
// template.New.
type TemplateCore struct{ m *Manager }

// NewTemplateCore is the template catalog's side of m.
func NewTemplateCore(m *Manager) *TemplateCore { return &TemplateCore{m: m} }

// Heavy takes a slot among the daemon's heavy operations for what (see
// heavyGate): the template catalog's builds and imports count as heavy.
func (t *TemplateCore) Heavy(ctx context.Context, what string) (leave func(), err error) {
	return t.m.heavy.enter(ctx, what)
}

// HoldCheckpoint finds checkpoint from and holds it and its sandbox as a
// source, as a fork does, until release is called: the template catalog
// copies it meanwhile.
func (t *TemplateCore) HoldCheckpoint(ctx context.Context, from *api.ForkSource) (*checkpoint.Source, func(), error) {
	src, cp, unlock, err := t.m.sourceCheckpoint(ctx, from)
	if err != nil {
		return nil, nil, err
	}
	s := &checkpoint.Source{
		Sandbox: src.Name, SecretFiles: src.SecretFiles, Checkpoint: cp,
		Snapshot: snapName(src.ID, cp.ID),
	}
	if cp.Memory {
		s.MemDir = filepath.Join(t.m.machine.checkpointDir(src.ID, cp.ID), memDir)
		s.AgentToken = t.m.agents.heldToken(cp)
	}
	return s, unlock, nil
}

// CheckResources refuses resources no sandbox may have.
func (t *TemplateCore) CheckResources(r api.Resources) error { return checkResources(r) }

// AdmitTemplate holds a checkpoint template of org that will hold bytes to
// the org's disk quota until release (see admission.template).
func (t *TemplateCore) AdmitTemplate(ctx context.Context, org string, bytes int64) (release func(), err error) {
	return t.m.admit.template(ctx, org, bytes)
}
