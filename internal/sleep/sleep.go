// Package sleep is the sleep capability's own part: the memory images of
// sleeping sandboxes on disk (Images), and idle sleep, the component that
// puts a sandbox to sleep once it has gone its idle time without activity
// (Sleeper.Run).
//
// A sleeping sandbox has no container: its memory is a memory image (a
// memory checkpoint that is not listed), its disk its volume as it was.
// The core (package sandbox) keeps the state machine: it runs a sleep and
// a wake as operations on the sandbox, wakes a sandbox that sleeps at the
// first call that needs it running (one wake however many callers), and
// keeps each sandbox's activity on its live object. It asks this package
// for the images (sandbox.SleepImages); this package asks the core how
// long a sandbox has been idle and to put it to sleep (Core).
package sleep

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Core is what idle sleep needs of the sandbox core (sandbox.IdleCore has it).
type Core interface {
	// IdleFor is how long sandbox id has gone without activity at now: 0
	// while a call, a stream or a hold is open on it, and the first time
	// it is asked of a sandbox (its clock starts then).
	IdleFor(id string, now time.Time) time.Duration
	// SleepIfIdle puts sandbox id to sleep, under its sleep operation, if
	// it still runs and has still gone idle without activity at now. A
	// sandbox busy with another operation, gone, or used meanwhile is left
	// as it is (nil): the next round looks again.
	SleepIfIdle(ctx context.Context, id string, idle time.Duration, now time.Time) error
}

// Sandboxes lists the sandboxes' records (the store).
type Sandboxes interface {
	ListSandboxes(ctx context.Context, f store.Filter) ([]*store.Sandbox, error)
}

// Config is the sleep capability's configuration.
type Config struct {
	// DataDir is the daemon's data dir, where the sleep images are kept
	// (see Images).
	DataDir string
	// Idle is how long a sandbox that says no idle of its own may go
	// without activity before it sleeps; 0 is never.
	Idle time.Duration
	// Every is how often Run looks for idle sandboxes; 0 is every 10 s.
	Every time.Duration
	// Node is the daemon's node in a cluster ("" on one machine): idle
	// sleep puts its own sandboxes to sleep, never another node's.
	Node string
}

// Sleeper is the daemon's sleep capability: the sleep images (Images, what
// the core asks for, given as the core's sandbox.Config.Sleep) and idle
// sleep (Run, a component of the daemon's).
type Sleeper struct {
	*Images
	core      Core
	sandboxes Sandboxes
	cfg       Config
	log       *slog.Logger
}

// New makes the sleep capability of core, whose sandboxes' records
// sandboxes lists.
func New(core Core, sandboxes Sandboxes, cfg Config, log *slog.Logger) *Sleeper {
	if cfg.Every == 0 {
		cfg.Every = 10 * time.Second
	}
	return &Sleeper{Images: NewImages(cfg.DataDir), core: core, sandboxes: sandboxes, cfg: cfg, log: log}
}

// idleOf is how long sb may go without activity before it sleeps; 0 is
// never. An idle the record cannot hold (the API checks it) is never.
func (s *Sleeper) idleOf(sb *store.Sandbox) time.Duration {
	if sb.Idle == "" {
		return s.cfg.Idle
	}
	d, err := time.ParseDuration(sb.Idle)
	if err != nil {
		return 0
	}
	return d
}

// SleepIdle puts to sleep every running sandbox whose idle time has passed
// at now. A sandbox busy with another operation is left for the next round;
// a warm pool's member waits awake.
func (s *Sleeper) SleepIdle(ctx context.Context, now time.Time) error {
	sbs, err := s.sandboxes.ListSandboxes(ctx, store.Filter{Node: s.cfg.Node})
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range sbs {
		if sb.State != api.StateRunning || sb.Pool != "" {
			continue
		}
		idle := s.idleOf(sb)
		if idle == 0 || s.core.IdleFor(sb.ID, now) < idle {
			continue
		}
		if err := s.core.SleepIfIdle(ctx, sb.ID, idle, now); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Run looks for idle sandboxes every so often (Config.Every) until ctx
// ends; then it returns nil. A sleep in progress is finished first (ctx's
// end does not cut it short: a sandbox half asleep is worse than one
// awake). A round's failure is logged, and the next round tries again.
func (s *Sleeper) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			if ctx.Err() != nil {
				return nil // both were ready: no round once ctx has ended
			}
			if err := s.SleepIdle(context.WithoutCancel(ctx), now); err != nil {
				s.log.Error("putting idle sandboxes to sleep", "err", err)
			}
		}
	}
}
