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
// may write. Its terms: a volume's use is what its writer has written since
// the volume was made (by CreateVolume or CloneSnapshot); data it shares
// with the template or snapshot it was made from is not counted, since that
// is charged where it was first written. A write that would take a volume
// beyond its limit fails with EDQUOT, and only that volume's writers see it.
type Limiter interface {
	// SetLimit bounds volume id's use to bytes; 0 removes the bound.
	SetLimit(ctx context.Context, id string, bytes int64) error
	// DiskUse is volume id's use and limit in bytes (limit 0: none). It
	// reads counters the filesystem keeps, so it costs microseconds
	// whatever the volume holds; the counters lag writes by up to the
	// filesystem's commit interval (30 s).
	DiskUse(ctx context.Context, id string) (used, limit int64, err error)
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

	btrfsQuotaCtlEnable            = 1
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

// enableQuotas turns on quotas of the filesystem holding path: simple ones
// when simple is true, else classic qgroups. Turning them on when they are
// on already is no error.
func enableQuotas(path string, simple bool) error {
	args := btrfsQuotaCtlArgs{cmd: btrfsQuotaCtlEnable}
	if simple {
		args.cmd = btrfsQuotaCtlEnableSimpleQuota
	}
	if err := ioctlPath(path, btrfsIocQuotaCtl, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("enabling quotas on %s: %w", path, err)
	}
	return nil
}

// setQgroupLimit bounds the level-0 qgroup of the subvolume at path to
// bytes (0: no bound).
func setQgroupLimit(path string, bytes int64) error {
	id, err := subvolumeID(path)
	if err != nil {
		return err
	}
	// Under simple quotas referenced and exclusive are the same; a limit
	// on referenced also holds under classic qgroups, where it counts the
	// data the volume shares with its template too.
	args := btrfsQgroupLimitArgs{qgroupID: id, flags: btrfsQgroupLimitMaxRfer, maxRfer: uint64(bytes)}
	if bytes <= 0 {
		args.maxRfer = ^uint64(0)
	}
	if err := ioctlPath(path, btrfsIocQgroupLimit, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("limiting qgroup 0/%d: %w", id, err)
	}
	return nil
}

// qgroupUse reads the use and limit of the level-0 qgroup of the
// subvolume at path from sys, the filesystem's sysfs directory.
func qgroupUse(sys, path string) (used, limit int64, err error) {
	id, err := subvolumeID(path)
	if err != nil {
		return 0, 0, err
	}
	dir := filepath.Join(sys, "qgroups", "0_"+strconv.FormatUint(id, 10))
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
	if used, err = read("referenced"); err != nil {
		return 0, 0, fmt.Errorf("reading qgroup 0/%d: %w", id, err)
	}
	if limit, err = read("max_referenced"); err != nil {
		return 0, 0, fmt.Errorf("reading qgroup 0/%d: %w", id, err)
	}
	return used, limit, nil
}

// initQuotas finds the filesystem's quota mode, first turning on quotas of
// mode on the pool's own image when none are on. A filesystem the pool
// shares (dir on btrfs already) is left as it is: simple quotas set an
// incompatible feature flag (kernels before 6.7 can no longer mount it),
// and classic ones slow down every snapshot deletion, which is not the
// pool's choice to make for someone else's filesystem. A kernel that
// cannot turn them on leaves the pool without limits, logged.
func (b *Btrfs) initQuotas(ctx context.Context, mode string) error {
	sys, err := fsSysfs(b.l.root)
	if err != nil {
		return err
	}
	b.sys = sys
	if b.quota, err = quotaMode(sys); err != nil {
		return err
	}
	if b.quota != "" || mode == "" || b.img == "" {
		if b.quota == "" && mode != "" {
			slog.WarnContext(ctx, "btrfs quotas are off on a filesystem the pool shares; disk limits are not enforced", "dir", b.l.root)
		}
		return nil
	}
	if err := enableQuotas(b.l.root, mode == quotaSimple); err != nil {
		slog.WarnContext(ctx, "cannot turn on btrfs quotas (simple quotas need Linux 6.7); disk limits are not enforced", "dir", b.l.root, "err", err)
		return nil
	}
	b.quota, err = quotaMode(sys)
	return err
}

// Quotas is the filesystem's quota mode: "squota" (simple quotas, what
// the pool turns on), "qgroup" (classic), or "" when limits are not
// enforced.
func (b *Btrfs) Quotas() string { return b.quota }

// SetLimit bounds what volume id may write to bytes (0: no bound). Under
// simple quotas it counts only what the volume writes, and also what it
// deletes that a snapshot of it still holds, until that snapshot is
// deleted; under classic qgroups it counts what the volume refers to,
// its template's data included.
func (b *Btrfs) SetLimit(ctx context.Context, id string, bytes int64) error {
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
	if err := setQgroupLimit(path, bytes); err != nil {
		return fmt.Errorf("limiting volume %s: %w", id, err)
	}
	return nil
}

// DiskUse is volume id's use and limit, from the qgroup counters.
func (b *Btrfs) DiskUse(ctx context.Context, id string) (used, limit int64, err error) {
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
	used, limit, err = qgroupUse(b.sys, path)
	if err != nil {
		return 0, 0, fmt.Errorf("measuring volume %s: %w", id, err)
	}
	return used, limit, nil
}
