package sandbox

import (
	"context"
	"errors"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Activity. A sandbox is active, and its idle time starts again, at each
// call that needs it running (exec, sessions, files, ports, services, a
// wake, and Use: the requests of its URL), and for as long as a stream
// (an exec or attach socket, a port stream or watch, a file watch, a
// session's wait, a service's logs), a files call or a Hold (a
// connection through its URL) is open on it.
// Listing and reading sandboxes and checkpoints are not activity. A daemon
// that starts counts every running sandbox as used at that moment.

// touch marks sandbox id as used now.
func (m *Manager) touch(id string) {
	m.live(id).touch(time.Now())
}

// forget drops what the Manager knows of a deleted sandbox's activity.
func (m *Manager) forget(id string) {
	if l := m.peek(id); l != nil {
		l.mu.Lock()
		l.used = time.Time{}
		l.mu.Unlock()
	}
}

// idleFor reports how long sandbox id has gone without activity at now, 0
// while a stream or call is open on it.
func (m *Manager) idleFor(id string, now time.Time) time.Duration {
	l := m.live(id)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.streams) > 0 || len(l.calls) > 0 || l.holds > 0 || l.used.IsZero() {
		l.used = now
		return 0
	}
	return now.Sub(l.used)
}

// idleOf is how long sb may go without activity before it sleeps; 0 is
// never.
func (m *Manager) idleOf(sb *store.Sandbox) time.Duration {
	if sb.Idle == "" {
		return m.cfg.Idle
	}
	d, err := time.ParseDuration(sb.Idle)
	if err != nil {
		return 0
	}
	return d
}

// SleepIdle puts to sleep every running sandbox whose idle time has passed
// at now. A sandbox busy with another operation is left for the next round.
func (m *Manager) SleepIdle(ctx context.Context, now time.Time) error {
	sbs, err := m.store.ListSandboxes(ctx, store.Filter{})
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range sbs {
		if sb.State != api.StateRunning || sb.Pool != "" {
			continue // a warm pool's member waits awake
		}
		idle := m.idleOf(sb)
		if idle == 0 || m.idleFor(sb.ID, now) < idle {
			continue
		}
		if err := m.sleepIdle(ctx, sb.ID, idle, now); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) sleepIdle(ctx context.Context, id string, idle time.Duration, now time.Time) error {
	sb, end, err := m.claim(ctx, id, opSleep)
	if err != nil {
		return nil // busy, or gone: not idle
	}
	defer end()
	// Used between the look and the claim: not idle after all.
	if sb.State != api.StateRunning || m.idleFor(id, now) < idle {
		return nil
	}
	m.log.Info("sandbox idle; putting it to sleep", "sandbox", sb.ID, "idle", idle.String())
	return m.sleep(ctx, sb)
}

// Idle puts sandboxes to sleep when their idle time has passed. The daemon
// runs one as a component: Run until ctx ends.
type Idle struct {
	m     *Manager
	every time.Duration
}

// NewIdle makes the component that checks m's sandboxes every so often
// (every; 0 is every 10 s).
func NewIdle(m *Manager, every time.Duration) *Idle {
	if every == 0 {
		every = 10 * time.Second
	}
	return &Idle{m: m, every: every}
}

// Run checks the sandboxes every so often until ctx ends; then it returns
// nil. A sleep in progress is finished first (ctx's end does not cut it
// short: a sandbox half asleep is worse than one awake). A round's failure
// is logged, and the next round tries again.
func (i *Idle) Run(ctx context.Context) error {
	t := time.NewTicker(i.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			if ctx.Err() != nil {
				return nil // both were ready: no round once ctx has ended
			}
			if err := i.m.SleepIdle(context.WithoutCancel(ctx), now); err != nil {
				i.m.log.Error("putting idle sandboxes to sleep", "err", err)
			}
		}
	}
}
