package checkpoint

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/internal/archive"
)

// A checkpoint's disk is mostly its template's: stored whole, each
// checkpoint would hold the template again. WriteDiff writes only what
// differs from a base tree (the template, on the node that took it), and
// ApplyDiff applies that to a copy of the same tree elsewhere. The base
// is matched by TreeDigest, not by a btrfs subvolume's identity: a
// template of one name is built or imported by each node on its own, so
// `btrfs send -p` (which needs the parent subvolume, by UUID, on the
// receiving side) would not find it there, and it may not even hold the
// same bytes.

// WriteDiff writes a checkpoint's archive as WriteArchive does, except
// that its disk is a diff against the tree at baseDir, which base names:
// the entries of diskDir that differ from baseDir's (a regular file
// counts as the same only with the same type, mode, owner, mtime, size
// and bytes, read and compared: a sandbox may set a file's mtime back),
// each with every directory above it, and then RemovedEntry, the
// entries of baseDir that diskDir lacks. Files with several hard links
// are always written, so that their links are made again as they are.
func WriteDiff(ctx context.Context, w io.Writer, m Manifest, diskDir, memDir, baseDir string, base Base) error {
	m.Base = &base
	return writeArchive(ctx, w, m, diskDir, memDir, baseDir)
}

// ApplyDiff reads a diff archive written by WriteDiff against base (it
// refuses any other archive): its disk's entries are applied to the tree
// at diskRoot, a writable copy of base (what is there under an entry's
// name is replaced, a directory kept), the removed entries removed, and
// its memory image goes into dest, an empty directory, as dest/mem. It
// is as hostile an input as ReadArchive's and is checked the same way:
// every name clean and under disk/ or mem/, every parent a directory of
// the archive (so of the tree, made or kept by it: nothing is followed
// through a symlink of the base's either), a removed name too, every
// checksum, and maxBytes bounds its files. On an error, diskRoot and
// dest may hold part of it: the caller discards both.
func ApplyDiff(ctx context.Context, r io.Reader, diskRoot, dest string, base Base, maxBytes int64) (*Manifest, error) {
	return readArchive(ctx, r, dest, diskRoot, &base, maxBytes)
}

// TreeDigest is the identity of the tree at root, as a diff's base:
// "sha256:" and the SHA-256 of one line per entry in name order (type,
// mode, owner, size, device, the SHA-256 of a file's bytes, name, link
// target or, for a further hard link, the first name: the lines of an
// archive's SumsEntry), with each regular file's mtime. The mtimes are
// in it because a memory image restores only onto files of the mtimes
// it saw (gVisor checks those of the files it had looked up): a
// template built again from the same recipe, elsewhere, holds the same
// bytes with other mtimes, and is another base. Directories' and
// symlinks' times are not (nothing checks them, and a copy may not keep
// a symlink's).
func TreeDigest(ctx context.Context, root string) (string, error) {
	aw := &archiveWriter{tw: tar.NewWriter(io.Discard), links: map[[2]uint64]string{}, fileTimes: true}
	if err := aw.tree(ctx, root, DiskEntry); err != nil {
		return "", fmt.Errorf("digest of %s: %w", root, err)
	}
	sum := sha256.Sum256(aw.sums.Bytes())
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// pendingDir is a directory of a diff not written yet: it is, with every
// one above it, once something in it is (flush).
type pendingDir struct {
	name string
	st   unix.Stat_t
}

// flush writes the pending directories.
func (aw *archiveWriter) flush() error {
	for _, p := range aw.pending {
		if err := aw.header(p.name, &p.st, ""); err != nil {
			return err
		}
	}
	aw.pending = aw.pending[:0]
	return nil
}

// diffTree writes what of the tree at root differs from the one at base,
// under prefix.
func (aw *archiveWriter) diffTree(ctx context.Context, root, base, prefix string) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("reading %s: %w", root, err)
	}
	defer unix.Close(fd)
	bfd, err := unix.Open(base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("reading %s: %w", base, err)
	}
	defer unix.Close(bfd)
	var st, bst unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("reading %s: %w", root, err)
	}
	if err := unix.Fstat(bfd, &bst); err != nil {
		return fmt.Errorf("reading %s: %w", base, err)
	}
	// The disk itself is always written: the diff's every entry is
	// beneath it.
	aw.pending = append(aw.pending, pendingDir{prefix, st})
	if err := aw.flush(); err != nil {
		return err
	}
	return aw.diffDir(ctx, fd, bfd, prefix, &st, &bst)
}

