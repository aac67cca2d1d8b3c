package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/store"
)

// Sleep and wake.
//
// A sleeping sandbox has no container: its memory is a memory image in
// DATA_DIR/sandboxes/ID/sleep/mem (the sleep image, a memory checkpoint
// that is not listed), its disk is its volume as it was. No disk snapshot
// is taken for a sleep: with the container gone nothing writes the volume,
// every call that would (exec, files, sessions, services) wakes the
// sandbox first, and the calls that replace it (a restore) drop the sleep
// image with it. A wake restores the image onto the volume in place.
//
// The image is made durable (fsync, rename) before the state says
// sleeping, so a crash part-way leaves the sandbox running (its container
// still there, or booted again on its disk) or asleep, never lost; see
// recoverSleeping.
//
// The core keeps what is the state machine's: a sleep and a wake are
// operations on the sandbox, a call that needs it running wakes it (awake,
// one wake however many callers), and its activity is on its live object
// (idle.go). The images on disk and idle sleep are package sleep's: the
// core asks it for the images (SleepImages, given as Config.Sleep), idle
// sleep asks the core (IdleCore).

// SleepImages keeps the memory images of sleeping sandboxes (package
// sleep keeps them on disk; the core orders the calls on one sandbox under
// its operation). An image is made durable before the sandbox counts as
// asleep, and dropped before a woken sandbox counts as running.
type SleepImages interface {
	// Dir is sandbox id's sleep dir: there from the start of a sleep until
	// the sandbox runs again; an unfinished image is in a temporary dir of
	// it (Dir/.tmp-*/mem, see resumeLeft).
	Dir(id string) string
	// Image is the durable memory image of sleeping sandbox id; Has
	// reports whether there is one.
	Image(id string) string
	Has(id string) (bool, error)
	// Begin makes sandbox id's sleep dir afresh and returns where the
	// runtime writes the image; Commit makes that image, written, durable
	// and sandbox id's, holding token generation gen.
	Begin(id string) (img string, err error)
	Commit(id, img string, gen int) error
	// Drop removes sandbox id's sleep dir at once (by a rename); Sweep
	// removes what a Drop a crash cut short left, and reports whether
	// there was any.
	Drop(id string) error
	Sweep(id string) (bool, error)
	// HeldGen is the token generation the agent in sandbox id's image
	// holds, fallback when it says none.
	HeldGen(id string, fallback int) int
}

// noSleep are the sleep images of a Manager made without any: no sandbox
// sleeps, none has an image.
type noSleep struct{}

// errNoSleep is noSleep's refusal of a sleep.
var errNoSleep = api.Errorf(api.CodeUnavailable, "this daemon does not put sandboxes to sleep")

func (noSleep) Dir(string) string                { return "" }
func (noSleep) Image(string) string              { return "" }
func (noSleep) Has(string) (bool, error)         { return false, nil }
func (noSleep) Begin(string) (string, error)     { return "", errNoSleep }
func (noSleep) Commit(string, string, int) error { return errNoSleep }
func (noSleep) Drop(string) error                { return nil }
func (noSleep) Sweep(string) (bool, error)       { return false, nil }
func (noSleep) HeldGen(_ string, gen int) int    { return gen }

// Sleep puts a running sandbox to sleep now. Sleeping a sleeping sandbox
// is not an error.
func (m *Manager) Sleep(ctx context.Context, ref string) (*api.Sandbox, error) {
	sb, end, err := m.claim(ctx, ref, opSleep)
	if err != nil {
		return nil, err
	}
	defer end()
	if sb.State == api.StateSleeping {
		return m.view(sb), nil
	}
	if err := requireState(sb.Name, sb.State, api.StateRunning); err != nil {
		return nil, err
	}
	m.drain(sb.ID)
	if err := m.sleep(context.WithoutCancel(ctx), sb); err != nil {
		return nil, publicError(m.machine.spaceError(fmt.Errorf("putting %s to sleep: %w", sb.Name, err), sb, m.cfg.DataDir, "a sleep"))
	}
	return m.view(sb), nil
}

