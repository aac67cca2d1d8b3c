package disk

import (
	"context"
	"fmt"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// btrfsVolArgsV2 is struct btrfs_ioctl_vol_args_v2 of <linux/btrfs.h>
// (4096 bytes): the argument of BTRFS_IOC_SNAP_CREATE_V2.
type btrfsVolArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64 // size and qgroup_inherit: none
	name    [4040]byte
}

const (
	// iocSnapCreateV2 is BTRFS_IOC_SNAP_CREATE_V2,
	// _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2).
	iocSnapCreateV2 = 1<<30 | unsafe.Sizeof(btrfsVolArgsV2{})<<16 | 0x94<<8 | 23
	// subvolReadOnly is BTRFS_SUBVOL_RDONLY.
	subvolReadOnly = 1 << 1
)

// snapshotSubvolume makes dst a snapshot of subvolume src, read-only if
// asked, with the ioctl `btrfs subvolume snapshot` makes: no process to
// start, which a memory checkpoint would wait for with its sandbox paused.
// dst must not exist. The ioctl returns once the snapshot is committed
// (see SyncSnapshot); it cannot be cancelled, so ctx is not used.
func snapshotSubvolume(_ context.Context, src, dst string, readOnly bool) error {
	name := filepath.Base(dst)
	var args btrfsVolArgsV2
	if len(name) >= len(args.name) || name == "." || name == ".." || name == "/" {
		return fmt.Errorf("snapshotting %s as %s: bad name", src, dst)
	}
	copy(args.name[:], name)
	if readOnly {
		args.flags = subvolReadOnly
	}
	srcFd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("snapshotting %s: %w", src, err)
	}
	defer unix.Close(srcFd)
	dirFd, err := unix.Open(filepath.Dir(dst), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("snapshotting %s as %s: %w", src, dst, err)
	}
	defer unix.Close(dirFd)
	args.fd = int64(srcFd)
	for {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(dirFd), iocSnapCreateV2, uintptr(unsafe.Pointer(&args)))
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return fmt.Errorf("snapshotting %s as %s: %w", src, dst, errno)
		}
		return nil
	}
}
