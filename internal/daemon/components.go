package daemon

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/errgroup"
)

// A component is work the daemon runs in the background for as long as it
// serves: the image service's pulls, the warm pools, the log keeper, idle
// sleep, the HTTP server. Its run returns when ctx ends, having waited for
// everything it started, with nil; an error means the component cannot go
// on (a failure it can retry, it logs and retries, with no error).
//
// A component's failure stops the daemon: it is logged, the other
// components' ctx ends, and Wait returns it, so that `loam serve` exits
// with an error for its supervisor to see and restart it. Carrying on
// without, say, the log keeper would let sandboxes fill the host's disk
// unseen, while a restart costs little: sandboxes keep running and the
// next daemon takes them back.
type component struct {
	name string
	run  func(ctx context.Context) error
}

// errClosing is why the components' ctx ends when the daemon is closed.
var errClosing = errors.New("the daemon is closing")

// runComponents starts cs under one errgroup. Close ends their ctx and
// waits for all of them; the first to fail ends the others' and is what
// Wait returns.
func (d *Daemon) runComponents(ctx context.Context, cs ...component) {
	if d.group == nil {
		// Not ctx's end, which only bounds the start: the components run
		// until Close.
		base, stop := context.WithCancelCause(context.WithoutCancel(ctx))
		d.group, d.running = errgroup.WithContext(base)
		d.stopComponents = stop
	}
	for _, c := range cs {
		d.group.Go(func() error {
			err := c.run(d.running)
			if err != nil {
				d.log.Error("a component failed; the daemon stops", "component", c.name, "err", err)
				return fmt.Errorf("%s: %w", c.name, err)
			}
			d.log.Debug("component ended", "component", c.name)
			return nil
		})
	}
}

// Wait blocks until ctx ends or one of the daemon's components fails, and
// returns that failure (nil when ctx ended, or the daemon was closed).
// Close ends the daemon either way.
func (d *Daemon) Wait(ctx context.Context) error {
	if d.running == nil {
		<-ctx.Done()
		return nil
	}
	select {
	case <-ctx.Done():
		return nil
	case <-d.running.Done():
		if err := context.Cause(d.running); !errors.Is(err, errClosing) {
			return err
		}
		return nil
	}
}

// closeComponents ends the components' ctx and waits for every one of
// them. Their failures are Wait's to report, and already logged.
func (d *Daemon) closeComponents() {
	if d.group == nil {
		return
	}
	d.stopComponents(errClosing)
	_ = d.group.Wait()
}