// diffDir writes what of the directory open at fd (name, lstat st)
// differs from the base's directory open at bfd (lstat bst).
func (aw *archiveWriter) diffDir(ctx context.Context, fd, bfd int, name string, st, bst *unix.Stat_t) error {
	depth := len(aw.pending)
	if name != DiskEntry {
		aw.pending = append(aw.pending, pendingDir{name, *st})
		depth++
		if !sameMeta(st, bst) {
			if err := aw.flush(); err != nil {
				return err
			}
		}
	}
	names, err := archive.ReadNames(fd)
	if err != nil {
		return fmt.Errorf("reading %s: %w", name, err)
	}
	bnames, err := archive.ReadNames(bfd)
	if err != nil {
		return fmt.Errorf("reading the base's %s: %w", name, err)
	}
	slices.Sort(names)
	inBase := make(map[string]bool, len(bnames))
	for _, n := range bnames {
		inBase[n] = true
	}
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		full := path.Join(name, n)
		if !inBase[n] {
			if err := aw.flush(); err != nil {
				return err
			}
			if err := aw.entryAt(ctx, fd, n, full); err != nil {
				return err
			}
			continue
		}
		delete(inBase, n)
		if err := aw.diffEntry(ctx, fd, bfd, n, full); err != nil {
			return err
		}
	}
	if len(inBase) > 0 {
		if err := aw.flush(); err != nil {
			return err
		}
		gone := make([]string, 0, len(inBase))
		for n := range inBase {
			gone = append(gone, path.Join(name, n))
		}
		slices.Sort(gone)
		aw.removed = append(aw.removed, gone...)
	}
	if len(aw.pending) == depth && depth > 0 {
		aw.pending = aw.pending[:depth-1] // nothing in it differs
	}
	return nil
}

// diffEntry writes entry base of the directory open at fd unless it is
// the same as the base's of that name, in the directory open at bfd.
func (aw *archiveWriter) diffEntry(ctx context.Context, fd, bfd int, base, name string) error {
	if err := checkLimits(name); err != nil {
		return err
	}
	var st, bst unix.Stat_t
	if err := unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("reading %s: %w", name, err)
	}
	if err := unix.Fstatat(bfd, base, &bst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("reading the base's %s: %w", name, err)
	}
	kind, bkind := st.Mode&unix.S_IFMT, bst.Mode&unix.S_IFMT
	if kind == unix.S_IFSOCK {
		// No archive keeps a socket: what the base has there goes.
		if bkind != unix.S_IFSOCK {
			if err := aw.flush(); err != nil {
				return err
			}
			aw.removed = append(aw.removed, name)
		}
		return nil
	}
	if kind == bkind {
		same := false
		var err error
		switch kind {
		case unix.S_IFDIR:
			sub, err := archive.OpenSubdir(fd, base)
			if err != nil {
				return fmt.Errorf("reading %s: %w", name, err)
			}
			defer unix.Close(sub)
			bsub, err := archive.OpenSubdir(bfd, base)
			if err != nil {
				return fmt.Errorf("reading the base's %s: %w", name, err)
			}
			defer unix.Close(bsub)
			return aw.diffDir(ctx, sub, bsub, name, &st, &bst)
		case unix.S_IFREG:
			if st.Nlink == 1 && bst.Nlink == 1 && sameMeta(&st, &bst) && st.Size == bst.Size {
				same, err = sameContent(fd, bfd, base, st.Size)
			}
		case unix.S_IFLNK:
			if st.Uid == bst.Uid && st.Gid == bst.Gid {
				var a, b string
				a, err = readlinkAt(fd, base)
				if err == nil {
					b, err = readlinkAt(bfd, base)
				}
				same = err == nil && a == b
			}
		case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
			same = sameMeta(&st, &bst) && st.Rdev == bst.Rdev
		}
		if err != nil {
			return fmt.Errorf("comparing %s with the base's: %w", name, err)
		}
		if same {
			return nil
		}
	}
	if err := aw.flush(); err != nil {
		return err
	}
	return aw.entryAt(ctx, fd, base, name)
}

// sameMeta reports whether two entries have the same type, mode, owner
// and mtime.
func sameMeta(a, b *unix.Stat_t) bool {
	return a.Mode == b.Mode && a.Uid == b.Uid && a.Gid == b.Gid && a.Mtim == b.Mtim
}

