package disk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"loam.dev/loam/internal/atomicfile"
)

// Btrfs is a Pool on btrfs: templates, volumes and snapshots are
// subvolumes, so a new volume or snapshot is a copy-on-write snapshot that
// takes milliseconds whatever the tree's size, and a snapshot of a volume
// is atomic without pausing its writers.
//
// On disk, if the directory given to NewBtrfs is on btrfs, the pool's
// layout (templates/, volumes/, snapshots/, tmp/) is in that directory.
// Otherwise dir/disk.img is a sparse file holding a btrfs filesystem,
// attached to a loop device and mounted at dir/mnt, and the layout is in
// dir/mnt. The mount outlives the process on purpose, since running
// sandboxes use it: Close leaves it, Unmount and Destroy end it.
//
// A pool directory belongs to one process at a time: opening it clears
// tmp/, where work in progress lives.
type Btrfs struct {
	dir string // as given to NewBtrfs, symlinks resolved
	img string // the loop image; "" when dir is on btrfs itself
	mnt string // where img is mounted; "" when dir is on btrfs itself

	// trees are subvolumes and snapshots (see the treeOps below). Its
	// locks matter more here: given an existing directory as destination,
	// `btrfs subvolume snapshot` puts the snapshot inside it instead of
	// failing.
	trees

	// sys is the filesystem's directory in /sys/fs/btrfs, where quota
	// counters are read; quota is its quota mode, "" when quotas are off
	// (see initQuotas).
	sys   string
	quota string
	// switched is true when opening the pool switched its quotas from
	// simple to classic, which dropped every limit.
	switched bool
}

var (
	_ Pool    = (*Btrfs)(nil)
	_ Limiter = (*Btrfs)(nil)
)

// imageName and mountName are the loop image and its mount point in a
// pool directory that is not on btrfs.
const (
	imageName = "disk.img"
	mountName = "mnt"
)

// NewBtrfs opens the btrfs pool in dir, creating it if needed. When dir is
// not on btrfs, it creates dir/disk.img (sizeBytes, sparse; DefaultSize if
// sizeBytes <= 0) and formats it once, and mounts it at dir/mnt unless it
// is already mounted there (after a daemon restart). On error nothing stays
// mounted that was not mounted before.
//
// On its own image the pool turns on classic btrfs qgroups, so that
// volumes can be limited (see Limiter); a filesystem it shares with others
// keeps the quota mode it has (see initQuotas).
func NewBtrfs(ctx context.Context, dir string, sizeBytes int64) (*Btrfs, error) {
	return newBtrfs(ctx, dir, sizeBytes, quotaClassic)
}

// newBtrfs is NewBtrfs turning on quotas of mode (quotaSimple,
// quotaClassic, or "" for none) on the pool's own image. Benchmarks compare
// the modes.
func newBtrfs(ctx context.Context, dir string, sizeBytes int64, mode string) (_ *Btrfs, err error) {
	for _, tool := range []string{"btrfs", "mkfs.btrfs", "losetup", "mount", "umount"} {
		if _, err := exec.LookPath(lookTool(tool)); err != nil {
			return nil, fmt.Errorf("opening btrfs pool in %s: %w", dir, err)
		}
	}
	if sizeBytes <= 0 {
		sizeBytes = DefaultSize
	}
	dir, err = prepareDir(dir)
	if err != nil {
		return nil, fmt.Errorf("opening btrfs pool: %w", err)
	}
	if err := checkKind(dir, KindBtrfs); err != nil {
		return nil, fmt.Errorf("opening btrfs pool: %w", err)
	}
	onBtrfs, err := isBtrfs(dir)
	if err != nil {
		return nil, fmt.Errorf("opening btrfs pool: %w", err)
	}
	img := filepath.Join(dir, imageName)
	hasImage, err := exists(img)
	if err != nil {
		return nil, fmt.Errorf("opening btrfs pool: %w", err)
	}
	b := &Btrfs{dir: dir, trees: trees{l: layout{root: dir}}}
	b.ops = b
	// An image made before stays in use even if dir has since moved onto
	// btrfs: the volumes are in it.
	if !onBtrfs || hasImage {
		b.img = img
		b.mnt = filepath.Join(dir, mountName)
		b.l.root = b.mnt
		var mounted bool
		if mounted, err = b.mount(ctx, sizeBytes); err != nil {
			return nil, fmt.Errorf("opening btrfs pool in %s: %w", dir, err)
		}
		if mounted {
			defer func() {
				if err != nil {
					if uerr := b.Unmount(context.WithoutCancel(ctx)); uerr != nil {
						slog.WarnContext(ctx, "unmounting pool after failed open", "dir", dir, "err", uerr)
					}
				}
			}()
		}
	}
	if err := b.l.create(); err != nil {
		return nil, fmt.Errorf("opening btrfs pool in %s: %w", dir, err)
	}
	if err := b.clearTemp(ctx); err != nil {
		return nil, fmt.Errorf("opening btrfs pool in %s: %w", dir, err)
	}
	if err := b.initQuotas(ctx, mode); err != nil {
		return nil, fmt.Errorf("opening btrfs pool in %s: %w", dir, err)
	}
	if err := writeKind(dir, KindBtrfs); err != nil {
		return nil, fmt.Errorf("opening btrfs pool in %s: %w", dir, err)
	}
	return b, nil
}

