package archive

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrRefused is wrapped by the error of an entry Extract refuses for what
// the tar holds: a name or a symlink that leads outside the directory, a
// type it does not make, something in the way that is not a directory.
var ErrRefused = errors.New("refused")

// An EntryError is the failure to extract one entry: Name is the entry's
// name as the tar gives it, Err the cause (wrapping ErrRefused when the
// tar's content is to blame, an errno of the file system otherwise).
type EntryError struct {
	Name string
	Err  error
}

func (e *EntryError) Error() string { return fmt.Sprintf("tar entry %q: %s", e.Name, e.Err) }

func (e *EntryError) Unwrap() error { return e.Err }

func refused(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrRefused)
}

// Options say how Extract differs between its callers.
type Options struct {
	// Owners gives each entry the uid and gid of its header (an image
	// unpacked as root); otherwise files belong to whoever extracts.
	Owners bool
	// SetID keeps set-user-id, set-group-id and sticky bits; otherwise
	// only the permission bits are kept.
	SetID bool
	// Layer applies the tar as an OCI image layer onto what is there:
	// ".." is taken away lexically, symlinks in an entry's directories are
	// followed as the sandbox will (an absolute target from the root, never
	// above it), .wh. whiteouts delete, whatever is at an entry's name is
	// replaced, hard links are made, devices and fifos are skipped. Without
	// it a name leading outside the directory, a symlink on an entry's way
	// and any entry but a file, directory or symlink are refused.
	Layer bool
	// MaxBytes, when positive, caps the bytes the tar's files may hold in
	// all: a file that would pass it is refused before a byte of it is
	// written. A tar's size says nothing of what it writes: a sparse file
	// of a few bytes in the tar reads back as its whole length of zeros,
	// and a compressed layer may expand a thousandfold.
	MaxBytes int64
}

// ErrTooLarge is wrapped, with ErrRefused, by the error of a file that
// would take the files extracted past Options.MaxBytes.
var ErrTooLarge = errors.New("over the size cap")

// Whiteout markers of the OCI image layer format: a file .wh.NAME deletes
// NAME of the layers below, and .wh..wh..opq in a directory hides
// everything the layers below put in it.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// maxLinks bounds the symlinks a layer's names may go through, as the
// kernel's ELOOP does.
const maxLinks = 255

// Extract extracts the tar read from r beneath d. Files are written to a
// temporary name beside them and renamed into place once whole, so that a
// tar cut short leaves no half file; directories get their modes and times
// at the end, once filled, so a read-only directory of the tar does not
// stop its own content. It stops at the first error, an *EntryError for
// an entry's.
func Extract(ctx context.Context, d *Dir, r io.Reader, opts Options) error {
	x := &extractor{d: d, opts: opts, made: map[string]bool{}}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the tar: %w: %w", err, ErrRefused)
		}
		if err := x.entry(hdr, tr); err != nil {
			return &EntryError{Name: hdr.Name, Err: err}
		}
	}
	return x.finishDirs()
}

type extractor struct {
	d    *Dir
	opts Options
	// made holds what this tar has put in place, so that a layer's opaque
	// marker, which may come after them, spares them.
	made map[string]bool
	dirs []*tar.Header // directories made, Name cleaned, to finish last
	// written is the bytes of the files extracted so far (their sizes as
	// the headers declare them, which is what the tar reader yields).
	written int64
	// lastDir is the directory the last entry went into, made and found
	// to be one then; each entry's own calls still refuse a symlink there.
	lastDir string
}

// name turns an entry's name into a clean local one; "" for the root.
func (x *extractor) name(hdr *tar.Header) (string, error) {
	if x.opts.Layer {
		return strings.TrimPrefix(path.Clean("/"+hdr.Name), "/"), nil
	}
	if strings.ContainsRune(hdr.Name, 0) {
		return "", refused("a NUL in the name")
	}
	name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
	if name == "." {
		return "", nil
	}
	if strings.HasPrefix(name, "/") || name == ".." || strings.HasPrefix(name, "../") {
		return "", refused("it would land outside %s", x.d.Name())
	}
	return name, nil
}

