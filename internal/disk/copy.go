package disk

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"loam.dev/loam/internal/atomicfile"
)

// Copy is a Pool of plain directories, for machines without btrfs. Every
// volume and snapshot is a full copy (see copyTree; a filesystem with
// reflinks such as XFS still shares blocks), which makes creating one take
// time and space in proportion to its size. Templates and snapshots are
// read-only by convention only.
//
// The layout under its directory is templates/, volumes/, snapshots/ and
// tmp/. Copies are made in tmp/ and renamed into place once durable, so an
// entry is complete whenever it is visible. A pool directory belongs to one
// process at a time: opening it clears tmp/.
type Copy struct {
	l     layout
	locks keyedLock // serializes check-then-create per destination name
}

var _ Pool = (*Copy)(nil)

// NewCopy opens the copy pool in dir, creating it if needed.
func NewCopy(dir string) (*Copy, error) {
	dir, err := prepareDir(dir)
	if err != nil {
		return nil, fmt.Errorf("opening copy pool: %w", err)
	}
	if err := checkKind(dir, KindCopy); err != nil {
		return nil, fmt.Errorf("opening copy pool: %w", err)
	}
	c := &Copy{l: layout{root: dir}}
	if err := c.l.create(); err != nil {
		return nil, fmt.Errorf("opening copy pool in %s: %w", dir, err)
	}
	paths, err := c.l.tempEntries()
	if err != nil {
		return nil, fmt.Errorf("opening copy pool in %s: %w", dir, err)
	}
	for _, p := range paths {
		slog.Info("removing unfinished disk work", "path", p)
		if err := removeTree(p); err != nil {
			return nil, fmt.Errorf("opening copy pool in %s: clearing leftovers: %w", dir, err)
		}
	}
	if err := writeKind(dir, KindCopy); err != nil {
		return nil, fmt.Errorf("opening copy pool in %s: %w", dir, err)
	}
	return c, nil
}

// Kind returns KindCopy.
func (c *Copy) Kind() string { return KindCopy }

// HasTemplate reports whether template name exists.
func (c *Copy) HasTemplate(ctx context.Context, name string) (bool, error) {
	if err := validName(name); err != nil {
		return false, err
	}
	ok, err := exists(c.l.templatePath(name))
	if err != nil {
		return false, fmt.Errorf("checking template %s: %w", name, err)
	}
	return ok, nil
}

// ImportTemplate copies src to template name.
func (c *Copy) ImportTemplate(ctx context.Context, name, src string) error {
	if err := validName(name); err != nil {
		return err
	}
	src, err := resolveDir(src)
	if err != nil {
		return fmt.Errorf("importing template %s: %w", name, err)
	}
	if err := c.copy(ctx, src, "t/"+name, c.l.templatePath(name)); err != nil {
		return fmt.Errorf("importing template %s: %w", name, err)
	}
	return nil
}

// CreateVolume makes volume id as a copy of template.
func (c *Copy) CreateVolume(ctx context.Context, id, template string) (string, error) {
	if err := validNames(id, template); err != nil {
		return "", err
	}
	if err := c.copy(ctx, c.l.templatePath(template), "v/"+id, c.l.volumePath(id)); err != nil {
		return "", fmt.Errorf("creating volume %s from template %s: %w", id, template, err)
	}
	return c.l.volumePath(id), nil
}

// VolumePath is where volume id's root is.
func (c *Copy) VolumePath(id string) string { return c.l.volumePath(id) }

// DeleteVolume deletes volume id; its snapshots stay.
func (c *Copy) DeleteVolume(ctx context.Context, id string) error {
	if err := validName(id); err != nil {
		return err
	}
	if err := c.delete(ctx, "v/"+id, c.l.volumePath(id)); err != nil {
		return fmt.Errorf("deleting volume %s: %w", id, err)
	}
	return nil
}

// RenameVolume renames volume from to to.
func (c *Copy) RenameVolume(ctx context.Context, from, to string) error {
	return c.l.renameVolume(ctx, &c.locks, from, to)
}

// Snapshot copies volume id to snapshot snap. Unlike a btrfs snapshot the
// copy is not from one instant: a file written during the copy may be seen
// half-written, as after a crash, and one deleted during it may be missing.
// The volume's sandbox may be running, and may be trying to make the copy
// read outside its volume: copyTree makes sure it cannot, and fails the
// snapshot when a directory turns into something else under it.
func (c *Copy) Snapshot(ctx context.Context, id, snap string) error {
	if err := validNames(id, snap); err != nil {
		return err
	}
	if err := c.copy(ctx, c.l.volumePath(id), "s/"+snap, c.l.snapshotPath(snap)); err != nil {
		return fmt.Errorf("snapshotting volume %s as %s: %w", id, snap, err)
	}
	return nil
}

// SyncSnapshot flushes the filesystem that holds the copy: one syncfs
// rather than an fsync of each of its files.
func (c *Copy) SyncSnapshot(ctx context.Context, snap string) error {
	if err := validName(snap); err != nil {
		return err
	}
	return syncFS(c.l.snapshotPath(snap))
}

