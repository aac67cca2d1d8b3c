package disk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Limiter is the optional ability of a Pool to bound how much each volume
// may hold. Its terms: a volume's use is what it holds (every extent it
// refers to, however it came by it: written, or brought by the snapshot it
// was cloned from) beyond the size of its base, the template its lineage
// started from, whose data is the same for every volume made from it. So a
// volume cloned from a snapshot (a restore, a fork) starts with the use of
// the volume the snapshot was taken of, and data that a snapshot still
// holds after the volume deleted it is the snapshot's, not the volume's.
// A write that would take a volume beyond its limit fails with EDQUOT, and
// only that volume's writers see it.
type Limiter interface {
	// SetLimit bounds volume id's use beyond base to bytes; 0 removes the
	// bound.
	SetLimit(ctx context.Context, id string, bytes int64, base Base) error
	// DiskUse is volume id's use beyond base, and its limit, in bytes
	// (limit 0: none). It reads counters the filesystem keeps, so it costs
	// microseconds whatever the volume holds; the counters lag writes by
	// up to the filesystem's commit interval (30 s).
	DiskUse(ctx context.Context, id string, base Base) (used, limit int64, err error)
	// QuotaDir is the directory of volume id's live quota counters, whose
	// files referenced and max_referenced say what the volume refers to
	// (its base included) and its limit on that, in bytes (all ones: no
	// limit), as the kernel keeps them: /sys/fs/btrfs/FSID/qgroups/0_SUBVOLID.
	// The runtime hands them to the sandbox for its statfs. It is "" when
	// the filesystem keeps no quotas.
	QuotaDir(ctx context.Context, id string) (string, error)
}

// Base is the tree a volume's lineage was first made from, whose size a
// Limiter does not count against the volume: a template (Template), or a
// snapshot kept as one (Snapshot). The zero Base counts everything.
type Base struct {
	Template string
	Snapshot string
}

// ErrNoQuotas is returned by a Limiter's methods when the filesystem it is
// on keeps no quotas (see Btrfs.Quotas).
var ErrNoQuotas = errors.New("disk quotas are not enabled")

// btrfs ioctls and structures, from linux/btrfs.h, which golang.org/x/sys/unix
// does not have.
const (
	btrfsIocInoLookup   = 0xD0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
	btrfsIocFsInfo      = 0x8400941F // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)
	btrfsIocQuotaCtl    = 0xC0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	btrfsIocQgroupLimit = 0x8030942B // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	btrfsIocRescanWait  = 0x0000942E // _IO(0x94, 46)

	btrfsQuotaCtlEnable            = 1
	btrfsQuotaCtlDisable           = 2
	btrfsQuotaCtlEnableSimpleQuota = 4

	btrfsQgroupLimitMaxRfer = 1 << 0
	btrfsQgroupLimitMaxExcl = 1 << 1
)

// btrfsInoLookupArgs is struct btrfs_ioctl_ino_lookup_args.
type btrfsInoLookupArgs struct {
	treeID   uint64
	objectID uint64
	name     [4080]byte
}

// btrfsFsInfoArgs is struct btrfs_ioctl_fs_info_args, the fields we read.
type btrfsFsInfoArgs struct {
	maxID      uint64
	numDevices uint64
	fsid       [16]byte
	_          [1024 - 32]byte
}

// btrfsQuotaCtlArgs is struct btrfs_ioctl_quota_ctl_args.
type btrfsQuotaCtlArgs struct {
	cmd, status uint64
}

// btrfsQgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args.
type btrfsQgroupLimitArgs struct {
	qgroupID uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

func init() {
	// The kernel checks the size encoded in each request number.
	if unsafe.Sizeof(btrfsInoLookupArgs{}) != 4096 || unsafe.Sizeof(btrfsFsInfoArgs{}) != 1024 ||
		unsafe.Sizeof(btrfsQuotaCtlArgs{}) != 16 || unsafe.Sizeof(btrfsQgroupLimitArgs{}) != 48 {
		panic("disk: btrfs ioctl structures have the wrong size")
	}
}

// ioctlPath opens path read-only and runs ioctl req on it with arg.
func ioctlPath(path string, req uintptr, arg unsafe.Pointer) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

// subvolumeID is the id of the subvolume whose root is path, which is also
// the id of its level-0 qgroup.
func subvolumeID(path string) (uint64, error) {
	args := btrfsInoLookupArgs{objectID: btrfsFirstFreeObjectID}
	if err := ioctlPath(path, btrfsIocInoLookup, unsafe.Pointer(&args)); err != nil {
		return 0, fmt.Errorf("finding subvolume id of %s: %w", path, err)
	}
	return args.treeID, nil
}

// fsSysfs is the directory in /sys/fs/btrfs of the filesystem holding path.
func fsSysfs(path string) (string, error) {
	var args btrfsFsInfoArgs
	if err := ioctlPath(path, btrfsIocFsInfo, unsafe.Pointer(&args)); err != nil {
		return "", fmt.Errorf("reading filesystem info of %s: %w", path, err)
	}
	u := args.fsid
	return fmt.Sprintf("/sys/fs/btrfs/%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), nil
}

// Quota modes, as /sys/fs/btrfs/FSID/qgroups/mode names them.
const (
	quotaSimple  = "squota" // simple quotas: extents charged to the subvolume that wrote them
	quotaClassic = "qgroup" // full accounting of shared and exclusive extents
)

// quotaMode is the quota mode of the filesystem whose sysfs directory is
// sys, or "" when quotas are off.
func quotaMode(sys string) (string, error) {
	data, err := os.ReadFile(filepath.Join(sys, "qgroups", "mode"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", fmt.Errorf("reading quota mode: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// quotaCtl runs quota control command cmd on the filesystem holding path.
func quotaCtl(path string, cmd uint64) error {
	args := btrfsQuotaCtlArgs{cmd: cmd}
	return ioctlPath(path, btrfsIocQuotaCtl, unsafe.Pointer(&args))
}

// enableQuotas turns on quotas of mode on the filesystem holding path and,
// for classic qgroups, waits for the scan that counts what the filesystem
// holds already. Turning them on when they are on already is no error.
func enableQuotas(path, mode string) error {
	cmd := uint64(btrfsQuotaCtlEnable)
	if mode == quotaSimple {
		cmd = btrfsQuotaCtlEnableSimpleQuota
	}
	if err := quotaCtl(path, cmd); err != nil {
		return fmt.Errorf("enabling quotas on %s: %w", path, err)
	}
	if mode == quotaClassic {
		if err := ioctlPath(path, btrfsIocRescanWait, nil); err != nil {
			return fmt.Errorf("counting what %s holds: %w", path, err)
		}
	}
	return nil
}

// noLimit is what the kernel reads as no limit.
const noLimit = ^uint64(0)

// setQgroupLimit bounds what the level-0 qgroup of the subvolume at path
// refers to at maxRfer bytes (0: no bound).
func setQgroupLimit(path string, maxRfer int64) error {
	id, err := subvolumeID(path)
	if err != nil {
		return err
	}
	args := btrfsQgroupLimitArgs{qgroupID: id, flags: btrfsQgroupLimitMaxRfer, maxRfer: noLimit}
	if maxRfer > 0 {
		args.maxRfer = uint64(maxRfer)
	}
	if err := ioctlPath(path, btrfsIocQgroupLimit, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("limiting qgroup 0/%d: %w", id, err)
	}
	return nil
}

// qgroupDir is the directory in sys, the filesystem's sysfs directory, of
// the level-0 qgroup of the subvolume at path.
func qgroupDir(sys, path string) (string, uint64, error) {
	id, err := subvolumeID(path)
	if err != nil {
		return "", 0, err
	}
	return filepath.Join(sys, "qgroups", "0_"+strconv.FormatUint(id, 10)), id, nil
}

// qgroupUse reads what the level-0 qgroup of the subvolume at path refers
// to and its limit on that (0: none) from sys, the filesystem's sysfs
// directory.
func qgroupUse(sys, path string) (rfer, maxRfer int64, err error) {
	dir, id, err := qgroupDir(sys, path)
	if err != nil {
		return 0, 0, err
	}
	read := func(name string) (int64, error) {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0, err
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			return 0, err
		}
		if n > 1<<62 { // "no limit" is all ones
			return 0, nil
		}
		return int64(n), nil
	}
	if rfer, err = read("referenced"); err != nil {
		return 0, 0, fmt.Errorf("reading qgroup 0/%d: %w", id, err)
	}
	if maxRfer, err = read("max_referenced"); err != nil {
		return 0, 0, fmt.Errorf("reading qgroup 0/%d: %w", id, err)
	}
	return rfer, maxRfer, nil
}

// initQuotas finds the filesystem's quota mode, first turning on quotas of
// mode on the pool's own image when none are on. A filesystem the pool
// shares (dir on btrfs already) is left as it is: simple quotas set an
// incompatible feature flag (kernels before 6.7 can no longer mount it),
// and classic ones slow down every snapshot, which is not the pool's
// choice to make for someone else's filesystem. A kernel that cannot turn
// them on leaves the pool without limits, logged.
//
// The pool's own image with simple quotas (made by a loam before classic
// qgroups) is switched to classic ones: simple quotas charge data to the
// volume that wrote it, so a restored or forked volume held its data for
// free. The switch drops every limit; the caller sets them again.
func (b *Btrfs) initQuotas(ctx context.Context, mode string) error {
	sys, err := fsSysfs(b.l.root)
	if err != nil {
		return err
	}
	b.sys = sys
	if b.quota, err = quotaMode(sys); err != nil {
		return err
	}
	own := b.img != ""
	switch {
	case mode == "" || (b.quota != "" && !(own && b.quota == quotaSimple && mode == quotaClassic)):
		// Nothing to turn on, or on already as wanted (or not ours).
	case !own:
		switch b.quota {
		case "":
			slog.WarnContext(ctx, "btrfs quotas are off on a filesystem the pool shares; disk limits are not enforced", "dir", b.l.root)
		case quotaSimple:
			slog.WarnContext(ctx, "btrfs simple quotas on a filesystem the pool shares: a restored or forked disk is not charged for the data its checkpoint holds", "dir", b.l.root)
		}
	default:
		if b.quota != "" {
			slog.InfoContext(ctx, "switching the disk pool from simple quotas to classic qgroups", "dir", b.l.root)
			if err := quotaCtl(b.l.root, btrfsQuotaCtlDisable); err != nil {
				return fmt.Errorf("turning off simple quotas on %s: %w", b.l.root, err)
			}
			b.switched = true
		}
		if err := enableQuotas(b.l.root, mode); err != nil {
			slog.WarnContext(ctx, "cannot turn on btrfs quotas; disk limits are not enforced", "dir", b.l.root, "mode", mode, "err", err)
		}
		if b.quota, err = quotaMode(sys); err != nil {
			return err
		}
	}
	if own && b.quota == quotaClassic {
		// Deleting a subvolume whose tree is 3 levels high or more would
		// otherwise mark every count stale (the kernel's default skips
		// tracing such trees) until a rescan: count it, however long.
		if err := os.WriteFile(filepath.Join(sys, "qgroups", "drop_subtree_threshold"), []byte("8"), 0); err != nil {
			slog.WarnContext(ctx, "cannot make btrfs count deleted large subvolumes", "dir", b.l.root, "err", err)
		}
	}
	return nil
}

// Quotas is the filesystem's quota mode: "qgroup" (classic qgroups, what
// the pool turns on), "squota" (simple quotas), or "" when limits are not
// enforced.
func (b *Btrfs) Quotas() string { return b.quota }

// SwitchedQuotas reports whether opening the pool switched it from simple
// quotas to classic qgroups, which drops every volume's limit: the caller
// must set them again.
func (b *Btrfs) SwitchedQuotas() bool { return b.switched }

// baseBytes is the size of base, what a volume made from it refers to and
// is not charged for. Under simple quotas a volume is charged only for what
// it writes, so there is nothing to leave out.
func (b *Btrfs) baseBytes(base Base) (int64, error) {
	var path string
	switch {
	case b.quota != quotaClassic:
		return 0, nil
	case base.Template != "":
		if err := validName(base.Template); err != nil {
			return 0, err
		}
		path = b.l.templatePath(base.Template)
	case base.Snapshot != "":
		if err := validName(base.Snapshot); err != nil {
			return 0, err
		}
		path = b.l.snapshotPath(base.Snapshot)
	default:
		return 0, nil
	}
	if err := mustExist(path); err != nil {
		return 0, fmt.Errorf("sizing base: %w", err)
	}
	rfer, _, err := qgroupUse(b.sys, path)
	if err != nil {
		return 0, fmt.Errorf("sizing base: %w", err)
	}
	return rfer, nil
}

// SetLimit bounds what volume id holds beyond base to bytes (0: no bound).
// Under classic qgroups (the pool's own) it limits what the volume refers
// to, so it counts data a clone brought from its snapshot as well as what
// it wrote; under simple quotas (a filesystem the pool shares) it counts
// only what the volume writes, and also what it deletes that a snapshot of
// it still holds, until that snapshot is deleted.
func (b *Btrfs) SetLimit(ctx context.Context, id string, bytes int64, base Base) error {
	if err := validName(id); err != nil {
		return err
	}
	if b.quota == "" {
		return fmt.Errorf("limiting volume %s: %w", id, ErrNoQuotas)
	}
	path := b.l.volumePath(id)
	if err := mustExist(path); err != nil {
		return fmt.Errorf("limiting volume %s: %w", id, err)
	}
	maxRfer := int64(0)
	if bytes > 0 {
		bb, err := b.baseBytes(base)
		if err != nil {
			return fmt.Errorf("limiting volume %s: %w", id, err)
		}
		maxRfer = bytes + bb
	}
	if err := setQgroupLimit(path, maxRfer); err != nil {
		return fmt.Errorf("limiting volume %s: %w", id, err)
	}
	return nil
}

// DiskUse is volume id's use beyond base and its limit, from the qgroup
// counters.
func (b *Btrfs) DiskUse(ctx context.Context, id string, base Base) (used, limit int64, err error) {
	if err := validName(id); err != nil {
		return 0, 0, err
	}
	if b.quota == "" {
		return 0, 0, fmt.Errorf("measuring volume %s: %w", id, ErrNoQuotas)
	}
	path := b.l.volumePath(id)
	if err := mustExist(path); err != nil {
		return 0, 0, fmt.Errorf("measuring volume %s: %w", id, err)
	}
	rfer, maxRfer, err := qgroupUse(b.sys, path)
	if err != nil {
		return 0, 0, fmt.Errorf("measuring volume %s: %w", id, err)
	}
	bb, err := b.baseBytes(base)
	if err != nil {
		return 0, 0, fmt.Errorf("measuring volume %s: %w", id, err)
	}
	if maxRfer > 0 {
		limit = max(maxRfer-bb, 1)
	}
	return max(rfer-bb, 0), limit, nil
}

// QuotaDir is the sysfs directory of volume id's level-0 qgroup, "" when
// quotas are off. Under classic qgroups its referenced counts the volume's
// base too, and so does its limit (see SetLimit), so a sandbox shown them
// sees a disk holding its template.
func (b *Btrfs) QuotaDir(ctx context.Context, id string) (string, error) {
	if err := validName(id); err != nil {
		return "", err
	}
	if b.quota == "" {
		return "", nil
	}
	path := b.l.volumePath(id)
	if err := mustExist(path); err != nil {
		return "", fmt.Errorf("finding the quota of volume %s: %w", id, err)
	}
	dir, _, err := qgroupDir(b.sys, path)
	if err != nil {
		return "", fmt.Errorf("finding the quota of volume %s: %w", id, err)
	}
	return dir, nil
}