func (x *extractor) entry(hdr *tar.Header, body io.Reader) error {
	name, err := x.name(hdr)
	if err != nil || name == "" {
		return err // the root itself: its owner and mode are the caller's
	}
	if x.opts.Layer {
		if name, err = x.resolveParent(name); err != nil {
			return err
		}
		base := path.Base(name)
		if base == opaqueMarker {
			return x.opaque(path.Dir(name))
		}
		if strings.HasPrefix(base, whiteoutPrefix) {
			x.lastDir = ""
			return x.d.RemoveAll(path.Join(path.Dir(name), strings.TrimPrefix(base, whiteoutPrefix)))
		}
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	if dir := path.Dir(name); dir != "." && dir != x.lastDir {
		if err := x.d.Mkdir(dir, 0o755); err != nil {
			return x.wayError(err)
		}
		// The entries of a directory come together: checked once.
		x.lastDir = dir
	}
	x.made[name] = true
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(name, hdr)
	case tar.TypeReg, tar.TypeRegA:
		if err := x.charge(hdr.Size); err != nil {
			return err
		}
		if err := x.clear(name); err != nil {
			return err
		}
		return x.file(name, hdr, body)
	case tar.TypeSymlink:
		if err := x.clear(name); err != nil {
			return err
		}
		// The target is only stored: no later entry goes through it
		// (Layer resolves it as the sandbox would, beneath the root).
		if err := x.d.Symlink(hdr.Linkname, name); err != nil {
			return x.wayError(err)
		}
		if x.opts.Owners {
			return x.lchown(name, hdr)
		}
		return nil
	case tar.TypeLink:
		if !x.opts.Layer {
			break
		}
		target := strings.TrimPrefix(path.Clean("/"+hdr.Linkname), "/")
		if target == "" {
			return refused("a hard link to the root")
		}
		if target, err = x.resolveParent(target); err != nil {
			return err
		}
		if err := x.clear(name); err != nil {
			return err
		}
		// The kernel refuses a link to a directory; the target is
		// not followed if it is a symlink.
		return x.wayError(x.d.Link(target, name))
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if x.opts.Layer {
			// Devices come from gVisor's own /dev; a node in an image
			// would be a way to reach the host's through the rootfs.
			delete(x.made, name)
			return nil
		}
	}
	return refused("entries of type %q (hard links, devices, fifos) are not extracted", hdr.Typeflag)
}

// charge counts a file of size bytes against Options.MaxBytes.
func (x *extractor) charge(size int64) error {
	if x.opts.MaxBytes <= 0 {
		return nil
	}
	if size > x.opts.MaxBytes-x.written {
		return fmt.Errorf("its %d bytes would take the extraction past %d: %w: %w", size, x.opts.MaxBytes, ErrTooLarge, ErrRefused)
	}
	x.written += size
	return nil
}

// FreeBytes is the space left to an unprivileged user on d's file
// system: a MaxBytes for a caller whose tar must not fill it.
func (d *Dir) FreeBytes() (int64, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(d.fd, &st); err != nil {
		return 0, fmt.Errorf("reading the free space of %s: %w", d.name, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// wayError marks a symlink or a file where a directory should be as the
// tar's fault.
func (x *extractor) wayError(err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return refused("it passes through a symlink or a file in %s (%s)", x.d.Name(), err)
	}
	return err
}

// clear removes what is at name before a file or symlink is made there: a
// layer replaces anything; an upload replaces a file or symlink, not a
// directory (the write then fails, as tar's does).
func (x *extractor) clear(name string) error {
	if x.opts.Layer {
		return x.wayError(x.d.RemoveAll(name))
	}
	err := x.d.Remove(name)
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
		return nil
	}
	return x.wayError(err)
}

func (x *extractor) dir(name string, hdr *tar.Header) error {
	st, err := x.d.Lstat(name)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		// A directory already there stays, with its content; its
		// metadata is the tar's.
	case err == nil && x.opts.Layer:
		if err := x.d.RemoveAll(name); err != nil {
			return err
		}
		fallthrough
	case errors.Is(err, unix.ENOENT):
		if err := x.d.Mkdir(name, 0o700); err != nil {
			return x.wayError(err)
		}
	case err == nil:
		return refused("%s is there and is not a directory", path.Join(x.d.Name(), name))
	default:
		return x.wayError(err)
	}
	h := *hdr
	h.Name = name
	x.dirs = append(x.dirs, &h)
	return nil
}

// mode is the mode an entry gets.
func (x *extractor) mode(hdr *tar.Header) uint32 {
	if x.opts.SetID {
		return uint32(hdr.Mode) & 0o7777
	}
	return uint32(hdr.Mode) & 0o777
}

