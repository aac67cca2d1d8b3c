// Package archive unpacks tar streams into a directory tree, the one
// extractor of loam: uploads into a sandbox (the agent), copies out of one
// (loam cp) and image layers (the image unpacker) all go through Extract.
//
// A tar is hostile input and so is the tree it lands in: a sandbox's own
// users may plant symlinks there. Every operation therefore goes through a
// Dir, which resolves a path one component at a time, each opened with
// O_PATH|O_NOFOLLOW and its type checked with fstat, and never follows a
// symlink on its way. It does not rely on openat(O_DIRECTORY|O_NOFOLLOW)
// refusing a symlink: Linux does (ENOTDIR), gVisor follows the link.
package archive

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Dir is a directory held open, beneath which every call resolves its name
// (a clean, local, slash-separated path) without following any symlink: a
// symlink on the way fails with ELOOP, any other file with ENOTDIR. The
// last component is never followed either.
//
// A Dir is for one goroutine: the agent runs it on a thread whose
// credentials are the request's user.
type Dir struct {
	fd   int
	name string
	// The directory the last call resolved, kept open for the next one:
	// a tar lists a directory's entries together.
	lastName string
	lastFd   int
}

// OpenDir opens the directory at p (following symlinks in p itself: it is
// the caller's choice of directory, not a tar's).
func OpenDir(p string) (*Dir, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", p, err)
	}
	return &Dir{fd: fd, name: p, lastFd: -1}, nil
}

// Name is the path the Dir was opened with, for messages.
func (d *Dir) Name() string { return d.name }

// Close releases the directory.
func (d *Dir) Close() error {
	d.forget()
	return unix.Close(d.fd)
}

func (d *Dir) forget() {
	if d.lastFd >= 0 {
		unix.Close(d.lastFd)
	}
	d.lastName, d.lastFd = "", -1
}

// stepDir opens the directory name in dirfd as an O_PATH descriptor,
// refusing a symlink (ELOOP) and anything else that is not a directory
// (ENOTDIR) by its fstat, not by open flags.
func stepDir(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return fd, nil
	case unix.S_IFLNK:
		unix.Close(fd)
		return -1, unix.ELOOP
	default:
		unix.Close(fd)
		return -1, unix.ENOTDIR
	}
}

// OpenSubdir opens the directory name in the directory open at dirfd for
// reading, refusing a symlink (ELOOP) or anything else (ENOTDIR) without
// opening it, on any kernel. The caller closes the descriptor.
func OpenSubdir(dirfd int, name string) (int, error) {
	p, err := stepDir(dirfd, name)
	if err != nil {
		return -1, err
	}
	defer unix.Close(p)
	return reopen(p)
}

