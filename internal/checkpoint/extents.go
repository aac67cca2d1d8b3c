package checkpoint

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// A checkpoint's disk snapshot and its template are, on btrfs, two
// subvolumes of one file system whose unchanged files share their data
// extents: a file that is the same blocks in both holds the same bytes
// (a write to a shared extent goes elsewhere: copy on write), so a diff
// need not read either. sameExtents answers that from FIEMAP and the
// file system's UUID; anything it cannot be sure of (another file
// system, an inline, delayed or unknown extent, an error) is "no", and
// the bytes are compared.

// FIEMAP and BTRFS_IOC_FS_INFO, from linux/fiemap.h and linux/btrfs.h,
// which golang.org/x/sys/unix does not have (internal/disk's usage has
// its own FIEMAP, for another purpose).
const (
	fsIocFiemap = 0xC020660B // _IOWR('f', 11, struct fiemap)

	extentLast     = 0x1
	extentUnsure   = 0x2 | 0x4 | 0x200 | 0x400 // unknown, delalloc, data inline, data tail
	extentsPerCall = 64

	// btrfsIocFsInfo is _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args).
	btrfsIocFsInfo = 2<<30 | 1024<<16 | 0x94<<8 | 31
)

type fiemap struct {
	start, length uint64
	flags         uint32
	mappedExtents uint32
	extentCount   uint32
	_             uint32
	extents       [extentsPerCall]struct {
		logical, physical, length uint64
		_                         [2]uint64
		flags                     uint32
		_                         [3]uint32
	}
}

// btrfsFsInfo is struct btrfs_ioctl_fs_info_args (1024 bytes).
type btrfsFsInfo struct {
	maxID, numDevices uint64
	fsid              [16]byte
	_                 [1024 - 32]byte
}

// btrfsID is the UUID of the btrfs file system open file fd is on, or
// false when it is on none.
func btrfsID(fd int) ([16]byte, bool) {
	var st unix.Statfs_t
	if unix.Fstatfs(fd, &st) != nil || st.Type != unix.BTRFS_SUPER_MAGIC {
		return [16]byte{}, false
	}
	var info btrfsFsInfo
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), btrfsIocFsInfo, uintptr(unsafe.Pointer(&info))); errno != 0 {
		return [16]byte{}, false
	}
	return info.fsid, true
}

// sameExtents reports whether open files a and b, of one size, are the
// same data extents of one btrfs file system.
func sameExtents(a, b int) bool {
	ida, ok := btrfsID(a)
	if !ok {
		return false
	}
	if idb, ok := btrfsID(b); !ok || ida != idb {
		return false
	}
	var ma, mb fiemap
	for {
		if !mapExtents(a, &ma) || !mapExtents(b, &mb) {
			return false
		}
		if ma.mappedExtents != mb.mappedExtents {
			return false
		}
		if ma.mappedExtents == 0 {
			return true // no data (or only holes) past start, in both
		}
		for i := range ma.mappedExtents {
			x, y := ma.extents[i], mb.extents[i]
			if x.logical != y.logical || x.physical != y.physical || x.length != y.length ||
				x.flags != y.flags || x.flags&extentUnsure != 0 {
				return false
			}
		}
		last := ma.extents[ma.mappedExtents-1]
		if last.flags&extentLast != 0 {
			return true
		}
		ma.start = last.logical + last.length
		mb.start = ma.start
	}
}

// mapExtents maps the extents of open file fd from m.start on.
func mapExtents(fd int, m *fiemap) bool {
	*m = fiemap{start: m.start, length: ^uint64(0), extentCount: extentsPerCall}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFiemap, uintptr(unsafe.Pointer(m)))
	return errno == 0
}