// file writes a regular file's content to a temporary name beside name,
// gives it its owner, mode and time, and renames it into place.
func (x *extractor) file(name string, hdr *tar.Header, body io.Reader) error {
	fd, base, err := x.d.parent(name, false)
	if err != nil {
		return x.wayError(err)
	}
	tmp := fmt.Sprintf(".%s.loam-%d-%d", base, os.Getpid(), time.Now().UnixNano())
	if len(tmp) > 255 {
		tmp = fmt.Sprintf(".loam-%d-%d", os.Getpid(), time.Now().UnixNano())
	}
	ffd, err := unix.Openat(fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(ffd), tmp)
	defer f.Close()
	done := false
	defer func() {
		if !done {
			_ = unix.Unlinkat(fd, tmp, 0)
		}
	}()
	if _, err := io.Copy(f, body); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	if x.opts.Owners {
		// Before the mode: chown clears the set-id bits.
		if err := unix.Fchown(ffd, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if err := unix.Fchmod(ffd, x.mode(hdr)); err != nil {
		return err
	}
	if !hdr.ModTime.IsZero() {
		t := unix.NsecToTimespec(hdr.ModTime.UnixNano())
		_ = unix.UtimesNanoAt(fd, tmp, []unix.Timespec{t, t}, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err := unix.Renameat(fd, tmp, fd, base); err != nil {
		return err
	}
	done = true
	return nil
}

func (x *extractor) lchown(name string, hdr *tar.Header) error {
	fd, base, err := x.d.parent(name, false)
	if err != nil {
		return err
	}
	return unix.Fchownat(fd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)
}

// finishDirs gives the directories made their owner, mode and time, the
// deepest first (a time set would change again with each entry made in a
// directory, a mode could stop the next entry). A directory that has
// become a symlink since is passed over, never followed.
func (x *extractor) finishDirs() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		h := x.dirs[i]
		fd, err := x.d.OpenDirAt(h.Name)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				continue // removed or replaced by a later entry
			}
			return &EntryError{Name: h.Name, Err: err}
		}
		err = x.finishDir(fd, h)
		unix.Close(fd)
		if err != nil {
			return &EntryError{Name: h.Name, Err: err}
		}
	}
	return nil
}

func (x *extractor) finishDir(fd int, h *tar.Header) error {
	if x.opts.Owners {
		if err := unix.Fchown(fd, h.Uid, h.Gid); err != nil {
			return err
		}
	}
	if err := unix.Fchmod(fd, x.mode(h)); err != nil {
		return err
	}
	if !h.ModTime.IsZero() {
		t := unix.NsecToTimespec(h.ModTime.UnixNano())
		_ = unix.UtimesNanoAt(fd, ".", []unix.Timespec{t, t}, 0)
	}
	return nil
}

// opaque empties dir of what lower layers put there, keeping what this
// layer has made already.
func (x *extractor) opaque(dir string) error {
	fd, err := x.d.OpenDirAt(dir)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening opaque directory %s: %w", dir, err)
	}
	names, err := ReadNames(fd)
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("reading opaque directory %s: %w", dir, err)
	}
	defer unix.Close(fd)
	// What is kept open may be among what goes.
	x.d.forget()
	x.lastDir = ""
	for _, n := range names {
		p := path.Join(dir, n)
		if x.made[p] {
			continue
		}
		if err := RemoveAt(fd, n); err != nil {
			return fmt.Errorf("emptying opaque directory %s: %w", dir, err)
		}
	}
	return nil
}

// resolveParent resolves the directories of a layer's entry name (clean,
// local) to a path with no symlink in them, following each as it would be
// inside the sandbox: an absolute target from the root, ".." never above
// it. A component that does not exist ends the walk: the rest is made as
// plain directories. The last component is not resolved.
func (x *extractor) resolveParent(name string) (string, error) {
	dir, base := path.Split(name)
	if dir == "" {
		return name, nil
	}
	todo := strings.Split(strings.TrimSuffix(dir, "/"), "/")
	var done []string
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		cur := path.Join(append(done, c)...)
		st, err := x.d.Lstat(cur)
		if errors.Is(err, unix.ENOENT) {
			done = append(append(done, c), todo...)
			break
		}
		if err != nil {
			return "", x.wayError(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			done = append(done, c)
			continue
		}
		if links++; links > maxLinks {
			return "", refused("too many levels of symbolic links in %s", dir)
		}
		target, err := x.d.Readlink(cur)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			done = nil
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	// What is left after a missing component is taken lexically, never
	// above the root.
	return strings.TrimPrefix(path.Clean("/"+path.Join(append(done, base)...)), "/"), nil
}
