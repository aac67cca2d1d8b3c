package sandbox

import (
	"errors"

	"loam.dev/loam/api"

	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/store"
)

// checkpointNeed estimates the bytes a checkpoint of sb writes into the
// data dir. A running sandbox's memory image is at most the host memory its
// container holds (its cgroup's usage, page cache included), or its memory
// limit when that cannot be read. A sleeping sandbox's image is linked, not
// written, and a disk snapshot is copy-on-write: they need the reserve only.
func (mc *machine) checkpointNeed(sb *store.Sandbox, memory bool) int64 {
	m := mc.m
	if !memory || sb.State != api.StateRunning {
		return 0
	}
	if n := m.machine.containerMemory(sb.ID); n > 0 {
		return n
	}
	return int64(sb.Resources.MemoryMiB) << 20
}

// spaceError is disk.SpaceError for host-side work (what) of sandbox sb
// that failed with err, with the cause logged. An error the sandbox's
// agent answered with is never the host's: a sandbox whose own disk is
// full says so in words too, and is the sandbox's business.
func (mc *machine) spaceError(err error, sb *store.Sandbox, dir, what string) error {
	m := mc.m
	var ae *agent.Error
	if err == nil || errors.As(err, &ae) || !disk.IsNoSpace(err) {
		return err
	}
	m.log.Warn("out of space", "sandbox", sb.ID, "work", what, "err", err)
	return disk.SpaceError(err, dir, what)
}
