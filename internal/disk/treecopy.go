package disk

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"unsafe"

	"golang.org/x/sys/unix"
)

// copyTree copies the tree at src into the existing, empty directory dst,
// and src's own owner, mode, times and extended attributes onto dst. It
// keeps what `cp -a` keeps: contents (reflinked where the filesystem can),
// directories, symlinks (as links, never followed), devices, fifos,
// sockets, hard links, owners, modes with their setuid, setgid and sticky
// bits, times, and extended attributes of files and directories (file
// capabilities among them).
//
// src may be a running sandbox's volume. The copy walks it from directory
// descriptors (see walk), so nothing the sandbox does makes it read
// outside src. An entry deleted during the copy is left out, as if it had
// gone a moment earlier; any other failure, an entry that changed type
// included, fails the copy, and leaves dst for the caller to remove.
func copyTree(ctx context.Context, src, dst string) error {
	root, err := openRoot(src)
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	defer root.close()
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, &fs.PathError{Op: "open", Path: dst, Err: err})
	}
	defer unix.Close(dfd)
	c := &treeCopier{dstRoot: dfd, links: make(map[fileID]string)}
	if err := walk(ctx, root, &copyDir{c: c, fd: dfd, rel: "."}, walkOptions{}); err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	if err := copyAttrs(root.fd, dfd, &root.st); err != nil {
		return fmt.Errorf("copying %s: %w", src, &fs.PathError{Op: "setting attributes of", Path: dst, Err: err})
	}
	return nil
}

// fileID identifies a file on the host, for hard links.
type fileID struct{ dev, ino uint64 }

// treeCopier is the state of one copyTree.
type treeCopier struct {
	dstRoot int               // the copy's root
	links   map[fileID]string // the first copy of each file with several links, from dstRoot
	buf     []byte            // for copies that the kernel cannot do
}

// copyDir copies the entries of one source directory into fd, a
// directory of the copy; it is the walk's visitor.
type copyDir struct {
	c   *treeCopier
	fd  int
	rel string // fd's path from the copy's root
}

// entry copies a file that is not a directory.
func (cd *copyDir) entry(ctx context.Context, d *dir, name string, st *unix.Stat_t) error {
	if st.Nlink > 1 {
		if first, ok := cd.c.links[fileID{st.Dev, st.Ino}]; ok {
			// Resolving first by name is safe: it is a path in the copy,
			// which only this copy writes, through directories it made.
			if err := unix.Linkat(cd.c.dstRoot, first, cd.fd, name, 0); err != nil {
				return &fs.PathError{Op: "linking", Path: cd.join(name), Err: err}
			}
			return nil
		}
	}
	var err error
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		// copyFile records the link itself, from the file it opened.
		return cd.copyFile(ctx, d, name)
	case unix.S_IFLNK:
		err = cd.copySymlink(d, name, st)
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		err = cd.copyNode(name, st)
	default:
		err = fmt.Errorf("%s: cannot copy a file %s", d.join(name), fileType(st.Mode))
	}
	if err == nil && st.Nlink > 1 {
		cd.c.links[fileID{st.Dev, st.Ino}] = cd.join(name)
	}
	return err
}

// enter makes the copy of directory sub; its attributes are set in leave,
// after its entries, which would change its times and may need a mode it
// does not have (no write permission).
func (cd *copyDir) enter(ctx context.Context, d *dir, name string, sub *dir) (visitor, func(error) error, error) {
	rel := cd.join(name)
	if err := unix.Mkdirat(cd.fd, name, 0o700); err != nil {
		return nil, nil, &fs.PathError{Op: "mkdir", Path: rel, Err: err}
	}
	fd, err := unix.Openat(cd.fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, &fs.PathError{Op: "open", Path: rel, Err: err}
	}
	leave := func(err error) error {
		defer unix.Close(fd)
		if err != nil {
			return err
		}
		if err := copyAttrs(sub.fd, fd, &sub.st); err != nil {
			return &fs.PathError{Op: "setting attributes of", Path: rel, Err: err}
		}
		return nil
	}
	return &copyDir{c: cd.c, fd: fd, rel: rel}, leave, nil
}

