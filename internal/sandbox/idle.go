package sandbox

import (
	"context"
	"time"

	"loam.dev/loam/api"
)

// Activity. A sandbox is active, and its idle time starts again, at each
// call that needs it running (exec, sessions, files, ports, services, a
// wake, and Use: the requests of its URL), and for as long as a stream
// (an exec or attach socket, a port stream or watch, a file watch, a
// session's wait, a service's logs), a files call or an Active (a
// connection through its URL) is open on it.
// Listing and reading sandboxes and checkpoints are not activity. A daemon
// that starts counts every running sandbox as used at that moment. Idle
// sleep (package sleep) asks how long a sandbox has gone idle (IdleCore.IdleFor)
// and has it put to sleep (IdleCore.SleepIfIdle).

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

// IdleCore is the core as idle sleep (package sleep) sees it (it
// implements sleep.Core): how long a sandbox has gone idle, and putting it
// to sleep if it still is. It is a type of its own, not methods of the
// Manager, because only idle sleep asks: the core itself only marks
// activity (touch). Make it with NewIdleCore; the daemon gives it to
// sleep.New.
type IdleCore struct{ m *Manager }

// NewIdleCore is idle sleep's side of m.
func NewIdleCore(m *Manager) *IdleCore { return &IdleCore{m: m} }

// IdleFor is how long sandbox id has gone without activity at now: 0
// while a stream, a call or a hold is open on it, and the first time it is
// asked of a sandbox (its clock starts then). Idle sleep (package sleep)
// asks it.
func (c *IdleCore) IdleFor(id string, now time.Time) time.Duration {
	l := c.m.live(id)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.streams) > 0 || len(l.calls) > 0 || l.holds > 0 || l.used.IsZero() {
		l.used = now
		return 0
	}
	return now.Sub(l.used)
}

// SleepIfIdle puts sandbox id to sleep if it still runs and has still gone
// idle without activity at now, under its sleep operation: idle sleep
// (package sleep) found it idle, and a call may have come since. A sandbox
// busy with another operation, or gone, is not idle: it is left as it is.
func (c *IdleCore) SleepIfIdle(ctx context.Context, id string, idle time.Duration, now time.Time) error {
	sb, end, err := c.m.claim(ctx, id, opSleep)
	if err != nil {
		return nil // busy, or gone: not idle
	}
	defer end()
	// Used between the look and the claim: not idle after all.
	if sb.State != api.StateRunning || c.IdleFor(id, now) < idle {
		return nil
	}
	c.m.log.Info("sandbox idle; putting it to sleep", "sandbox", sb.ID, "idle", idle.String())
	return c.m.sleep(ctx, sb)
}
