package disk

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// The host walks trees that sandboxes write while it walks them: it copies
// a running sandbox's volume for a snapshot and measures it. A walk by path
// (cp -a, filepath.WalkDir, btrfs filesystem du) resolves each path afresh
// from the top, so a directory that the sandbox swaps for a symlink between
// being listed and being opened is followed out of the volume, into the
// host's files, with root's rights. The walk here never resolves more than
// one name at a time, each relative to a directory it holds open, and never
// follows a symlink, so a swapped entry is refused rather than followed; and
// it checks that what it opened is of the type it listed.

// maxDepth bounds how deep a walk goes. A walk holds a descriptor for each
// level (a copy two), so a tree a sandbox nested deep on purpose could
// otherwise use up the daemon's descriptors. Real root filesystems are a
// few dozen levels deep at most; a deeper tree fails the walk.
const maxDepth = 1024

var (
	// errVanished marks an entry deleted while it was being walked. A live
	// tree changes, so walks skip it, as if it had gone a moment earlier.
	errVanished = errors.New("deleted during the walk")
	// errChanged marks an entry that turned into another type of file
	// between being listed and being opened, such as a directory swapped
	// for a symlink.
	errChanged = errors.New("changed type during the walk")
)

// dir is a directory open for walking.
type dir struct {
	fd    int
	rel   string      // path from the walk's root, for messages; never opened
	st    unix.Stat_t // of fd, once open
	depth int
}

// openRoot opens the directory at p as the root of a walk. p's last
// element must not be a symlink; the ones before it are the caller's to
// trust.
func openRoot(p string) (*dir, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	d := &dir{fd: fd, rel: "."}
	if err := unix.Fstat(fd, &d.st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: p, Err: err}
	}
	return d, nil
}

func (d *dir) close() { unix.Close(d.fd) }

// join returns the path of entry name, for messages.
func (d *dir) join(name string) string { return path.Join(d.rel, name) }

// names lists the directory's entries, sorted (so that walks are
// repeatable), without . and ..
func (d *dir) names() ([]string, error) {
	buf := make([]byte, 16<<10)
	var names []string
	for {
		n, err := unix.Getdents(d.fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "list", Path: d.rel, Err: err}
		}
		if n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
	slices.Sort(names)
	return names, nil
}

// lstat stats entry name itself, not what it may link to.
func (d *dir) lstat(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return st, d.entryErr("stat", name, err)
	}
	return st, nil
}

// openDir opens subdirectory name, which was listed as a directory.
func (d *dir) openDir(name string) (*dir, error) {
	if d.depth >= maxDepth {
		return nil, fmt.Errorf("%s: deeper than %d directories", d.join(name), maxDepth)
	}
	// O_NOFOLLOW refuses a symlink, O_DIRECTORY anything else that is
	// not a directory, before opening it: a device swapped in is never
	// opened.
	fd, err := unix.Openat(d.fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return nil, d.changed(name, unix.S_IFDIR)
	} else if err != nil {
		return nil, d.entryErr("open", name, err)
	}
	sub := &dir{fd: fd, rel: d.join(name), depth: d.depth + 1}
	if err := unix.Fstat(fd, &sub.st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: sub.rel, Err: err}
	}
	if sub.st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: was a directory, is %s: %w", sub.rel, fileType(sub.st.Mode), errChanged)
	}
	return sub, nil
}

// openFile opens regular file name for reading and returns it with its
// stat, failing with errChanged if it is not a regular file any more.
func (d *dir) openFile(name string) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	// O_PATH opens without opening the file itself, so that a device or
	// fifo swapped in for the file is stat'ed but never opened (opening
	// some devices does things), and O_NOFOLLOW gives the link itself.
	pfd, err := unix.Openat(d.fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, st, d.entryErr("open", name, err)
	}
	defer unix.Close(pfd)
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, st, &fs.PathError{Op: "stat", Path: d.join(name), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return -1, st, fmt.Errorf("%s: was a regular file, is %s: %w", d.join(name), fileType(st.Mode), errChanged)
	}
	// Reopening through /proc opens the very inode pfd holds, whatever
	// its name has become meanwhile.
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, st, fmt.Errorf("reopening %s: %w", d.join(name), err)
	}
	return fd, st, nil
}

// readlink reads symlink name.
func (d *dir) readlink(name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(d.fd, name, buf)
		if errors.Is(err, unix.EINVAL) {
			return "", d.changed(name, unix.S_IFLNK)
		} else if err != nil {
			return "", d.entryErr("readlink", name, err)
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// entryErr describes a failed op on entry name: errVanished if it is not
// there any more.
func (d *dir) entryErr(op, name string, err error) error {
	if errors.Is(err, unix.ENOENT) {
		err = errVanished
	}
	return &fs.PathError{Op: op, Path: d.join(name), Err: err}
}

// changed describes entry name, listed as a file of type was, found to be
// another type; errVanished if it is gone.
func (d *dir) changed(name string, was uint32) error {
	st, err := d.lstat(name)
	if err != nil {
		return err
	}
	return fmt.Errorf("%s: was %s, is %s: %w", d.join(name), fileType(was), fileType(st.Mode), errChanged)
}

// fileType names the type of file in mode, for messages.
func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFIFO:
		return "a fifo"
	case unix.S_IFSOCK:
		return "a socket"
	}
	return fmt.Sprintf("of unknown type %#o", mode&unix.S_IFMT)
}

// visitor is what a walk does with the entries it finds.
type visitor interface {
	// entry is called for each entry of d that is not a directory, with
	// its lstat. An error wrapping errVanished skips the entry.
	entry(ctx context.Context, d *dir, name string, st *unix.Stat_t) error
	// enter is called for each subdirectory of d, open as sub, before its
	// entries. It returns the visitor for them, and leave, which is called
	// after them with the error of walking them, and returns the error to
	// go on with; leave may be nil.
	enter(ctx context.Context, d *dir, name string, sub *dir) (child visitor, leave func(error) error, err error)
}

// walkOptions says how a walk treats a tree changing under it.
type walkOptions struct {
	// skipChanged skips an entry that changes type under the walk instead
	// of failing, for walks that only look.
	skipChanged bool
}

// walk visits everything below d, depth first. Entries deleted meanwhile
// are skipped; anything else that fails ends the walk with that error.
func walk(ctx context.Context, d *dir, v visitor, opts walkOptions) error {
	names, err := d.names()
	if err != nil {
		return err
	}
	for _, name := range names {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		err := walkEntry(ctx, d, name, v, opts)
		if err != nil && !errors.Is(err, errVanished) && !(opts.skipChanged && errors.Is(err, errChanged)) {
			return err
		}
	}
	return nil
}

// walkEntry visits entry name of d and, for a directory, what is below it.
func walkEntry(ctx context.Context, d *dir, name string, v visitor, opts walkOptions) error {
	st, err := d.lstat(name)
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return v.entry(ctx, d, name, &st)
	}
	sub, err := d.openDir(name)
	if err != nil {
		return err
	}
	defer sub.close()
	child, leave, err := v.enter(ctx, d, name, sub)
	if err != nil {
		return err
	}
	err = walk(ctx, sub, child, opts)
	if leave != nil {
		err = leave(err)
	}
	return err
}