// sleep writes a running sandbox's sleep image and removes its container.
// The caller holds the sandbox's operation.
func (m *Manager) sleep(ctx context.Context, sb *store.Sandbox) error {
	// Its image is a memory checkpoint's: refused before the pause when
	// the data dir cannot hold it, the sandbox running on.
	if err := disk.RequireSpace(m.cfg.DataDir, "a sleep image", m.machine.checkpointNeed(sb, true)); err != nil {
		return err
	}
	start := time.Now()
	img, err := m.sleepImages.Begin(sb.ID)
	if err != nil {
		return err
	}
	m.closeStreams(sb.ID, "the sandbox is going to sleep")
	m.agents.dropAgentConns()
	if err := m.rt.Pause(ctx, sb.ID); err != nil {
		_ = m.sleepImages.Drop(sb.ID)
		return fmt.Errorf("pausing: %w", err)
	}
	err = m.rt.Checkpoint(ctx, sb.ID, img, runtime.CheckpointOptions{})
	if err == nil {
		crash.Point("sleep.image")
		// The image expects the disk as it was: what the sandbox wrote
		// to it must be on disk before the image counts.
		err = checkpoint.SyncVolume(m.disks.VolumePath(sb.ID))
	}
	if err == nil {
		err = m.sleepImages.Commit(sb.ID, img, sb.AgentGen)
	}
	if err != nil {
		_ = m.sleepImages.Drop(sb.ID)
		// Still there, paused, or stopped by a checkpoint that failed
		// late: resume it, or boot it again on its disk.
		if rerr := m.rt.Resume(ctx, sb.ID); rerr == nil {
			return errors.Join(fmt.Errorf("writing the sleep image: %w", err), m.machine.applyLimits(ctx, sb))
		}
		_ = m.rt.Delete(ctx, sb.ID)
		if berr := m.machine.boot(ctx, sb, opSleep, false); berr != nil {
			_ = m.setState(ctx, sb, api.StateError, "a sleep failed and it did not boot again: "+berr.Error())
			return errors.Join(err, berr)
		}
		return fmt.Errorf("writing the sleep image (booted again on its disk): %w", err)
	}
	if err := m.rt.Delete(ctx, sb.ID); err != nil {
		// The image is durable: the sandbox sleeps; recovery or the wake
		// deletes what is left of the container.
		m.log.Warn("deleting the container of a sleeping sandbox", "sandbox", sb.ID, "err", err)
	}
	crash.Point("sleep.deleted")
	if m.inside != nil {
		m.inside.Close(sb.ID)
	}
	if err := m.setState(ctx, sb, api.StateSleeping, ""); err != nil {
		return err
	}
	if m.cfg.SleepStore != nil {
		// Stored, it pins no node: it may wake on any (adopt.go).
		m.cfg.SleepStore.QueueSleep(sb.ID)
	}
	m.log.Info("asleep", "sandbox", sb.ID, "ms", time.Since(start).Milliseconds())
	return nil
}

// Wake wakes a sleeping sandbox, and boots a broken one (state error, say
// one whose sandbox process died) again on its disk; waking a running one
// is not an error.
func (m *Manager) Wake(ctx context.Context, ref string) (*api.Sandbox, error) {
	sb, err := m.awake(ctx, ref)
	if err != nil {
		return nil, err
	}
	if sb.State == api.StateError {
		return m.bootAgain(ctx, sb.ID)
	}
	return m.view(sb), nil
}

// bootAgain boots a broken sandbox again on its disk as it is: its
// processes start afresh (the agent starts its services), its files are
// kept. A sandbox left without a disk (a restore that failed part-way) can
// only be restored.
func (m *Manager) bootAgain(ctx context.Context, id string) (*api.Sandbox, error) {
	sb, end, err := m.claim(ctx, id, opBoot)
	if err != nil {
		return nil, err
	}
	defer end()
	if sb.State != api.StateError {
		return m.view(sb), nil // mended meanwhile
	}
	if _, err := os.Stat(m.disks.VolumePath(sb.ID)); err != nil {
		return nil, api.Errorf(api.CodeConflict, "sandbox %s has no disk to boot on (%s): restore a checkpoint", sb.Name, sb.Error)
	}
	admitted, err := m.admit.start(ctx, sb)
	if err != nil {
		return nil, err
	}
	defer admitted()
	ctx = context.WithoutCancel(ctx)
	_ = m.rt.Delete(ctx, sb.ID) // what is left of the container
	if err := m.machine.boot(ctx, sb, opBoot, false); err != nil {
		_ = m.rt.Delete(ctx, sb.ID)
		_ = m.setState(ctx, sb, api.StateError, "booting it again on its disk failed: "+err.Error())
		return nil, publicError(fmt.Errorf("booting %s again on its disk: %w", sb.Name, err))
	}
	m.log.Info("booted again on its disk", "sandbox", sb.ID, "name", sb.Name)
	return m.view(sb), nil
}