// sameContent reports whether file name of the directories open at fd
// and bfd holds the same size bytes in both.
func sameContent(fd, bfd int, name string, size int64) (bool, error) {
	open := func(dir int) (*os.File, error) {
		f, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		return os.NewFile(uintptr(f), name), nil
	}
	a, err := open(fd)
	if err != nil {
		return false, err
	}
	defer a.Close()
	b, err := open(bfd)
	if err != nil {
		return false, err
	}
	defer b.Close()
	if sameExtents(int(a.Fd()), int(b.Fd())) {
		return true, nil
	}
	const chunk = 256 << 10
	bufA, bufB := make([]byte, chunk), make([]byte, chunk)
	for left := size; left > 0; {
		n := int(min(left, chunk))
		if _, err := io.ReadFull(a, bufA[:n]); err != nil {
			return false, err
		}
		if _, err := io.ReadFull(b, bufB[:n]); err != nil {
			return false, err
		}
		if !bytes.Equal(bufA[:n], bufB[:n]) {
			return false, nil
		}
		left -= int64(n)
	}
	return true, nil
}

// readlinkAt reads symlink name in the directory open at fd.
func readlinkAt(fd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax+1)
	n, err := unix.Readlinkat(fd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// removedList is the body of RemovedEntry.
func (aw *archiveWriter) removedList() []byte {
	var b bytes.Buffer
	for _, n := range aw.removed {
		b.WriteString(strconv.Quote(n))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// removedKind marks, in archiveReader.kinds, a name a diff removed.
const removedKind = 'R'

// removals reads a diff's RemovedEntry and removes what it names from
// the tree the diff applies to. Each name must be a clean name under the
// disk (not the disk itself) whose directory is one of the archive's and
// that is no entry of it.
func (ar *archiveReader) removals(h *tar.Header) error {
	if _, ok := ar.kinds[RemovedEntry]; ok || h.Typeflag != tar.TypeReg || h.Size > maxSums {
		return archiveErr("bad %s entry", RemovedEntry)
	}
	body, sum, err := ar.readSmall(h)
	if err != nil {
		return err
	}
	ar.sums.WriteString(sumLine(h, sum))
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 4*maxName+16)
	for sc.Scan() {
		name, err := strconv.Unquote(sc.Text())
		if err != nil {
			return archiveErr("%s: bad line %.80q", RemovedEntry, sc.Text())
		}
		n, err := ar.checkName(&tar.Header{Name: name}, false)
		if err != nil {
			return err
		}
		d, at := ar.at(n)
		if d != ar.disk || at == "." || strings.HasSuffix(name, "/") {
			return archiveErr("%s: %q is not beneath the disk", RemovedEntry, name)
		}
		if err := d.RemoveAll(at); err != nil {
			return fmt.Errorf("removing %s: %w", name, err)
		}
		ar.kinds[n] = removedKind
	}
	if err := sc.Err(); err != nil {
		return archiveErr("%s: %v", RemovedEntry, err)
	}
	ar.kinds[RemovedEntry] = tar.TypeReg // and no disk entry after it
	return nil
}

// replace makes room for a diff's entry h at name in the tree d (its
// base's copy): what is there goes, unless both are directories.
func (ar *archiveReader) replace(d *archive.Dir, name string, h *tar.Header) error {
	st, err := d.Lstat(name)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case err != nil:
		return ar.unpackErr(h, err)
	case h.Typeflag == tar.TypeDir && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return nil
	}
	if err := d.RemoveAll(name); err != nil {
		return ar.unpackErr(h, err)
	}
	return nil
}

// rootMeta gives the root of the tree a diff applies to the owner and
// mode of the diff's disk entry.
func (ar *archiveReader) rootMeta(h *tar.Header) error {
	if h.Mode&^0o7777 != 0 || h.Uid < 0 || h.Gid < 0 {
		return archiveErr("entry %q: bad mode or owner", h.Name)
	}
	fd, err := ar.disk.OpenDirAt(".")
	if err != nil {
		return ar.unpackErr(h, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, h.Uid, h.Gid); err != nil {
		return ar.unpackErr(h, err)
	}
	if err := unix.Fchmod(fd, archive.UnixPerm(fileMode(uint32(h.Mode)))); err != nil {
		return ar.unpackErr(h, err)
	}
	return nil
}

// chtimes sets a directory's times once it is filled.
func (ar *archiveReader) chtimes(name string, t time.Time) error {
	d, at := ar.at(name)
	if at != "." {
		return d.Chtimes(at, t)
	}
	fd, err := d.OpenDirAt(".")
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.UtimesNanoAt(fd, ".", []unix.Timespec{ts, ts}, 0)
}