func (cd *copyDir) join(name string) string { return path.Join(cd.rel, name) }

// copyFile copies regular file name of d: contents, then attributes.
func (cd *copyDir) copyFile(ctx context.Context, d *dir, name string) error {
	in, st, err := d.openFile(name)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	rel := cd.join(name)
	out, err := unix.Openat(cd.fd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &fs.PathError{Op: "create", Path: rel, Err: err}
	}
	err = cd.c.copyData(ctx, out, in, st.Size)
	if err == nil {
		// After the contents: writing clears setuid bits and capabilities.
		err = copyAttrs(in, out, &st)
	}
	if cerr := unix.Close(out); err == nil {
		err = cerr
	}
	if err != nil {
		return &fs.PathError{Op: "copying", Path: rel, Err: err}
	}
	if st.Nlink > 1 {
		cd.c.links[fileID{st.Dev, st.Ino}] = rel
	}
	return nil
}

// copySymlink copies symlink name of d as a link to the same target.
func (cd *copyDir) copySymlink(d *dir, name string, st *unix.Stat_t) error {
	target, err := d.readlink(name)
	if err != nil {
		return err
	}
	if err := unix.Symlinkat(target, cd.fd, name); err != nil {
		return &fs.PathError{Op: "symlink", Path: cd.join(name), Err: err}
	}
	return cd.setAttrsAt(name, st, false)
}

// copyNode copies a device, fifo or socket: a new node of the same type
// and number. Its contents, if any, are not the tree's to copy.
func (cd *copyDir) copyNode(name string, st *unix.Stat_t) error {
	mode := st.Mode&unix.S_IFMT | 0o600
	if err := unix.Mknodat(cd.fd, name, mode, int(st.Rdev)); err != nil {
		return &fs.PathError{Op: "mknod", Path: cd.join(name), Err: err}
	}
	return cd.setAttrsAt(name, st, true)
}

