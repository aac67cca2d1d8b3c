package sandbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"loam.dev/loam/api"
)

// A daemon's own caps: how many sandboxes it keeps (Config.MaxSandboxes)
// and how many heavy operations it runs at once (Config.MaxHeavy). Both
// answer api.CodeLimit when reached, so that a burst of requests slows the
// callers down instead of the host.

// DefaultHeavyWait is how long a heavy operation waits for a slot when
// Config.HeavyWait is 0: long enough that a burst of forks (16 at once in
// `loam bench`) queues rather than fails, short enough that a caller hears
// "limit" while it can still do something about it.
const DefaultHeavyWait = 30 * time.Second

// heavyGate bounds the heavy operations in progress: create, fork,
// checkpoint, restore, wake and template builds, each of which starts or
// stops a runsc sandbox or copies its memory or disk. The zero value (no
// slots) lets everything through.
type heavyGate struct {
	slots chan struct{}
	wait  time.Duration
	// waiting counts the operations waiting for a slot (for tests).
	waiting atomic.Int32
}

func newHeavyGate(max int, wait time.Duration) *heavyGate {
	g := &heavyGate{wait: wait}
	if max > 0 {
		g.slots = make(chan struct{}, max)
	}
	return g
}

// enter takes a slot for what, waiting up to the gate's wait for one, and
// returns the func that gives it back; it fails with api.CodeLimit when
// none came free in time.
func (g *heavyGate) enter(ctx context.Context, what string) (func(), error) {
	if g == nil || g.slots == nil {
		return func() {}, nil
	}
	select {
	case g.slots <- struct{}{}:
		return g.leave, nil
	default:
	}
	t := time.NewTimer(g.wait)
	defer t.Stop()
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	select {
	case g.slots <- struct{}{}:
		return g.leave, nil
	case <-t.C:
		return nil, api.Errorf(api.CodeLimit, "%s: the daemon runs %d heavy operations (create, fork, checkpoint, restore, wake, template build) at once, its limit (loam serve --max-heavy), and none ended within %s; try again later",
			what, cap(g.slots), g.wait)
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: waiting for a slot among the daemon's heavy operations: %w", what, context.Cause(ctx))
	}
}

func (g *heavyGate) leave() { <-g.slots }

// sandboxCount keeps the creates in flight, which the store does not show
// yet (or shows in state creating), for Manager.reserveSandbox.
type sandboxCount struct {
	mu      sync.Mutex
	pending int
}

// reserveSandbox makes room for one more sandbox under Config.MaxSandboxes,
// or refuses with api.CodeLimit. The cap counts every sandbox a user has,
// whatever its state, and the creates in flight; warm pools' members are
// left out (the host's cap is for users' sandboxes; a pool's members count
// in their org's pool_members quota, and a pool gives them up when memory
// runs short). Sleeping and stopped sandboxes count because waking one must
// never fail for want of room. The returned func ends the reservation:
// call it once the new sandbox is stored, or the create failed.
func (m *Manager) reserveSandbox(ctx context.Context) (func(), error) {
	if m.cfg.MaxSandboxes <= 0 {
		return func() {}, nil
	}
	m.count.mu.Lock()
	defer m.count.mu.Unlock()
	sbs, err := m.store.ListSandboxes(ctx, m.owner.filter())
	if err != nil {
		return nil, fmt.Errorf("counting sandboxes: %w", err)
	}
	n := m.count.pending
	for _, sb := range sbs {
		// A record in state creating is a create in flight: it is counted
		// in pending already.
		if sb.Pool == "" && sb.State != api.StateCreating {
			n++
		}
	}
	if n >= m.cfg.MaxSandboxes {
		return nil, api.Errorf(api.CodeLimit, "the daemon keeps at most %d sandboxes (loam serve --max-sandboxes), sleeping and stopped ones included; delete one first", m.cfg.MaxSandboxes)
	}
	m.count.pending++
	var once sync.Once
	return func() {
		once.Do(func() {
			m.count.mu.Lock()
			m.count.pending--
			m.count.mu.Unlock()
		})
	}, nil
}