// mount makes sure b.img exists and is mounted at b.mnt, and reports
// whether it mounted it (false: it already was).
func (b *Btrfs) mount(ctx context.Context, sizeBytes int64) (mounted bool, err error) {
	m, ok, err := mountAt(b.mnt)
	if err != nil {
		return false, err
	}
	if ok {
		devs, err := loopDevices(b.img)
		if err != nil {
			return false, err
		}
		if m.fsType != "btrfs" || !slices.Contains(devs, m.source) {
			return false, fmt.Errorf("%s has %s (%s) mounted, not %s", b.mnt, m.source, m.fsType, b.img)
		}
		return false, nil
	}

	created := false
	if ok, err := exists(b.img); err != nil {
		return false, err
	} else if !ok {
		if err := makeImage(ctx, b.img, sizeBytes); err != nil {
			return false, err
		}
		created = true
	}
	defer func() {
		// A fresh, never-mounted image holds nothing; leaving it would
		// make the next Open insist on btrfs.
		if err != nil && created {
			_ = os.Remove(b.img)
		}
	}()
	if err := os.MkdirAll(b.mnt, 0o755); err != nil {
		return false, fmt.Errorf("creating mount point: %w", err)
	}
	// An explicit loop device rather than `mount -o loop`, for direct I/O:
	// without it every block is cached twice, once for btrfs and once for
	// the image file. --nooverlap reuses a device left attached by a crash
	// between losetup and mount.
	out, err := run(ctx, "losetup", "--find", "--show", "--nooverlap", "--direct-io=on", b.img)
	if err != nil {
		return false, fmt.Errorf("attaching %s: %w", b.img, err)
	}
	dev := strings.TrimSpace(out)
	// noatime: reading a file in a volume must not rewrite metadata that
	// the volume shares with its template and snapshots.
	if _, err := run(ctx, "mount", "-t", "btrfs", "-o", "noatime", dev, b.mnt); err != nil {
		if _, derr := run(context.WithoutCancel(ctx), "losetup", "-d", dev); derr != nil {
			slog.WarnContext(ctx, "detaching loop device after failed mount", "dev", dev, "err", derr)
		}
		return false, fmt.Errorf("mounting %s: %w", b.img, err)
	}
	return true, nil
}

// makeImage creates a sparse file of size bytes at path holding a fresh
// btrfs filesystem. It formats a temporary file and renames it, so path
// never holds a half-formatted image.
func makeImage(ctx context.Context, path string, size int64) error {
	tmp := path + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("creating disk image: %w", err)
	}
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("creating disk image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		_, err = run(ctx, "mkfs.btrfs", "-q", "-L", "loam", tmp)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("creating disk image %s: %w", path, err)
	}
	return atomicfile.SyncDir(filepath.Dir(path))
}

// clearTemp deletes what a crashed process left in tmp/.
func (b *Btrfs) clearTemp(ctx context.Context) error {
	paths, err := b.l.tempEntries()
	if err != nil {
		return err
	}
	for _, p := range paths {
		slog.InfoContext(ctx, "removing unfinished disk work", "path", p)
		if err := deleteSubvolume(ctx, p); err != nil {
			return fmt.Errorf("clearing leftovers: %w", err)
		}
	}
	return nil
}

// clone makes dst a snapshot of src (see snapshot): read-only for a
// snapshot of a volume, writable for a volume. A snapshot is atomic:
// writers see no pause and it holds their writes up to one instant.
func (b *Btrfs) clone(ctx context.Context, src, key, dst string, readOnly bool) error {
	return b.snapshot(ctx, src, key, dst, readOnly)
}

