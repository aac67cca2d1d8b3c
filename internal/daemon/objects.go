package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"loam.dev/loam/internal/checkpoints"
	"loam.dev/loam/internal/cluster"
	"loam.dev/loam/internal/objects"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/sleep"
	"loam.dev/loam/internal/store/postgres"
)

// Sweeps of the object store (--objects): the first a while after the
// start, then every sweepEvery; blobs no manifest names go once older
// than sweepGrace (an upload whose manifest is still to come is younger).
const (
	sweepFirst = time.Minute
	sweepEvery = 10 * time.Minute
	sweepGrace = time.Hour
)

// staleEvery is how often a node looks for stale copies (dropStale): a
// directory listing and one query, so often.
const staleEvery = 3 * time.Second

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
	ucfg := checkpoints.UploaderConfig{
		DataDir: d.cfg.DataDir, Objects: st, Disks: p.pool, Records: p.store, Cache: cache,
		Node: d.cfg.Node, Runsc: d.runscVersion, CPUFeatures: d.checkpointFeatures,
		HostFeatures: d.hostFeatures,
	}
	if d.cfg.Node != "" {
		// In a cluster, sleep images are stored too: a sleeping sandbox
		// then wakes on any node (sandbox's adopt.go).
		ucfg.Sleeps, ucfg.Volumes, ucfg.Sandboxes = sleep.NewImages(d.cfg.DataDir), p.pool, p.store
	}
	p.uploads = checkpoints.NewUploader(ucfg, d.log)
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

// sleepStore keeps the sleep images in the object store, for a node of a
// cluster with one (nil otherwise: a sleeping sandbox then wakes on its
// node alone).
func (d *Daemon) sleepStore(p *parts) sandbox.SleepStore {
	if d.takeover(p) == nil {
		return nil
	}
	return p.uploads
}

// takeover moves a lost node's sandbox here, to bring it back from a
// stored checkpoint: for a node of a cluster with an object store alone
// (nil otherwise: a sandbox is then brought back nowhere).
func (d *Daemon) takeover(p *parts) sandbox.Takeover {
	pg, ok := p.store.(*postgres.Store)
	if !ok || p.uploads == nil || d.member == nil || d.frontEnd() {
		return nil
	}
	return pg.Nodes()
}

// dropStale destroys, every staleEvery while the node holds its lease,
// what it still runs of sandboxes brought back on another node while it
// was cut off (see sandbox.CheckpointCore.DropStale): a node whose link
// comes back finds them at once, one that restarts in its recovery.
func (d *Daemon) dropStale(ctx context.Context) error {
	core := sandbox.NewCheckpointCore(d.Manager)
	t := time.NewTicker(staleEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
		if !d.member.Live() {
			continue
		}
		if n, err := core.DropStale(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("looking for stale copies of sandboxes", "err", err)
		} else if n > 0 {
			d.log.Warn("destroyed stale copies of sandboxes other nodes own now", "sandboxes", n)
		}
	}
}

// recovery brings back here the sandboxes of lost nodes whose recover
// policy asks for it: for a node of a cluster with an object store alone.
// A node's lease must have been out for two leases first.
func (d *Daemon) recovery(p *parts) *checkpoints.Recovery {
	if d.takeover(p) == nil || d.checkpoints == nil {
		return nil
	}
	lease := d.cfg.Lease
	if lease <= 0 {
		lease = cluster.DefaultLease
	}
	return &checkpoints.Recovery{
		Service: d.checkpoints, Stored: p.uploads, Sleeps: p.uploads, Cluster: d.member, Records: p.store, Audit: p.store,
		After: 2 * lease, Every: lease / 2, Log: d.log,
	}
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