// Use wakes a sandbox if it sleeps and marks it active now, so that its
// idle time starts again. It is for code outside this package that sends
// the sandbox work the Manager does not see, such as the HTTP requests of
// its URL: call it before each request (or connection) is sent on. It
// returns the sandbox, running, or the error that kept it from running.
func (m *Manager) Use(ctx context.Context, ref string) (*api.Sandbox, error) {
	// Not Wake: a request to a broken sandbox's URL does not boot it.
	sb, err := m.awake(ctx, ref)
	if err != nil {
		return nil, err
	}
	return m.view(sb), nil
}

// Active marks sandbox id (an id, not a name) active until release is
// called, as an open stream does, without waking it or reading its record:
// it is for a caller that has just found the sandbox running (Use, or
// HTTPTarget), such as the URL front door, which holds every request it
// passes on for as long as the request, its response or its WebSocket
// lasts. The sandbox's idle time starts again at the release. Release must
// be called once; calling it again does nothing.
func (m *Manager) Active(id string) (release func()) {
	return m.live(id).activate()
}

// awake is the start of every call that needs a sandbox running: it finds
// the sandbox, wakes it if it sleeps (one wake, however many callers ask
// at once), and marks it active. A call that comes while the sandbox goes
// to sleep waits for the sleep and wakes it; one that comes while another
// operation holds a sleeping sandbox (a checkpoint of it) waits for that.
// It returns the sandbox's fresh record; the caller still checks its state
// (a stopped or broken sandbox is not woken).
func (m *Manager) awake(ctx context.Context, ref string) (*store.Sandbox, error) {
	for {
		read := time.Now()
		sb, err := lookupAdopt(ctx, m, ref)
		if err != nil {
			return nil, err
		}
		l := m.live(sb.ID)
		// Marked before the look at the operations: an idle sleep that
		// claims the sandbox looks at this mark again, and gives up.
		l.touch(time.Now())
		if held := l.heldOn(); held != nil {
			// A memory checkpoint is being taken: the call goes in once
			// it is, with the agent's new token (read again above).
			if err := waitOp(ctx, held); err != nil {
				return nil, err
			}
			continue
		}
		op, done := l.current()
		if op == opSleep || sb.State == api.StateSleeping && op != opNone && op != opWake {
			// Going to sleep, or held asleep: wake it once that is done.
			if err := l.waitOp(ctx, done); err != nil {
				return nil, err
			}
			continue
		}
		if op == opNone && l.endedSince(read) {
			// The record was read before the look at the operations, and
			// an operation ended in between: a sleep that did left it
			// saying running, with the container gone. An operation
			// stores its result before it ends, so a read now sees it.
			if sb, err = m.lookup(ctx, sb.ID); err != nil {
				return nil, err
			}
		}
		if sb.State != api.StateSleeping {
			return sb, nil
		}
		// One wake however many callers ask: the first runs it, the others
		// wait for it (or their own ctx); the first's giving up does not
		// cut the wake.
		err = l.wake(ctx, func() error { return m.wakeOne(context.WithoutCancel(ctx), sb.ID) })
		if errors.Is(err, errBusy) {
			// Another operation took the sandbox first: wait for its end.
			_, done := l.current()
			if err := l.waitOp(ctx, done); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		l.touch(time.Now())
	}
}

// errBusy is wakeOne's: another operation holds the sandbox; try again.
var errBusy = errors.New("busy")

// holdCalls makes the calls that come to sandbox id wait (in awake) until
// release is called. A memory checkpoint holds them from before it cuts
// the calls in flight until its agent takes its new token: a call let in
// meanwhile would be cut, or would reach the agent with the token it no
// longer answers to. The spec cuts only calls in flight, so new ones wait.
func (m *Manager) holdCalls(id string) (release func()) {
	l := m.live(id)
	l.mu.Lock()
	defer l.mu.Unlock()
	ch := make(chan struct{})
	l.held = ch
	l.heldAt = time.Now()
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.held == ch {
			l.held = nil
		}
		l.heldAt = time.Now()
		close(ch)
	}
}