// reopen turns an O_PATH descriptor of a directory into one that reads and
// takes fchmod, fchown and fsync. "." cannot be a symlink.
func reopen(pathfd int) (int, error) {
	return unix.Openat(pathfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// check refuses a name that is not clean and local.
func check(name string) error {
	if name == "" || name == "." || strings.HasPrefix(name, "/") || path.Clean(name) != name ||
		name == ".." || strings.HasPrefix(name, "../") {
		return fmt.Errorf("%q is not a clean path beneath the directory: %w", name, unix.EINVAL)
	}
	return nil
}

// walk opens the directory dir (clean and local, or ".") beneath d, making
// missing directories with mode 0755 when create is true. The descriptor
// is d's: valid until the next call, never closed by the caller.
func (d *Dir) walk(dir string, create bool) (int, error) {
	if dir == "." {
		return d.fd, nil
	}
	if dir == d.lastName {
		return d.lastFd, nil
	}
	fd, rest := d.fd, dir
	if d.lastFd >= 0 && strings.HasPrefix(dir, d.lastName+"/") {
		// Beneath the last one (a tar goes down a tree in order).
		next, err := unix.Dup(d.lastFd)
		if err != nil {
			return -1, err
		}
		fd, rest = next, dir[len(d.lastName)+1:]
	}
	d.forget()
	for _, part := range strings.Split(rest, "/") {
		if create {
			if err := unix.Mkdirat(fd, part, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				if fd != d.fd {
					unix.Close(fd)
				}
				return -1, err
			}
		}
		next, err := stepDir(fd, part)
		if fd != d.fd {
			unix.Close(fd)
		}
		if err != nil {
			return -1, err
		}
		fd = next
	}
	d.lastName, d.lastFd = dir, fd
	return fd, nil
}

// parent opens the directory that holds name and returns it with name's
// last component (see walk).
func (d *Dir) parent(name string, create bool) (int, string, error) {
	if err := check(name); err != nil {
		return -1, "", err
	}
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	fd, err := d.walk(dir, create)
	return fd, base, err
}

// Lstat describes name without following it.
func (d *Dir) Lstat(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	if name == "." {
		return st, unix.Fstat(d.fd, &st)
	}
	fd, base, err := d.parent(name, false)
	if err != nil {
		return st, err
	}
	return st, unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
}

// Readlink reads the symlink name.
func (d *Dir) Readlink(name string) (string, error) {
	fd, base, err := d.parent(name, false)
	if err != nil {
		return "", err
	}
	for n := 256; ; n *= 2 {
		buf := make([]byte, n)
		k, err := unix.Readlinkat(fd, base, buf)
		if err != nil {
			return "", err
		}
		if k < n {
			return string(buf[:k]), nil
		}
	}
}

// OpenDirAt opens the directory name beneath d for reading, refusing a
// symlink or a file there. The caller closes the descriptor.
func (d *Dir) OpenDirAt(name string) (int, error) {
	if name == "." {
		return reopen(d.fd)
	}
	fd, base, err := d.parent(name, false)
	if err != nil {
		return -1, err
	}
	return OpenSubdir(fd, base)
}

// Mkdir makes the directory name, and its missing parents, with mode perm
// (umask applies); a directory already there is kept, anything else there
// fails with ENOTDIR or ELOOP (a symlink).
func (d *Dir) Mkdir(name string, perm uint32) error {
	fd, base, err := d.parent(name, true)
	if err != nil {
		return err
	}
	if err := unix.Mkdirat(fd, base, perm); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	p, err := stepDir(fd, base)
	if err != nil {
		return err
	}
	return unix.Close(p)
}

// Chmod sets the mode of the file or directory name (permission, set-id
// and sticky bits), refusing a symlink there.
func (d *Dir) Chmod(name string, mode fs.FileMode) error {
	fd, err := d.openNoFollow(name)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, UnixPerm(mode))
}

// UnixPerm is the permission bits of m as chmod takes them: the
// permission, set-id and sticky bits.
func UnixPerm(m fs.FileMode) uint32 {
	p := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= unix.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		p |= unix.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		p |= unix.S_ISVTX
	}
	return p
}

// openNoFollow opens the file or directory name for reading; a symlink
// fails with ELOOP, and anything else (a device, a fifo) with EINVAL
// before it is opened.
func (d *Dir) openNoFollow(name string) (int, error) {
	if name == "." {
		return reopen(d.fd)
	}
	pfd, base, err := d.parent(name, false)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return -1, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR, unix.S_IFREG:
	case unix.S_IFLNK:
		return -1, unix.ELOOP
	default:
		return -1, unix.EINVAL
	}
	// Without O_DIRECTORY, which makes gVisor follow a final symlink
	// despite O_NOFOLLOW.
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var now unix.Stat_t
	if err := unix.Fstat(fd, &now); err != nil || now.Ino != st.Ino || now.Dev != st.Dev {
		unix.Close(fd)
		return -1, fmt.Errorf("%s changed while it was opened: %w", name, unix.EAGAIN)
	}
	return fd, nil
}

// ReadFile reads the regular file name (not through a symlink).
func (d *Dir) ReadFile(name string) ([]byte, error) {
	fd, err := d.openNoFollow(name)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	return io.ReadAll(f)
}

