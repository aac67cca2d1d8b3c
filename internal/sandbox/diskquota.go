package sandbox

import (
	"context"
	"errors"
	"fmt"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/store"
)

// limitDisk bounds what a sandbox's disk holds beyond its template to
// resources.disk_mib, on a volume just made (created, restored, forked or
// made from a template: a new volume starts with no limit), or again after
// a restart. A pool that cannot limit volumes is no error: the sandbox's
// view then says the limit is not enforced (see diskUse).
func (mc *machine) limitDisk(ctx context.Context, sb *store.Sandbox) error {
	m := mc.m
	l, ok := m.disks.(disk.Limiter)
	if !ok || sb.Resources.DiskMiB <= 0 {
		return nil
	}
	base, err := mc.diskBase(ctx, sb)
	if err != nil {
		return fmt.Errorf("limiting the disk of %s: %w", sb.ID, err)
	}
	if err := l.SetLimit(ctx, sb.ID, int64(sb.Resources.DiskMiB)<<20, base); err != nil && !errors.Is(err, disk.ErrNoQuotas) {
		return err
	}
	return nil
}

// diskQuota is the directory of the counters of sb's disk quota, for the
// runtime to show in the sandbox's statfs (runtime.Spec.DiskQuota), or ""
// where the pool keeps none. It is asked for on every start and restore:
// a restored or forked sandbox runs on a new volume with a quota of its
// own. The counters are read live, so a limit set after the start (a warm
// sandbox claimed, a restore's new volume) shows as soon as it is set.
func (mc *machine) diskQuota(ctx context.Context, sb *store.Sandbox) string {
	m := mc.m
	l, ok := m.disks.(disk.Limiter)
	if !ok {
		return ""
	}
	dir, err := l.QuotaDir(ctx, sb.ID)
	if err != nil {
		m.log.Warn("finding a disk's quota; df in the sandbox shows the whole pool", "sandbox", sb.ID, "err", err)
		return ""
	}
	return dir
}

// relimitDisk sets a recovered sandbox's disk limit again: a crash may
// have come between a restore's new volume and its limit, and a pool whose
// quotas were switched to classic qgroups lost every limit.
func (mc *machine) relimitDisk(ctx context.Context, sb *store.Sandbox) {
	m := mc.m
	if sb.State == api.StateDeleting || sb.State == api.StateCreating {
		return
	}
	if err := mc.limitDisk(ctx, sb); err != nil && !errors.Is(err, disk.ErrNotFound) {
		m.log.Warn("limiting a recovered sandbox's disk", "sandbox", sb.ID, "err", err)
	}
}

// diskBase is the tree in the disk pool that sb's disk descends from, which
// its use does not count: the template kept from a checkpoint that it (or
// the sandbox it was forked from) was made from, else its image's template,
// else its template. A restore or a fork keeps the data its checkpoint
// holds, and so its use: only the template is free.
func (mc *machine) diskBase(ctx context.Context, sb *store.Sandbox) (disk.Base, error) {
	m := mc.m
	if man, err := m.tpl.Kept(sb.Org, sb.Template); err != nil {
		return disk.Base{}, err
	} else if man != nil {
		return disk.Base{Snapshot: man.Snapshot}, nil
	}
	if sb.Image != "" {
		tpl, err := m.machine.imageTemplate(ctx, sb)
		if err != nil {
			return disk.Base{}, err
		}
		return disk.Base{Template: tpl}, nil
	}
	return disk.Base{Template: sb.Template}, nil
}

// diskUse is a sandbox's disk use as its view shows it. It reads the
// pool's counters and never wakes the sandbox. Use is left out where the
// pool keeps no counters, and enforced is true only when the sandbox's
// volume really has a limit (not on the copy pool, btrfs without quotas,
// or a volume made before quotas were turned on).
func (mc *machine) diskUse(ctx context.Context, sb *store.Sandbox) *api.DiskUse {
	m := mc.m
	d := &api.DiskUse{LimitMiB: sb.Resources.DiskMiB}
	l, ok := m.disks.(disk.Limiter)
	if !ok {
		return d
	}
	base, err := mc.diskBase(ctx, sb)
	if err != nil {
		m.log.Warn("finding the template of a disk", "sandbox", sb.ID, "err", err)
		return d
	}
	used, limit, err := l.DiskUse(ctx, sb.ID, base)
	if err != nil {
		// No volume yet (creating) or gone (deleting), or no quotas.
		if !errors.Is(err, disk.ErrNotFound) && !errors.Is(err, disk.ErrNoQuotas) {
			m.log.Warn("reading disk use", "sandbox", sb.ID, "err", err)
		}
		return d
	}
	d.UsedBytes = &used
	d.Enforced = limit > 0
	return d
}