// importTree copies src into a new subvolume and publishes it as the
// read-only snapshot dst, so that it appears whole or not at all, and
// durable before the caller records it (an image's template, a built
// one): one syncfs commits the copy and the snapshot.
func (b *Btrfs) importTree(ctx context.Context, src, key, dst, what, name string) error {
	unlock, err := b.locks.lock(ctx, key)
	if err != nil {
		return err
	}
	defer unlock()
	if err := mustNotExist(dst); err != nil {
		return err
	}
	tmp := b.l.tempPath(what, name)
	if _, err := run(ctx, "btrfs", "subvolume", "create", tmp); err != nil {
		return err
	}
	defer func() {
		if err := deleteSubvolume(context.WithoutCancel(ctx), tmp); err != nil {
			slog.WarnContext(ctx, "deleting temporary subvolume", "path", tmp, "err", err)
		}
	}()
	if err := copyTree(ctx, src, tmp); err != nil {
		return err
	}
	if err := snapshotSubvolume(ctx, tmp, dst, true); err != nil {
		return err
	}
	return syncFS(dst)
}

// usage is the size of the data extents only the volume at root refers
// to, as `btrfs filesystem du` counts them (see exclusiveBytes). Metadata
// is not counted, and data written but not yet flushed (up to the 30 s
// commit interval) is not either. It looks at every file's extents, so it
// costs time in proportion to the number of files.
//
// It walks the volume itself rather than running `btrfs filesystem du`,
// which opens each file by its path: a sandbox swapping one of its
// directories for a symlink made it walk, and open as root, files outside
// the volume.
func (b *Btrfs) usage(ctx context.Context, root string) (int64, error) {
	return exclusiveBytes(ctx, root)
}

// Kind returns KindBtrfs.
func (b *Btrfs) Kind() string { return KindBtrfs }

// SyncSnapshot does nothing: a btrfs snapshot is durable when Snapshot
// returns. The kernel makes a snapshot in a transaction commit of its own
// (create_snapshot in fs/btrfs/ioctl.c queues it as pending and calls
// btrfs_commit_transaction, which writes the new roots and the super
// block with a cache flush), after it has written out the source's
// delayed allocations. A syncfs after it would only flush what every
// other sandbox wrote since, for nothing: TestPowerLoss checks that an
// acknowledged checkpoint's disk survives a cut without it.
func (b *Btrfs) SyncSnapshot(ctx context.Context, snap string) error {
	return validName(snap)
}

// Close releases nothing: the filesystem stays mounted for the sandboxes
// that run on it. Use Unmount or Destroy to take it down.
func (b *Btrfs) Close() error { return nil }

// Unmount unmounts the pool's loop image and detaches its loop device. The
// image and its contents stay; NewBtrfs mounts it again. It fails while
// files in the pool are in use, and does nothing for a pool in a directory
// that was on btrfs already.
func (b *Btrfs) Unmount(ctx context.Context) error {
	return b.unmount(ctx, false)
}

// unmount is Unmount, and when lazy, detaches a busy mount from the tree
// anyway; the kernel finishes the unmount, and frees the loop device, when
// the last file in it is closed.
func (b *Btrfs) unmount(ctx context.Context, lazy bool) error {
	if b.img == "" {
		return nil
	}
	busy := false
	if _, ok, err := mountAt(b.mnt); err != nil {
		return fmt.Errorf("unmounting %s: %w", b.mnt, err)
	} else if ok {
		if _, err := run(ctx, "umount", b.mnt); err != nil {
			busy = true
			if !lazy {
				return fmt.Errorf("unmounting %s: %w", b.mnt, err)
			}
			if _, err := run(ctx, "umount", "--lazy", b.mnt); err != nil {
				return fmt.Errorf("unmounting %s: %w", b.mnt, err)
			}
			slog.WarnContext(ctx, "pool busy, unmounted lazily", "dir", b.mnt, "err", err)
		}
	}
	devs, err := loopDevices(b.img)
	if err != nil {
		return fmt.Errorf("unmounting %s: %w", b.mnt, err)
	}
	// Detaching a device still in use (after a lazy unmount) only marks it
	// to detach itself once released, and succeeds.
	for _, dev := range devs {
		if _, err := run(ctx, "losetup", "-d", dev); err != nil {
			return fmt.Errorf("detaching %s: %w", dev, err)
		}
	}
	if busy || len(devs) == 0 {
		return nil // a busy device frees itself when its last file closes
	}
	return waitDetached(ctx, b.img)
}