// WriteFile writes data to name, a new file with mode perm; an existing
// name fails (EEXIST), a symlink there is not followed.
func (d *Dir) WriteFile(name string, data []byte, perm fs.FileMode) error {
	pfd, base, err := d.parent(name, false)
	if err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// CreateFile makes name a new regular file with mode perm (umask
// applies) and opens it for writing; an existing name fails (EEXIST), a
// symlink there is not followed.
func (d *Dir) CreateFile(name string, perm uint32) (*os.File, error) {
	pfd, base, err := d.parent(name, false)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// Mknod makes the device or fifo name.
func (d *Dir) Mknod(name string, mode uint32, dev int) error {
	pfd, base, err := d.parent(name, false)
	if err != nil {
		return err
	}
	return unix.Mknodat(pfd, base, mode, dev)
}

// Lchown gives name, not what it may link to, an owner.
func (d *Dir) Lchown(name string, uid, gid int) error {
	pfd, base, err := d.parent(name, false)
	if err != nil {
		return err
	}
	return unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
}

// Chtimes sets the access and modification times of name, not of what it
// may link to.
func (d *Dir) Chtimes(name string, t time.Time) error {
	pfd, base, err := d.parent(name, false)
	if err != nil {
		return err
	}
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.UtimesNanoAt(pfd, base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

// Symlink makes name a symlink to target, which is only stored, never
// resolved here.
func (d *Dir) Symlink(target, name string) error {
	fd, base, err := d.parent(name, false)
	if err != nil {
		return err
	}
	return unix.Symlinkat(target, fd, base)
}

// Link makes newname a hard link to oldname, which is not followed if it
// is a symlink.
func (d *Dir) Link(oldname, newname string) error {
	ofd, obase, err := d.parent(oldname, false)
	if err != nil {
		return err
	}
	ofd, err = unix.Dup(ofd) // the next walk may close it
	if err != nil {
		return err
	}
	defer unix.Close(ofd)
	nfd, nbase, err := d.parent(newname, false)
	if err != nil {
		return err
	}
	return unix.Linkat(ofd, obase, nfd, nbase, 0)
}

// Remove removes the file, symlink or empty directory name.
func (d *Dir) Remove(name string) error {
	fd, base, err := d.parent(name, false)
	if err != nil {
		return err
	}
	err = unix.Unlinkat(fd, base, 0)
	if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EPERM) {
		// The directory kept open may be the one removed.
		d.forget()
		if rerr := unix.Unlinkat(fd, base, unix.AT_REMOVEDIR); !errors.Is(rerr, unix.ENOTDIR) {
			return rerr
		}
	}
	return err
}

// RemoveAll removes name and, for a directory, everything beneath it,
// following no symlink; a missing name is no error.
func (d *Dir) RemoveAll(name string) error {
	fd, base, err := d.parent(name, false)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	err = unix.Unlinkat(fd, base, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil // a file or symlink: what d keeps open stays
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, err = unix.Dup(fd)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	d.forget() // the directory kept open may be beneath the one removed
	return RemoveAt(fd, base)
}

// RemoveAt removes base in the directory open at dirfd and, when it is a
// directory, everything beneath it, following no symlink whatever the
// kernel does with O_NOFOLLOW|O_DIRECTORY; a missing base is no error.
func RemoveAt(dirfd int, base string) error {
	err := unix.Unlinkat(dirfd, base, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	p, serr := stepDir(dirfd, base)
	if serr != nil {
		if errors.Is(serr, unix.ENOENT) {
			return nil
		}
		if errors.Is(serr, unix.ELOOP) || errors.Is(serr, unix.ENOTDIR) {
			return err // not a directory after all: unlink's refusal stands
		}
		return serr
	}
	fd, rerr := reopen(p)
	unix.Close(p)
	if rerr != nil {
		return rerr
	}
	for {
		names, err := readNames(fd, 1024)
		if err != nil {
			unix.Close(fd)
			return err
		}
		if len(names) == 0 {
			break
		}
		for _, n := range names {
			if err := RemoveAt(fd, n); err != nil {
				unix.Close(fd)
				return err
			}
		}
		// Entries were removed: read from the start again.
		if _, err := unix.Seek(fd, 0, io.SeekStart); err != nil {
			unix.Close(fd)
			return err
		}
	}
	unix.Close(fd)
	err = unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// ReadNames lists the names in the directory open at fd (without "." and
// ".."), from the descriptor's offset to the end.
func ReadNames(fd int) ([]string, error) {
	return readNames(fd, -1)
}

// readNames reads up to max names (all when max < 0) from fd.
func readNames(fd int, max int) ([]string, error) {
	var names []string
	buf := make([]byte, 32<<10)
	for max < 0 || len(names) < max {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
	return names, nil
}
