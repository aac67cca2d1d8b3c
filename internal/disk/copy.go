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
	trees // its trees are plain directories (see the treeOps below)
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
	c := &Copy{trees: trees{l: layout{root: dir}}}
	c.ops = c
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

// clone copies src to dst (see copy). A snapshot so made is not from one
// instant: a file written during the copy may be seen half-written, as
// after a crash, and one deleted during it may be missing. The volume's
// sandbox may be running, and may be trying to make the copy read outside
// its volume: copyTree makes sure it cannot, and fails the snapshot when a
// directory turns into something else under it. Read-only is by
// convention only.
func (c *Copy) clone(ctx context.Context, src, key, dst string, readOnly bool) error {
	return c.copy(ctx, src, key, dst)
}

// importTree copies src to dst (see copy).
func (c *Copy) importTree(ctx context.Context, src, key, dst, what, name string) error {
	return c.copy(ctx, src, key, dst)
}

// usage is the space the files under root take (allocated blocks, each
// hard link counted once). A copy shares nothing, except blocks a
// reflinking filesystem shares, which this overcounts.
func (c *Copy) usage(ctx context.Context, root string) (int64, error) {
	return blocksUsed(ctx, root)
}

// Kind returns KindCopy.
func (c *Copy) Kind() string { return KindCopy }

// SyncSnapshot flushes the filesystem that holds the copy: one syncfs
// rather than an fsync of each of its files.
func (c *Copy) SyncSnapshot(ctx context.Context, snap string) error {
	if err := validName(snap); err != nil {
		return err
	}
	return syncFS(c.l.snapshotPath(snap))
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

// remove removes the tree at path under the lock for key. It first renames
// it into tmp/, so that a crash half-way through leaves garbage in tmp/
// rather than a half-deleted volume that still lists.
func (c *Copy) remove(ctx context.Context, key, path string) error {
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
