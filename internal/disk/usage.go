package disk

import (
	"context"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Measuring a volume walks it while its sandbox runs, so it uses walk, and
// skips what changes under it rather than failing: a sandbox must not be
// able to make its own size unmeasurable by renaming its files.

// blocksUsed is the space the files of the tree at root take: allocated
// blocks, each file with several links counted once.
func blocksUsed(ctx context.Context, root string) (int64, error) {
	d, err := openRoot(root)
	if err != nil {
		return 0, err
	}
	defer d.close()
	b := &blockCounter{seen: make(map[fileID]bool)}
	b.add(&d.st)
	if err := walk(ctx, d, b, walkOptions{skipChanged: true}); err != nil {
		return 0, err
	}
	return b.total, nil
}

// blockCounter is blocksUsed's visitor. It only stats, opening nothing but
// directories.
type blockCounter struct {
	seen  map[fileID]bool
	total int64
}

func (b *blockCounter) entry(ctx context.Context, d *dir, name string, st *unix.Stat_t) error {
	b.add(st)
	return nil
}

func (b *blockCounter) enter(ctx context.Context, d *dir, name string, sub *dir) (visitor, func(error) error, error) {
	b.add(&sub.st)
	return b, nil, nil
}

func (b *blockCounter) add(st *unix.Stat_t) {
	if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		id := fileID{st.Dev, st.Ino}
		if b.seen[id] {
			return
		}
		b.seen[id] = true
	}
	b.total += st.Blocks * 512 // st_blocks is in 512-byte units whatever the block size
}

// exclusiveBytes is the size of the data extents of the regular files
// under root that no other file shares, as `btrfs filesystem du` counts
// them (its "Exclusive" column): from FIEMAP, leaving out inline extents,
// which take no data space, and extents not yet allocated, whose size is
// not known. Each file with several links counts once.
func exclusiveBytes(ctx context.Context, root string) (int64, error) {
	d, err := openRoot(root)
	if err != nil {
		return 0, err
	}
	defer d.close()
	e := &extentCounter{seen: make(map[fileID]bool), req: new(fiemapRequest)}
	if err := walk(ctx, d, e, walkOptions{skipChanged: true}); err != nil {
		return 0, err
	}
	return e.total, nil
}

// extentCounter is exclusiveBytes's visitor.
type extentCounter struct {
	seen  map[fileID]bool
	total int64
	req   *fiemapRequest // reused: it is 7 kB
}

func (e *extentCounter) entry(ctx context.Context, d *dir, name string, st *unix.Stat_t) error {
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	if st.Nlink > 1 {
		id := fileID{st.Dev, st.Ino}
		if e.seen[id] {
			return nil
		}
		e.seen[id] = true
	}
	fd, _, err := d.openFile(name)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	n, err := e.req.exclusive(fd)
	if err != nil {
		return fmt.Errorf("%s: %w", d.join(name), err)
	}
	e.total += n
	return nil
}

func (e *extentCounter) enter(ctx context.Context, d *dir, name string, sub *dir) (visitor, func(error) error, error) {
	return e, nil, nil
}

// FIEMAP, from linux/fiemap.h, which golang.org/x/sys/unix does not have.
const (
	fsIocFiemap = 0xC020660B // _IOWR('f', 11, struct fiemap)

	fiemapExtentLast       = 0x1
	fiemapExtentUnknown    = 0x2
	fiemapExtentDelalloc   = 0x4
	fiemapExtentDataInline = 0x200
	fiemapExtentShared     = 0x2000

	fiemapBatch = 128 // extents per call
)

// fiemapRequest is struct fiemap followed by room for fiemapBatch extents.
type fiemapRequest struct {
	start, length uint64
	flags         uint32
	mappedExtents uint32
	extentCount   uint32
	_             uint32
	extents       [fiemapBatch]fiemapExtent
}

// fiemapExtent is struct fiemap_extent.
type fiemapExtent struct {
	logical, physical, length uint64
	_                         [2]uint64
	flags                     uint32
	_                         [3]uint32
}

// exclusive adds up the extents of open file fd that are not shared and
// take known data space.
func (r *fiemapRequest) exclusive(fd int) (int64, error) {
	const skip = fiemapExtentUnknown | fiemapExtentDelalloc | fiemapExtentDataInline
	var total int64
	r.start = 0
	for {
		r.length = ^uint64(0)
		r.flags, r.mappedExtents, r.extentCount = 0, 0, fiemapBatch
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFiemap, uintptr(unsafe.Pointer(r))); errno != 0 {
			return 0, fmt.Errorf("mapping extents: %w", errno)
		}
		if r.mappedExtents == 0 {
			return total, nil
		}
		for _, x := range r.extents[:r.mappedExtents] {
			if x.flags&(skip|fiemapExtentShared) == 0 {
				total += int64(x.length)
			}
		}
		last := r.extents[r.mappedExtents-1]
		if last.flags&fiemapExtentLast != 0 {
			return total, nil
		}
		r.start = last.logical + last.length
	}
}