// setAttrsAt gives entry name of the copy, a symlink or node it has just
// made, the owner, mode (not for a symlink, which has none) and times in
// st.
func (cd *copyDir) setAttrsAt(name string, st *unix.Stat_t, mode bool) error {
	err := unix.Fchownat(cd.fd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
	if err == nil && mode {
		// Not a symlink: fchmodat, which would follow one, is safe.
		err = unix.Fchmodat(cd.fd, name, st.Mode&0o7777, 0)
	}
	if err == nil {
		err = unix.UtimesNanoAt(cd.fd, name, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return &fs.PathError{Op: "setting attributes of", Path: cd.join(name), Err: err}
	}
	return nil
}

// copyChunk is how much data is copied between checks of the context.
const copyChunk = 32 << 20

// copyData copies the first size bytes of file src into the new file dst:
// a reflink where the filesystem can make one, or else the data, skipping
// holes so that a sparse file stays sparse (a sandbox's 1 TB sparse file
// must not fill the host's disk).
func (c *treeCopier) copyData(ctx context.Context, dst, src int, size int64) error {
	if size == 0 {
		return nil
	}
	// A failed clone is only a missed shortcut: the copy below reports
	// any error that matters.
	if unix.IoctlFileClone(dst, src) == nil {
		return nil
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(src, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole from off on
		} else if err != nil {
			return fmt.Errorf("finding data: %w", err)
		}
		if data >= size {
			break
		}
		hole, err := unix.Seek(src, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("finding holes: %w", err)
		}
		end := min(hole, size)
		eof, err := c.copyRange(ctx, dst, src, data, end)
		if err != nil {
			return err
		}
		if eof {
			break // the file shrank as we copied it
		}
		off = end
	}
	// Sets the size: holes at the end, or what was cut off meanwhile,
	// read as zeros.
	if err := unix.Ftruncate(dst, size); err != nil {
		return fmt.Errorf("setting size: %w", err)
	}
	return nil
}

// copyRange copies bytes [off, end) of src to the same place in dst, in
// the kernel where it can, and reports whether src ended before end.
func (c *treeCopier) copyRange(ctx context.Context, dst, src int, off, end int64) (eof bool, err error) {
	for off < end {
		if ctx.Err() != nil {
			return false, context.Cause(ctx)
		}
		roff, woff := off, off
		n, err := unix.CopyFileRange(src, &roff, dst, &woff, int(min(end-off, copyChunk)), 0)
		switch {
		case err == nil && n == 0:
			return true, nil
		case err == nil:
			off += int64(n)
			continue
		case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EINVAL):
			// Across filesystems, or one that cannot: copy it ourselves.
			return c.copyRangeByHand(ctx, dst, src, off, end)
		default:
			return false, fmt.Errorf("copying data: %w", err)
		}
	}
	return false, nil
}

// copyRangeByHand is copyRange through a buffer.
func (c *treeCopier) copyRangeByHand(ctx context.Context, dst, src int, off, end int64) (eof bool, err error) {
	if c.buf == nil {
		c.buf = make([]byte, 1<<20)
	}
	for off < end {
		if ctx.Err() != nil {
			return false, context.Cause(ctx)
		}
		n, err := unix.Pread(src, c.buf[:min(end-off, int64(len(c.buf)))], off)
		if err != nil {
			return false, fmt.Errorf("reading: %w", err)
		}
		if n == 0 {
			return true, nil
		}
		for w := 0; w < n; {
			m, err := unix.Pwrite(dst, c.buf[w:n], off+int64(w))
			if err != nil {
				return false, fmt.Errorf("writing: %w", err)
			}
			w += m
		}
		off += int64(n)
	}
	return false, nil
}

// copyAttrs gives open file or directory dst the owner, extended
// attributes, mode and times of src, whose stat is st. The order matters:
// changing the owner clears setuid bits and file capabilities, so the
// attributes and the mode come after it, and the times come last since
// the others change the ctime only.
func copyAttrs(src, dst int, st *unix.Stat_t) error {
	if err := unix.Fchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	if err := unix.Fchmod(dst, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if err := futimens(dst, &[2]unix.Timespec{st.Atim, st.Mtim}); err != nil {
		return fmt.Errorf("setting times: %w", err)
	}
	return nil
}

// futimens sets the access and modification times of open file fd.
// UtimesNanoAt cannot: it takes a path, and utimensat(2) acts on fd itself
// only when given none at all, which is what this passes.
func futimens(fd int, ts *[2]unix.Timespec) error {
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(ts)), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// copyXattrs copies every extended attribute of src to dst. A filesystem
// without them has none to copy; one that vanished meanwhile is skipped.
func copyXattrs(src, dst int) error {
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		val, err := getXattr(src, name)
		if errors.Is(err, unix.ENODATA) {
			continue
		} else if err != nil {
			return fmt.Errorf("reading attribute %s: %w", name, err)
		}
		if err := unix.Fsetxattr(dst, name, val, 0); err != nil {
			return fmt.Errorf("setting attribute %s: %w", name, err)
		}
	}
	return nil
}

// listXattrs returns the names of fd's extended attributes.
func listXattrs(fd int) ([]string, error) {
	for {
		size, err := unix.Flistxattr(fd, nil)
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		} else if err != nil {
			return nil, fmt.Errorf("listing attributes: %w", err)
		}
		if size == 0 {
			return nil, nil
		}
		buf := make([]byte, size)
		n, err := unix.Flistxattr(fd, buf)
		if errors.Is(err, unix.ERANGE) {
			continue // more came meanwhile
		} else if err != nil {
			return nil, fmt.Errorf("listing attributes: %w", err)
		}
		var names []string
		for start, i := 0, 0; i < n; i++ {
			if buf[i] == 0 {
				if i > start {
					names = append(names, string(buf[start:i]))
				}
				start = i + 1
			}
		}
		return names, nil
	}
}

// getXattr returns the value of fd's extended attribute name.
func getXattr(fd int, name string) ([]byte, error) {
	for {
		size, err := unix.Fgetxattr(fd, name, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, size)
		n, err := unix.Fgetxattr(fd, name, buf)
		if errors.Is(err, unix.ERANGE) {
			continue // it grew meanwhile
		} else if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}