// heldSinceLocked reports whether calls to the sandbox are held now, or a
// hold began or ended at or after t: a call that read the sandbox's record
// after t may carry the agent's token of before the hold (see Relay). The
// caller holds l.mu.
func (l *live) heldSinceLocked(t time.Time) bool {
	return l.held != nil || !l.heldAt.IsZero() && !l.heldAt.Before(t)
}

// wakeOne claims a sleeping sandbox and wakes it.
func (m *Manager) wakeOne(ctx context.Context, id string) error {
	sb, end, err := m.claim(ctx, id, opWake)
	if errors.Is(err, api.ErrConflict) {
		return errBusy
	}
	if err != nil {
		return err
	}
	defer end()
	if sb.State != api.StateSleeping {
		return nil
	}
	admitted, err := m.admit.start(ctx, sb)
	if err != nil {
		return err
	}
	defer admitted()
	leave, err := m.heavy.enter(ctx, "waking "+sb.Name)
	if err != nil {
		return err
	}
	defer leave()
	if err := m.wake(ctx, sb); err != nil {
		m.log.Error("wake failed", "sandbox", sb.ID, "err", err)
		return publicError(fmt.Errorf("waking %s: %w", sb.Name, err))
	}
	return nil
}

// wake restores a sleeping sandbox from its sleep image, in place, and
// drops the image. The agent wakes up with the token it slept with; it is
// given the next generation (as after a restore), since a memory
// checkpoint taken while it slept holds the same image.
func (m *Manager) wake(ctx context.Context, sb *store.Sandbox) error {
	// The call's audit record goes with the write that stores the sandbox
	// running: a crash before leaves it asleep (see recoverSleeping).
	audited := ctx
	ctx = store.HoldAudit(ctx)
	start := time.Now()
	holds := []string{AgentToken(m.cfg.Secret, sb.ID, m.sleepImages.HeldGen(sb.ID, sb.AgentGen))}
	if sb.LegacyAgentToken != "" {
		holds = append(holds, sb.LegacyAgentToken)
	}
	if m.cfg.SleepStore != nil {
		// Its stored image is of this sleep alone: the wake moves the
		// token generation on, so no node wakes it from that image again.
		m.cfg.SleepStore.ForgetSleep(sb.ID)
	}
	_ = m.rt.Delete(ctx, sb.ID) // what a crash may have left
	ep, err := m.machine.prepare(ctx, sb)
	if err != nil {
		return err
	}
	sb.AgentGen++
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		return fmt.Errorf("numbering the agent token of %s: %w", sb.ID, err)
	}
	crash.Point("wake.numbered")
	if err := m.rt.Restore(ctx, m.machine.spec(ctx, sb, ep), m.sleepImages.Image(sb.ID)); err != nil {
		_ = m.rt.Delete(ctx, sb.ID)
		return fmt.Errorf("restoring memory: %w", err)
	}
	crash.Point("wake.restored")
	restored := time.Now()
	if err := m.agents.takeBack(ctx, sb, opWake, ep, holds...); err != nil {
		_ = m.rt.Delete(ctx, sb.ID)
		return err
	}
	crash.Point("wake.connected")
	// The image goes before the state says running: a running sandbox
	// with a sleep image is one a crash cut short while going to sleep
	// (see recoverMidSleep), whose container recovery would delete, and
	// this one has run, and written its disk, since the image was taken.
	// A crash between the two leaves it sleeping with its container
	// running, which recoverSleeping takes back.
	if err := m.sleepImages.Drop(sb.ID); err != nil {
		_ = m.rt.Delete(ctx, sb.ID)
		return fmt.Errorf("removing the sleep image: %w", err)
	}
	crash.Point("wake.image-dropped")
	if err := m.setState(audited, sb, api.StateRunning, ""); err != nil {
		return err
	}
	m.log.Info("awake", "sandbox", sb.ID, "runtime_ms", restored.Sub(start).Milliseconds(),
		"ms", time.Since(start).Milliseconds())
	return nil
}

