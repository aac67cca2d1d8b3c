package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/store"
)

// errForkSettings is the seed's message for a fork that names what it must
// take from the checkpoint. Only resources.disk_mib may be given: a fork's
// disk limit is its own.
var errForkSettings = api.Errorf(api.CodeInvalid, "a fork takes its template or image and its resources from the checkpoint; don't give them")

// fork makes a new, independent sandbox from a checkpoint: a copy of its
// disk and, for a memory checkpoint, its memory, so the source's processes
// run on in the fork. Many forks of one checkpoint may be made at once.
func (m *Manager) fork(ctx context.Context, req api.CreateSandbox) (*api.Sandbox, error) {
	// Memory must match the checkpoint's (a restore into less fails), but
	// the disk limit is the fork's own.
	if req.Template != "" || req.Image != "" ||
		(req.Resources != nil && (req.Resources.CPUs != 0 || req.Resources.MemoryMiB != 0 || req.Resources.DiskMiB == 0)) {
		return nil, errForkSettings
	}
	if len(req.Services) > 0 {
		return nil, api.Errorf(api.CodeInvalid, "services: a fork takes its services from the checkpoint's disk; don't give any (PUT …/services/{name} once it is up)")
	}
	src, cp, unlock, err := m.sourceCheckpoint(ctx, req.From)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// A fork writes little at first (its bundle, runsc's state; its disk
	// is copy-on-write), but with the data dir at its reserve it would
	// fail part-way, or starve the store: refuse it before any record.
	if err := disk.RequireSpace(m.cfg.DataDir, "a fork", 0); err != nil {
		return nil, err
	}
	if err := disk.RequireSpace(m.disks.VolumePath(src.ID), "a fork's disk", 0); err != nil {
		return nil, err
	}
	req.From = &api.ForkSource{Sandbox: src.Name, Checkpoint: cp.ID}
	sb, err := m.newRecord(ctx, req)
	if err != nil {
		return nil, err
	}
	diskMiB := sb.Resources.DiskMiB // the request's, checked by newRecord, or the default
	if err := m.takeFromCheckpoint(ctx, sb, cp, req.Env); err != nil {
		return nil, fmt.Errorf("forking %s at %s: %w", src.Name, cp.ID, err)
	}
	if req.Resources != nil && req.Resources.DiskMiB != 0 {
		sb.Resources.DiskMiB = diskMiB
	}
	if len(req.Secrets) == 0 && len(req.SecretFiles) == 0 {
		// The seed: secrets come from the source unless the fork gives
		// its own. The references are the source's now, not the
		// checkpoint's.
		sb.Secrets, sb.SecretFiles = orNil(src.Secrets), orNil(src.SecretFiles)
	}
	if req.Network == nil {
		// A fork of a restricted sandbox is restricted too.
		sb.Network = src.Network
	}
	if v, ok, err := m.pools.Claim(ctx, PoolSource{Sandbox: src.ID, Checkpoint: cp.ID}, sb, nil); ok {
		return v, err
	}
	end, _ := m.begin(sb, opCreate) // before it is stored: see Create
	defer end()
	if err := m.insert(ctx, sb); err != nil {
		return nil, err
	}
	crash.Point("fork.stored")
	ctx = context.WithoutCancel(ctx)
	start := time.Now()
	if err := m.bootFork(ctx, sb, src, cp); err != nil {
		m.log.Error("fork failed", "sandbox", sb.ID, "err", err)
		if derr := m.destroy(ctx, sb); derr != nil {
			m.log.Error("cleaning up after failed fork", "sandbox", sb.ID, "err", derr)
		}
		return nil, publicError(m.spaceError(fmt.Errorf("forking %s at %s: %w", src.Name, cp.ID, err), sb, m.cfg.DataDir, "a fork"))
	}
	m.log.Info("sandbox forked", "sandbox", sb.ID, "name", sb.Name, "from", src.ID, "checkpoint", cp.ID, "ms", time.Since(start).Milliseconds())
	return m.view(sb), nil
}

// bootFork gives a fork a copy of the checkpoint's disk and starts it: from
// the checkpoint's memory, or fresh on the disk for a disk-only checkpoint.
func (m *Manager) bootFork(ctx context.Context, sb *store.Sandbox, src *store.Sandbox, cp *store.Checkpoint) error {
	if _, err := m.disks.CloneSnapshot(ctx, snapName(src.ID, cp.ID), sb.ID); err != nil {
		return fmt.Errorf("copying the disk: %w", err)
	}
	if err := m.limitDisk(ctx, sb); err != nil {
		return fmt.Errorf("copying the disk: %w", err)
	}
	crash.Point("fork.disk")
	if !cp.Memory {
		return m.boot(ctx, sb, false)
	}
	return m.resume(ctx, sb, cp)
}

// forgetSource drops the lock on a deleted sandbox's checkpoints and what
// is known of its agent, so that the maps do not grow with every sandbox
// ever made. A fork still waiting
// on the old lock finds the sandbox gone once it gets it.
func (m *Manager) forgetSource(id string) {
	m.forgetLive(id)
}

// sourceLock is the lock on a sandbox's checkpoints.
func (m *Manager) sourceLock(id string) *sync.RWMutex {
	return &m.live(id).source
}

// sourceCheckpoint finds the checkpoint from names (a fork's or a
// template's source) and holds its sandbox as a source, so that neither is
// deleted while the caller reads it; the caller calls unlock when done.
func (m *Manager) sourceCheckpoint(ctx context.Context, from *api.ForkSource) (src *store.Sandbox, cp *store.Checkpoint, unlock func(), err error) {
	if from == nil || from.Sandbox == "" || from.Checkpoint == "" {
		return nil, nil, nil, api.Errorf(api.CodeInvalid, "from: give both sandbox and checkpoint")
	}
	if src, err = m.lookup(ctx, from.Sandbox); err != nil {
		return nil, nil, nil, err
	}
	unlock = m.rlockSource(src.ID)
	if cp, err = m.findCheckpoint(ctx, src, from.Checkpoint); err != nil {
		unlock()
		return nil, nil, nil, err
	}
	return src, cp, unlock, nil
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
	res, err := m.cfg.Images.Lookup(ctx, sb.Image)
	if err != nil {
		return err
	}
	sb.Env = imageEnv(res.Config, env)
	return nil
}
