package checkpoints

import (
	"context"
	"fmt"
	"maps"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/store"
)

// errForkSettings is the seed's message for a fork that names what it must
// take from the checkpoint. Only resources.disk_mib may be given: a fork's
// disk limit is its own.
var errForkSettings = api.Errorf(api.CodeInvalid, "a fork takes its template or image and its resources from the checkpoint; don't give them")

// Fork makes a new, independent sandbox from the checkpoint req.From names:
// a copy of its disk and, for a memory checkpoint, its memory, so the
// source's processes run on in the fork. Many forks of one checkpoint may
// be made at once. The core's Create calls it, holding the create's slots.
func (s *Service) Fork(ctx context.Context, req api.CreateSandbox) (*api.Sandbox, error) {
	// Memory must match the checkpoint's (a restore into less fails), but
	// the disk limit is the fork's own.
	if req.Template != "" || req.Image != "" ||
		(req.Resources != nil && (req.Resources.CPUs != 0 || req.Resources.MemoryMiB != 0 || req.Resources.DiskMiB == 0)) {
		return nil, errForkSettings
	}
	if len(req.Services) > 0 {
		return nil, api.Errorf(api.CodeInvalid, "services: a fork takes its services from the checkpoint's disk; don't give any (PUT …/services/{name} once it is up)")
	}
	src, cp, unlock, err := s.source(ctx, req.From)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// A fork writes little at first (its bundle, runsc's state; its disk
	// is copy-on-write), but with the data dir at its reserve it would
	// fail part-way, or starve the store: refuse it before any record.
	if err := disk.RequireSpace(s.cfg.DataDir, "a fork", 0); err != nil {
		return nil, err
	}
	if err := disk.RequireSpace(s.disks.VolumePath(src.ID), "a fork's disk", 0); err != nil {
		return nil, err
	}
	req.From = &api.ForkSource{Sandbox: src.Name, Checkpoint: cp.ID}
	sb, err := s.core.NewRecord(ctx, req)
	if err != nil {
		return nil, err
	}
	diskMiB := sb.Resources.DiskMiB // the request's, checked by NewRecord, or the default
	if err := s.core.TakeFromCheckpoint(ctx, sb, cp, req.Env); err != nil {
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
	if v, ok, err := s.core.ClaimPooled(ctx, src, cp, sb); ok {
		return v, err
	}
	end, err := s.core.Insert(ctx, sb)
	if err != nil {
		return nil, err
	}
	defer end()
	crash.Point("fork.stored")
	ctx = context.WithoutCancel(ctx)
	start := time.Now()
	if err := s.core.BootFork(ctx, sb, src, cp); err != nil {
		s.log.Error("fork failed", "sandbox", sb.ID, "err", err)
		if derr := s.core.Destroy(ctx, sb); derr != nil {
			s.log.Error("cleaning up after failed fork", "sandbox", sb.ID, "err", derr)
		}
		return nil, agentconn.Failed(s.core.SpaceError(fmt.Errorf("forking %s at %s: %w", src.Name, cp.ID, err), sb, "a fork"))
	}
	s.log.Info("sandbox forked", "sandbox", sb.ID, "name", sb.Name, "from", src.ID, "checkpoint", cp.ID, "ms", time.Since(start).Milliseconds())
	return s.core.View(sb), nil
}

// orNil is a copy of m, nil when m is empty: a record's secrets are nil
// when it has none, as the core's are.
func orNil(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}

// source is a fork's source checkpoint, read-locked until unlock. With an
// object store (Config.Fetch), a checkpoint another node took is fetched
// from it first, and the fork is made from that copy as from one of this
// node's own.
func (s *Service) source(ctx context.Context, from *api.ForkSource) (src *store.Sandbox, cp *store.Checkpoint, unlock func(), err error) {
	if s.cfg.Fetch == nil {
		return s.core.SourceCheckpoint(ctx, from)
	}
	src, cp, unlock, remote, err := s.core.SourceStored(ctx, from)
	if err != nil || !remote {
		return src, cp, unlock, err
	}
	if err := s.cfg.Fetch.Fetch(ctx, src, cp); err != nil {
		unlock()
		return nil, nil, nil, err
	}
	return src, cp, unlock, nil
}
