package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"loam.dev/loam/client"
	"loam.dev/loam/internal/launch"
)

// PrivateConfig configures a private daemon.
type PrivateConfig struct {
	// Loam is the loam binary to run as `loam serve`.
	Loam string
	// Runsc is the runsc binary; "" is runsc in PATH.
	Runsc string
	// Subnet is the daemon's address range; it must not be another
	// daemon's.
	Subnet string
	// TemplateCache is where built templates are shared.
	TemplateCache string
	// DefaultTemplate is the daemon's default template.
	DefaultTemplate string
	// Log receives the daemon's output; nil discards it.
	Log *os.File
}

// Private is a `loam serve` the bench started on a temporary data dir of
// its own; Close stops it and removes all it made.
type Private struct {
	opts    launch.Options
	proc    *launch.Process
	DataDir string
	Client  *client.Client
}

// StartPrivate starts a daemon and waits until it answers.
func StartPrivate(ctx context.Context, cfg PrivateConfig) (*Private, error) {
	dir, err := os.MkdirTemp("", "loam-bench-")
	if err != nil {
		return nil, fmt.Errorf("starting a private daemon: %w", err)
	}
	o := launch.Options{Bin: cfg.Loam, DataDir: dir, Subnet: cfg.Subnet, Runsc: cfg.Runsc,
		TemplateCache: cfg.TemplateCache, DefaultTemplate: cfg.DefaultTemplate,
		// Every rep takes checkpoints of its own sandboxes.
		Args: []string{"--checkpoint-limit", "1000"},
		// A Ctrl-C at the terminal stops the bench, which then deletes
		// the sandboxes through the daemon before stopping it.
		OwnProcessGroup: true}
	if cfg.Log != nil {
		o.Output = io.Writer(cfg.Log)
	}
	p, err := launch.Start(ctx, o)
	if err != nil {
		if errors.Is(err, launch.ErrExited) {
			err = fmt.Errorf("%w (see --daemon-log)", err)
		}
		return nil, errors.Join(fmt.Errorf("starting a private daemon: %w", err), launch.Cleanup(context.Background(), o))
	}
	return &Private{opts: o, proc: p, DataDir: dir, Client: p.Client}, nil
}

// Close deletes the daemon's sandboxes, stops it, and removes what it
// left: runsc containers, network namespaces, mounts, loop devices, its
// firewall and the data dir.
func (p *Private) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return p.proc.Close(ctx, p.opts)
}