// detachWait bounds waitDetached: a device held open for a moment is freed
// in milliseconds; longer means something keeps it, and Unmount says so.
const detachWait = 5 * time.Second

// waitDetached waits until no loop device is backed by img. udev probes a
// device on the change event of an unmount, and while its probe holds the
// device open, LOOP_CLR_FD only marks the device to detach itself once
// closed (lo_release in drivers/block/loop.c), so losetup -d returns
// before the device is free. The kernel sends no event for that which a
// program can wait on, hence the poll.
func waitDetached(ctx context.Context, img string) error {
	ctx, cancel := context.WithTimeout(ctx, detachWait)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		devs, err := loopDevices(img)
		if err != nil {
			return fmt.Errorf("detaching loop devices of %s: %w", img, err)
		}
		if len(devs) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("loop devices %q of %s still attached: %w", devs, img, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// Destroy deletes the pool and everything in it: it unmounts (lazily if
// busy) and deletes the loop image, or, for a pool in a directory on btrfs,
// deletes every subvolume. Meant for tests, which must not leave mounts
// behind even when they fail with files open.
func (b *Btrfs) Destroy(ctx context.Context) error {
	if b.img != "" {
		if err := b.unmount(ctx, true); err != nil {
			return fmt.Errorf("destroying pool in %s: %w", b.dir, err)
		}
		for _, p := range []string{b.img, b.mnt, filepath.Join(b.dir, kindFile)} {
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("destroying pool in %s: %w", b.dir, err)
			}
		}
		return nil
	}
	for _, sub := range []string{templatesDir, volumesDir, snapshotsDir, tmpDir} {
		entries, err := os.ReadDir(filepath.Join(b.l.root, sub))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("destroying pool in %s: %w", b.dir, err)
		}
		for _, e := range entries {
			if err := deleteSubvolume(ctx, filepath.Join(b.l.root, sub, e.Name())); err != nil {
				return fmt.Errorf("destroying pool in %s: %w", b.dir, err)
			}
		}
		if err := os.Remove(filepath.Join(b.l.root, sub)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("destroying pool in %s: %w", b.dir, err)
		}
	}
	if err := os.Remove(filepath.Join(b.dir, kindFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("destroying pool in %s: %w", b.dir, err)
	}
	return nil
}

// snapshot makes dst a snapshot of src under the lock for key, failing
// with ErrNotFound when src is missing and ErrExists when dst is there.
func (b *Btrfs) snapshot(ctx context.Context, src, key, dst string, readOnly bool) error {
	unlock, err := b.locks.lock(ctx, key)
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
	return snapshotSubvolume(ctx, src, dst, readOnly)
}

// remove deletes the subvolume at path under the lock for key.
func (b *Btrfs) remove(ctx context.Context, key, path string) error {
	unlock, err := b.locks.lock(ctx, key)
	if err != nil {
		return err
	}
	defer unlock()
	return deleteSubvolume(ctx, path)
}

// btrfsFirstFreeObjectID is the inode number of every subvolume's root
// directory, which tells a subvolume from a plain directory.
const btrfsFirstFreeObjectID = 256

// deleteSubvolume deletes the subvolume at path; a path that is gone is no
// error, and a plain directory is removed as one. Read-only subvolumes need
// no special care: root may delete them.
func deleteSubvolume(ctx context.Context, path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || !fi.IsDir() || st.Ino != btrfsFirstFreeObjectID {
		return removeTree(path)
	}
	_, err = run(ctx, "btrfs", "subvolume", "delete", path)
	return err
}

// mustExist fails with ErrNotFound when path does not exist.
func mustExist(path string) error {
	ok, err := exists(path)
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("%s: %w", filepath.Base(path), ErrNotFound)
	}
	return nil
}

// mustNotExist fails with ErrExists when path exists.
func mustNotExist(path string) error {
	ok, err := exists(path)
	switch {
	case err != nil:
		return err
	case ok:
		return fmt.Errorf("%s: %w", filepath.Base(path), ErrExists)
	}
	return nil
}

// resolveDir fails unless path is a directory, and returns it with
// symlinks resolved. It is for a path the caller trusts, such as a
// template's source, which may be a link to the tree (as `cp -a` followed
// one); copyTree follows no link, not even at the top.
func resolveDir(path string) (string, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory", path)
	}
	return real, nil
}
