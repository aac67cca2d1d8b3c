package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"loam.dev/loam/internal/checkpoints"
	"loam.dev/loam/internal/objects"
	"loam.dev/loam/internal/sandbox"
)

// Sweeps of the object store (--objects): the first a while after the
// start, then every sweepEvery; blobs no manifest names go once older
// than sweepGrace (an upload whose manifest is still to come is younger).
const (
	sweepFirst = time.Minute
	sweepEvery = 10 * time.Minute
	sweepGrace = time.Hour
)

// openObjects opens the object store (--objects), if any, and makes the
// uploader that keeps this node's checkpoints in it. It runs after the
// disk pool and the store are open, before the sandboxes are taken back.
func (d *Daemon) openObjects(ctx context.Context, p *parts) error {
	if d.cfg.Objects == "" || d.frontEnd() {
		return nil
	}
	st, err := objects.Open(ctx, d.cfg.Objects)
	if err != nil {
		return fmt.Errorf("--objects: %w", err)
	}
	d.closers = append(d.closers, st.Close)
	cache, err := objects.NewCache(filepath.Join(d.cfg.DataDir, "objects-cache"), d.cfg.CacheSize)
	if err != nil {
		return err
	}
	p.uploads = checkpoints.NewUploader(checkpoints.UploaderConfig{
		DataDir: d.cfg.DataDir, Objects: st, Disks: p.pool, Records: p.store, Cache: cache,
		Node: d.cfg.Node, Runsc: d.runscVersion, CPUFeatures: d.checkpointFeatures,
		HostFeatures: d.hostFeatures,
	}, d.log)
	d.log.Info("object store", "objects", st.String())
	return nil
}

// runObjects runs the uploads and the sweeps, once the sandboxes (and
// their checkpoints) are taken back: what was not stored before is
// queued first.
func (d *Daemon) runObjects(p *parts) []component {
	u := p.uploads
	if u == nil {
		return nil
	}
	return []component{
		{"checkpoint uploads", func(ctx context.Context) error {
			u.Resume(ctx)
			u.Run(ctx)
			return nil
		}},
		{"object store sweep", func(ctx context.Context) error {
			wait := sweepFirst
			for {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					return nil
				}
				if err := u.Sweep(ctx, sweepGrace); err != nil && ctx.Err() == nil {
					d.log.Warn("sweeping the object store", "err", err)
				}
				wait = sweepEvery
			}
		}},
	}
}

// stored is what the core tells of checkpoints that go: the uploader, or
// nil (a nil *Uploader must not become a non-nil interface).
func (d *Daemon) stored(p *parts) sandbox.Stored {
	if p.uploads == nil {
		return nil
	}
	return p.uploads
}

// checkpointFeatures are the CPU features a checkpoint's memory image
// was taken with, for its manifest: those pinned (d.cpuPin) at the time
// of its upload, else all the host's.
func (d *Daemon) checkpointFeatures() []string {
	if d.cpuPin != nil {
		if f := d.cpuPin(); len(f) > 0 {
			return f
		}
	}
	return d.hostFeatures
}