// recoverSleeping takes back a sandbox whose record says sleeping: one
// whose wake a crash cut short after its container was restored is taken
// back running; otherwise it stays asleep on its image, or, with the image
// lost, boots again on its disk.
func (r *recovery) recoverSleeping(ctx context.Context, sb *store.Sandbox) error {
	m := r.m
	st, err := m.rt.State(ctx, sb.ID)
	if err == nil && st == runtime.StatusRunning {
		ep, err := m.Endpoint(sb)
		if err != nil {
			return err
		}
		holds := append(m.agents.recoveryTokens(sb), AgentToken(m.cfg.Secret, sb.ID, m.sleepImages.HeldGen(sb.ID, sb.AgentGen)))
		if err := m.agents.takeBack(ctx, sb, opRecover, ep, holds...); err == nil {
			m.log.Info("finishing interrupted wake", "sandbox", sb.ID)
			if err := m.machine.applyLimits(ctx, sb); err != nil {
				return err
			}
			if err := m.setState(ctx, sb, api.StateRunning, ""); err != nil {
				return err
			}
			return m.sleepImages.Drop(sb.ID)
		}
	}
	if err := m.rt.Delete(ctx, sb.ID); err != nil {
		return err
	}
	ok, err := m.sleepImages.Has(sb.ID)
	if err != nil {
		return err
	}
	if ok {
		m.log.Info("sandbox asleep", "sandbox", sb.ID, "name", sb.Name)
		return nil
	}
	if m.cfg.SleepStore != nil {
		// Stored: a crash took the local copy part-way (through a
		// takeover, adopt), nothing of the sandbox is lost.
		err := refetchSleep(ctx, m, sb)
		if err == nil {
			m.log.Info("the sleep image was gone here; fetched it again from the object store", "sandbox", sb.ID, "name", sb.Name)
			return nil
		}
		m.log.Warn("fetching the stored sleep image of a sandbox whose own is gone", "sandbox", sb.ID, "err", err)
	}
	m.log.Error("the sleep image is gone; booting the sandbox again on its disk", "sandbox", sb.ID)
	return m.machine.boot(ctx, sb, opRecover, false)
}

// recoverMidSleep is for a sandbox whose record says running and that has
// a sleep dir: a crash came part-way through a sleep. With the image
// durable, the checkpoint that wrote it stopped the container: the sandbox
// sleeps. Without, the checkpoint may or may not have ended it (runsc may
// still call it running): it is taken back if its agent answers soon;
// else it is started again from the image that checkpoint left unfinished
// (not yet synced and renamed), as before the sleep, or, if that image is
// not whole, booted again on its disk. It reports whether it dealt with sb.
func (r *recovery) recoverMidSleep(ctx context.Context, sb *store.Sandbox) (bool, error) {
	m := r.m
	if _, err := os.Stat(m.sleepImages.Dir(sb.ID)); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	ok, err := m.sleepImages.Has(sb.ID)
	if err != nil {
		return true, err
	}
	if ok {
		m.log.Info("finishing interrupted sleep", "sandbox", sb.ID)
		if err := m.rt.Delete(ctx, sb.ID); err != nil {
			return true, err
		}
		return true, m.setState(ctx, sb, api.StateSleeping, "")
	}
	// The sleep dir goes only once the sandbox runs again, so that a
	// crash in between comes back here.
	st, err := m.rt.State(ctx, sb.ID)
	if err == nil && st == runtime.StatusPaused {
		_ = m.rt.Resume(ctx, sb.ID)
	}
	if ep, eerr := m.Endpoint(sb); err == nil && st != runtime.StatusStopped && eerr == nil {
		cctx, cancel := context.WithTimeout(ctx, midSleepWait)
		err = m.agents.takeBack(cctx, sb, opRecover, ep, m.agents.recoveryTokens(sb)...)
		cancel()
		if err == nil {
			m.log.Info("a sleep was cut short; the sandbox runs on", "sandbox", sb.ID)
			return true, errors.Join(m.machine.applyLimits(ctx, sb), m.sleepImages.Drop(sb.ID))
		}
	}
	if err := m.rt.Delete(ctx, sb.ID); err != nil {
		return true, err
	}
	// Stopped by the checkpoint that writes the image: started again from
	// that image if it is whole, else booted on its disk.
	if r.resumeLeft(ctx, sb, m.sleepImages.Dir(sb.ID), opSleep) {
		return true, m.sleepImages.Drop(sb.ID)
	}
	if err := m.sleepImages.Drop(sb.ID); err != nil {
		return true, err
	}
	m.log.Warn("a sleep was cut short and stopped the sandbox; booting it again on its disk", "sandbox", sb.ID)
	return true, m.machine.boot(ctx, sb, opRecover, false)
}

// midSleepWait bounds how long recovery waits for the agent of a sandbox
// whose sleep a crash cut short.
const midSleepWait = 5 * time.Second
