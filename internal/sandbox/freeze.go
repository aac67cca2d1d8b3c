package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/store"
)

// freeze takes a running sandbox's memory image and disk snapshot while it
// is paused, and resumes it. It returns how long the sandbox was paused.
func (m *Manager) freeze(ctx context.Context, sb *store.Sandbox, imageDir, snap, why string, st *steps) (time.Duration, error) {
	m.closeStreams(sb.ID, why)
	m.dropAgentConns()
	st.done("streams")
	if hc, ok := m.rt.(runtime.HeldCheckpointer); ok {
		return m.freezeHeld(ctx, hc, sb, imageDir, snap, st)
	}
	start := time.Now()
	if err := m.rt.Pause(ctx, sb.ID); err != nil {
		return 0, fmt.Errorf("pausing: %w", err)
	}
	st.done("pause")
	err := m.rt.Checkpoint(ctx, sb.ID, imageDir, runtime.CheckpointOptions{LeaveRunning: true})
	if err == nil {
		st.done("image")
		err = m.snapshotFrozen(ctx, sb, snap, st)
	}
	if rerr := m.rt.Resume(ctx, sb.ID); rerr != nil {
		err = errors.Join(err, fmt.Errorf("resuming: %w", rerr))
		// Not running any more, whatever the record said; a restore or
		// a restart of the daemon (which resumes paused sandboxes) mends it.
		_ = m.setState(ctx, sb, api.StateError, "left paused: "+rerr.Error())
	}
	paused := time.Since(start)
	st.done("resume")
	if err != nil {
		// The runtime lifts the CPU quota while it writes the image; a
		// checkpoint that failed part-way must not leave it lifted.
		err = errors.Join(err, m.applyLimits(ctx, sb))
	}
	return paused, err
}

// freezeHeld is freeze with a runtime that holds the sandbox paused
// through its own checkpoint call: the disk snapshot is taken inside it,
// while the memory is still being written when the runtime says when the
// filesystem is flushed, and the pause holds no start-up of separate pause
// and resume commands.
// The time returned runs from the call, which pauses, to its return, after
// the resume: the pause itself is within it.
func (m *Manager) freezeHeld(ctx context.Context, hc runtime.HeldCheckpointer, sb *store.Sandbox, imageDir, snap string, st *steps) (time.Duration, error) {
	start := time.Now()
	err := hc.CheckpointHeld(ctx, sb.ID, imageDir, func() error {
		// The command's start, the pause and the flush (or the save).
		st.done("pause_flush")
		return m.snapshotFrozen(ctx, sb, snap, st)
	})
	paused := time.Since(start)
	st.done("resume")
	if err == nil {
		return paused, nil
	}
	// CheckpointHeld resumes the sandbox when it can, and says so when
	// it cannot; then it is not running any more, whatever the record
	// said, and a restore or a restart of the daemon (which resumes
	// paused sandboxes) mends it.
	if rst, serr := m.rt.State(ctx, sb.ID); serr != nil || rst != runtime.StatusRunning {
		_ = m.setState(ctx, sb, api.StateError, "left paused by a checkpoint that failed: "+err.Error())
	}
	// The runtime lifts the CPU quota while it writes the image; a
	// checkpoint that failed part-way must not leave it lifted.
	return paused, errors.Join(err, m.applyLimits(ctx, sb))
}

// snapshotFrozen takes the disk snapshot of a paused sandbox whose
// filesystem is flushed (its memory image written, or being written), the
// one place of freeze's crash points for both ways of holding the pause.
func (m *Manager) snapshotFrozen(ctx context.Context, sb *store.Sandbox, snap string, st *steps) error {
	crash.Point("checkpoint.image")
	if err := m.disks.Snapshot(ctx, sb.ID, snap); err != nil {
		return err
	}
	st.done("snapshot")
	crash.Point("checkpoint.snapshot")
	return nil
}
