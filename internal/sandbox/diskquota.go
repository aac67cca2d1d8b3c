package sandbox

import (
	"context"
	"errors"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/store"
)

// limitDisk bounds what a sandbox writes to its disk to resources.disk_mib,
// on a volume just made (created, restored or forked: a new volume starts
// with no limit). A pool that cannot limit volumes is no error: the
// sandbox's view then says the limit is not enforced (see diskUse).
func (m *Manager) limitDisk(ctx context.Context, sb *store.Sandbox) error {
	l, ok := m.disks.(disk.Limiter)
	if !ok || sb.Resources.DiskMiB <= 0 {
		return nil
	}
	if err := l.SetLimit(ctx, sb.ID, int64(sb.Resources.DiskMiB)<<20); err != nil && !errors.Is(err, disk.ErrNoQuotas) {
		return err
	}
	return nil
}

// diskUse is a sandbox's disk use as its view shows it. It reads the
// pool's counters and never wakes the sandbox. Use is left out where the
// pool keeps no counters, and enforced is true only when the sandbox's
// volume really has a limit (not on the copy pool, btrfs without quotas,
// or a volume made before quotas were turned on).
func (m *Manager) diskUse(ctx context.Context, sb *store.Sandbox) *api.DiskUse {
	d := &api.DiskUse{LimitMiB: sb.Resources.DiskMiB}
	l, ok := m.disks.(disk.Limiter)
	if !ok {
		return d
	}
	used, limit, err := l.DiskUse(ctx, sb.ID)
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
