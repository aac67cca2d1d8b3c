package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Whiteout markers of the OCI image layer format: a file .wh.NAME deletes
// NAME of the layers below, and .wh..wh..opq in a directory hides everything
// the layers below put in it.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// ErrBadLayer is wrapped by every error about a layer's content: an entry
// the unpacker refuses (an escape, an unknown type), or a corrupt archive.
var ErrBadLayer = errors.New("bad image layer")

// Unpacker applies layers, in order, onto a root directory. The content of
// an image is hostile input: every file operation goes through an os.Root,
// so no name and no symlink the layers make can reach outside the root,
// and an entry's last component is replaced, never followed.
//
// An Unpacker is for one root and one goroutine.
type Unpacker struct {
	root *os.Root
}

// NewUnpacker opens dir, which must exist, as the root to unpack into.
func NewUnpacker(dir string) (*Unpacker, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("opening %s to unpack into: %w", dir, err)
	}
	return &Unpacker{root: r}, nil
}

// Close releases the root.
func (u *Unpacker) Close() error { return u.root.Close() }

// ApplyCompressed applies one layer given as it is stored in a registry:
// gzip, zstd or plain tar, told apart by their magic numbers.
func (u *Unpacker) ApplyCompressed(ctx context.Context, r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrBadLayer, err)
		}
		defer gz.Close()
		return u.Apply(ctx, gz)
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrBadLayer, err)
		}
		defer zr.Close()
		return u.Apply(ctx, zr)
	default:
		return u.Apply(ctx, br)
	}
}

// Apply applies one uncompressed layer (a tar stream) onto the root.
func (u *Unpacker) Apply(ctx context.Context, r io.Reader) error {
	tr := tar.NewReader(r)
	// made holds what this layer has put in place, so that an opaque
	// marker, which may come after them, spares them.
	made := map[string]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: reading tar: %w", ErrBadLayer, err)
		}
		name, ok := cleanName(hdr.Name)
		if !ok {
			continue // the root itself: its owner and mode are the pool's
		}
		if err := u.entry(tr, hdr, name, made); err != nil {
			return fmt.Errorf("unpacking %s: %w", name, err)
		}
	}
}

// cleanName makes a tar name relative to the root, with every ".." taken
// away lexically; false for the root itself.
func cleanName(name string) (string, bool) {
	p := strings.TrimPrefix(path.Clean("/"+name), "/")
	return p, p != ""
}

func (u *Unpacker) entry(tr *tar.Reader, hdr *tar.Header, name string, made map[string]bool) error {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	// The directory may be reached through symlinks a layer made, absolute
	// ones too (Debian's /var/run -> /run), which os.Root would refuse as
	// escapes: they are followed here as the sandbox will, inside the root.
	dir, err := u.resolve(dir)
	if err != nil {
		return err
	}
	name = path.Join(dir, base)
	if base == opaqueMarker {
		return u.opaque(dir, made)
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		victim := path.Join(dir, strings.TrimPrefix(base, whiteoutPrefix))
		if err := u.root.RemoveAll(victim); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("whiting out %s: %w", victim, err)
		}
		return nil
	}
	if dir != "." {
		if err := u.parents(dir); err != nil {
			return err
		}
	}
	made[name] = true

	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.dir(name, hdr)
	case tar.TypeReg, tar.TypeRegA:
		if err := u.replace(name); err != nil {
			return err
		}
		return u.file(tr, name, hdr)
	case tar.TypeSymlink:
		if err := u.replace(name); err != nil {
			return err
		}
		// The target is stored as it is: it is resolved inside the
		// sandbox, where / is the root, never by the unpacker.
		if err := u.root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
		return u.root.Lchown(name, hdr.Uid, hdr.Gid)
	case tar.TypeLink:
		target, ok := cleanName(hdr.Linkname)
		if !ok {
			return fmt.Errorf("%w: hard link to the root", ErrBadLayer)
		}
		tdir, tbase := path.Split(target)
		tdir, err := u.resolve(strings.TrimSuffix(tdir, "/"))
		if err != nil {
			return err
		}
		target = path.Join(tdir, tbase)
		if err := u.replace(name); err != nil {
			return err
		}
		// os.Root refuses a target outside the root, and a link to a
		// directory is refused by the kernel.
		return u.root.Link(target, name)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		// Devices come from gVisor's own /dev; a node in an image would be
		// a way to reach the host's through the bind of the rootfs.
		delete(made, name)
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return fmt.Errorf("%w: entry type %q is not supported", ErrBadLayer, hdr.Typeflag)
	}
}

// maxLinks bounds the symlinks resolve follows, as the kernel's ELOOP does.
const maxLinks = 255

// resolve turns a directory path into one with no symlink in it, following
// each symlink as it would be inside the sandbox: an absolute target from
// the root, ".." never above the root. A component that does not exist
// ends the walk: the rest is made as plain directories. "." is the root.
func (u *Unpacker) resolve(dir string) (string, error) {
	if dir == "." || dir == "" {
		return ".", nil
	}
	todo := strings.Split(dir, "/")
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
		st, err := u.root.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			return path.Join(append(append(done, c), todo...)...), nil
		}
		if err != nil {
			return "", err
		}
		if st.Mode()&fs.ModeSymlink == 0 {
			done = append(done, c)
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("%w: too many levels of symbolic links in %s", ErrBadLayer, dir)
		}
		target, err := u.root.Readlink(cur)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			done = nil
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	if len(done) == 0 {
		return ".", nil
	}
	return path.Join(done...), nil
}

// parents makes the missing directories above an entry. Layers usually
// list them, but need not.
func (u *Unpacker) parents(dir string) error {
	st, err := u.root.Stat(dir)
	if err == nil && st.IsDir() {
		return nil
	}
	return u.root.MkdirAll(dir, 0o755)
}

// replace removes what is at name unless it is a directory that will stay
// one; never following a symlink there.
func (u *Unpacker) replace(name string) error {
	err := u.root.RemoveAll(name)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func (u *Unpacker) dir(name string, hdr *tar.Header) error {
	st, err := u.root.Lstat(name)
	switch {
	case err == nil && st.IsDir():
		// A directory of a lower layer stays, with its content; its
		// metadata is this layer's.
	case err == nil:
		if err := u.root.Remove(name); err != nil {
			return err
		}
		fallthrough
	case errors.Is(err, fs.ErrNotExist):
		if err := u.root.Mkdir(name, 0o700); err != nil {
			return err
		}
	default:
		return err
	}
	return u.attrs(name, hdr)
}

func (u *Unpacker) file(tr *tar.Reader, name string, hdr *tar.Header) error {
	// O_EXCL: whatever was there is gone, so a symlink planted since
	// cannot be followed.
	f, err := u.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, tr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return u.attrs(name, hdr)
}

// attrs gives a file or directory its owner, mode and times. The owner
// goes first: chown clears the set-id bits.
func (u *Unpacker) attrs(name string, hdr *tar.Header) error {
	if err := u.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := u.root.Chmod(name, hdr.FileInfo().Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
		return err
	}
	if !hdr.ModTime.IsZero() {
		return u.root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	}
	return nil
}

// opaque empties dir of what lower layers put there, keeping what this
// layer has made already.
func (u *Unpacker) opaque(dir string, made map[string]bool) error {
	d, err := u.root.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening opaque directory %s: %w", dir, err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("reading opaque directory %s: %w", dir, err)
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if made[p] {
			continue
		}
		if err := u.root.RemoveAll(p); err != nil {
			return fmt.Errorf("emptying opaque directory %s: %w", dir, err)
		}
	}
	return nil
}