// CloneSnapshot makes volume id as a copy of snapshot snap.
func (c *Copy) CloneSnapshot(ctx context.Context, snap, id string) (string, error) {
	if err := validNames(snap, id); err != nil {
		return "", err
	}
	if err := c.copy(ctx, c.l.snapshotPath(snap), "v/"+id, c.l.volumePath(id)); err != nil {
		return "", fmt.Errorf("cloning snapshot %s as volume %s: %w", snap, id, err)
	}
	return c.l.volumePath(id), nil
}

// ImportSnapshot copies src to snapshot snap.
func (c *Copy) ImportSnapshot(ctx context.Context, snap, src string) error {
	if err := validName(snap); err != nil {
		return err
	}
	src, err := resolveDir(src)
	if err != nil {
		return fmt.Errorf("importing snapshot %s: %w", snap, err)
	}
	if err := c.copy(ctx, src, "s/"+snap, c.l.snapshotPath(snap)); err != nil {
		return fmt.Errorf("importing snapshot %s: %w", snap, err)
	}
	return nil
}

// SnapshotPath is where snapshot snap's root is.
func (c *Copy) SnapshotPath(snap string) string { return c.l.snapshotPath(snap) }

// DeleteSnapshot deletes snapshot snap.
func (c *Copy) DeleteSnapshot(ctx context.Context, snap string) error {
	if err := validName(snap); err != nil {
		return err
	}
	if err := c.delete(ctx, "s/"+snap, c.l.snapshotPath(snap)); err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", snap, err)
	}
	return nil
}

// Snapshots lists the snapshots, sorted.
func (c *Copy) Snapshots(ctx context.Context) ([]string, error) {
	return c.l.list(snapshotsDir)
}

// Volumes lists the volumes, sorted.
func (c *Copy) Volumes(ctx context.Context) ([]string, error) {
	return c.l.list(volumesDir)
}

// Templates lists the pool's templates by name.
func (c *Copy) Templates(ctx context.Context) ([]string, error) {
	return c.l.list(templatesDir)
}

// Usage is the space volume id's files take (allocated blocks, each hard
// link counted once). A copy shares nothing, except blocks a reflinking
// filesystem shares, which this overcounts.
func (c *Copy) Usage(ctx context.Context, id string) (int64, error) {
	if err := validName(id); err != nil {
		return 0, err
	}
	root := c.l.volumePath(id)
	if err := mustExist(root); err != nil {
		return 0, fmt.Errorf("measuring volume %s: %w", id, err)
	}
	n, err := blocksUsed(ctx, root)
	if err != nil {
		return 0, fmt.Errorf("measuring volume %s: %w", id, err)
	}
	return n, nil
}

// Close releases nothing; the pool is plain directories.
func (c *Copy) Close() error { return nil }

// Destroy deletes the pool's directories and everything in them. Meant for
// tests.
func (c *Copy) Destroy(ctx context.Context) error {
	for _, sub := range []string{templatesDir, volumesDir, snapshotsDir, tmpDir, kindFile} {
		if err := removeTree(filepath.Join(c.l.root, sub)); err != nil {
			return fmt.Errorf("destroying pool in %s: %w", c.l.root, err)
		}
	}
	return nil
}

// copy makes dst a copy of src with copyTree under the lock for key, failing
// with ErrNotFound when src is missing and ErrExists when dst is there. It
// copies into tmp/, flushes, and renames, so dst appears complete and
// durable or not at all.
func (c *Copy) copy(ctx context.Context, src, key, dst string) (err error) {
	unlock, err := c.locks.lock(ctx, key)
	if err != nil {
		return err
	}
	defer unlock()
	if err := mustExist(src); err != nil {
		return err
	}
	if err := mustNotExist(dst); err != nil {
		return err
	}
	tmp := c.l.tempPath(filepath.Base(filepath.Dir(dst)), filepath.Base(dst))
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if rerr := removeTree(tmp); rerr != nil {
				slog.WarnContext(ctx, "removing failed copy", "path", tmp, "err", rerr)
			}
		}
	}()
	if err := copyTree(ctx, src, tmp); err != nil {
		return err
	}
	if err := syncFS(tmp); err != nil {
		return err
	}
	if err := renameNoReplace(tmp, dst); err != nil {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(dst))
}

// delete removes the tree at path under the lock for key. It first renames
// it into tmp/, so that a crash half-way through leaves garbage in tmp/
// rather than a half-deleted volume that still lists.
func (c *Copy) delete(ctx context.Context, key, path string) error {
	unlock, err := c.locks.lock(ctx, key)
	if err != nil {
		return err
	}
	defer unlock()
	tmp := c.l.tempPath("deleted", filepath.Base(path))
	if err := os.Rename(path, tmp); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	return removeTree(tmp)
}

// DeleteTemplate deletes template name; deleting one that is gone is no
// error. Volumes are copies, so they do not need it.
func (c *Copy) DeleteTemplate(ctx context.Context, name string) error {
	if err := validName(name); err != nil {
		return err
	}
	if err := c.delete(ctx, "t/"+name, c.l.templatePath(name)); err != nil {
		return fmt.Errorf("deleting template %s: %w", name, err)
	}
	return nil
}
