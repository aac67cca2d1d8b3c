package checkpoint

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/archive"
)

// ManifestFormat is the version of Manifest and of the archive format that
// WriteArchive writes and ReadArchive reads.
const ManifestFormat = 1

// DiffFormat is the Format of a diff archive's manifest (WriteDiff): a
// loam that reads only ManifestFormat refuses it by its format.
const DiffFormat = 2

// Manifest describes a kept checkpoint: a template made from a checkpoint.
// The same document is the template's record on the host (manifest.json in
// its directory) and the first entry of its archive, so an exported
// template imports as exactly what it was.
type Manifest struct {
	// Format is ManifestFormat.
	Format int `json:"format"`
	// Name is the template's name on the host that wrote it; an import
	// gives its own.
	Name string `json:"name"`
	// Memory is true when the template holds a memory image (mem/) beside
	// its disk: sandboxes made from it resume its processes.
	Memory bool `json:"memory"`
	// Template, Image and Resources are those of the sandbox the checkpoint
	// was taken of; a sandbox made from a memory template takes them.
	Template  string        `json:"template,omitempty"`
	Image     string        `json:"image,omitempty"`
	Resources api.Resources `json:"resources"`
	// AgentToken is the token the agent in the memory image holds, which a
	// sandbox made from the template presents once to give it its own. It
	// opens nothing else, and anyone holding the image can read it there.
	AgentToken string `json:"agent_token,omitempty"`
	// From says where it came from ("sandbox/checkpoint"), for people.
	From string `json:"from,omitempty"`
	// CreatedAt is when the template was made.
	CreatedAt time.Time `json:"created_at"`
	// SizeBytes is what its disk's files and memory image hold.
	SizeBytes int64 `json:"size_bytes,omitempty"`
	// Snapshot is the disk pool's snapshot holding the template's disk on
	// this host; never written into an archive.
	Snapshot string `json:"snapshot,omitempty"`
	// Org is the org that owns the template on this host, from where its
	// directory is (template.Store); never written.
	Org string `json:"-"`
	// Base, in the archive of a checkpoint written as a diff (WriteDiff),
	// is the tree its disk is a diff against; nil in a whole archive.
	Base *Base `json:"base,omitempty"`
}

// Base names the tree a diff archive's disk applies to: a template, by
// its name on the node that wrote the diff and its TreeDigest, which is
// what another node matches (its template of that name may hold other
// bytes).
type Base struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
}

// Names of an archive's entries. An archive is a zstd-compressed tar whose
// first entry is ManifestEntry, then the disk's tree under DiskEntry and,
// for a memory template, the memory image under MemEntry, and last
// SumsEntry: one line per entry before it (type, mode, owner, size, the
// SHA-256 of its content, name and link target), so that any change to the
// archive's content or metadata, or a cut, is caught.
const (
	ManifestEntry = "manifest.json"
	DiskEntry     = "disk"
	MemEntry      = "mem"
	SumsEntry     = "SHA256SUMS"
	// RemovedEntry, in a diff archive only, after the disk's entries,
	// lists the base's entries the disk lacks: one strconv.Quote'd name
	// (under DiskEntry) a line.
	RemovedEntry = "removed"
)

// Limits on what an archive may hold, so that hostile input cannot make
// the reader hold much in memory.
const (
	maxManifest = 1 << 20
	maxSums     = 256 << 20
	// maxName bounds an entry's name: the sandbox's own paths reach
	// PATH_MAX (4096) and may go past it; Go's tar reader takes a name of
	// up to 1 MiB.
	maxName = 64 << 10
)

// ErrArchive matches (errors.Is) the error of an archive that is damaged
// or not one of ours: an *api.Error of code invalid, the user's to read.
var ErrArchive = api.Errorf(api.CodeInvalid, "invalid template archive")

func archiveErr(format string, args ...any) error {
	return api.Errorf(api.CodeInvalid, "template archive refused: %s", fmt.Sprintf(format, args...))
}

// WriteArchive writes a template as one archive to w: m (without its
// Snapshot), the tree at diskDir, and when memDir is not "" the files of
// the memory image there. It does not follow symlinks; hard links within
// the disk stay hard links.
func WriteArchive(ctx context.Context, w io.Writer, m Manifest, diskDir, memDir string) error {
	m.Base = nil
	return writeArchive(ctx, w, m, diskDir, memDir, "")
}

// writeArchive writes an archive, its disk whole or, when baseDir is not
// "", as a diff against the tree there.
func writeArchive(ctx context.Context, w io.Writer, m Manifest, diskDir, memDir, baseDir string) error {
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderCRC(true))
	if err != nil {
		return fmt.Errorf("writing archive: %w", err)
	}
	aw := &archiveWriter{tw: tar.NewWriter(zw), links: map[[2]uint64]string{}}
	m.Format, m.Snapshot = ManifestFormat, ""
	if m.Base != nil {
		m.Format = DiffFormat
	}
	m.Memory = memDir != ""
	body, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("writing archive: %w", err)
	}
	err = aw.bytes(ManifestEntry, body)
	switch {
	case err == nil && baseDir != "":
		if err = aw.diffTree(ctx, diskDir, baseDir, DiskEntry); err == nil {
			err = aw.bytes(RemovedEntry, aw.removedList())
		}
	case err == nil:
		err = aw.tree(ctx, diskDir, DiskEntry)
	}
	if err == nil && memDir != "" {
		err = aw.tree(ctx, memDir, MemEntry)
	}
	if err == nil {
		err = aw.bytes(SumsEntry, aw.sums.Bytes())
	}
	if err == nil {
		err = aw.tw.Close()
	}
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing archive: %w", err)
	}
	return nil
}

type archiveWriter struct {
	tw    *tar.Writer
	sums  bytes.Buffer
	links map[[2]uint64]string // (dev, inode) of files with several links -> first name
	// A diff's directories not written yet (WriteDiff), outermost first,
	// and the base's entries the disk lacks.
	pending []pendingDir
	removed []string
	// fileTimes puts regular files' mtimes in their sums lines: a
	// TreeDigest's, never an archive's.
	fileTimes bool
}

// sumLine is an entry's line in SumsEntry.
func sumLine(h *tar.Header, sum string) string {
	if sum == "" {
		sum = "-"
	}
	return fmt.Sprintf("%c %o %d %d %d %d %d %s %s %s\n", h.Typeflag, h.Mode, h.Uid, h.Gid, h.Size,
		h.Devmajor, h.Devminor, sum, strconv.Quote(h.Name), strconv.Quote(h.Linkname))
}

func (aw *archiveWriter) bytes(name string, body []byte) error {
	h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(len(body)), ModTime: time.Now(), Format: tar.FormatPAX}
	if name != SumsEntry {
		sum := sha256.Sum256(body)
		aw.sums.WriteString(sumLine(h, hex.EncodeToString(sum[:])))
	}
	if err := aw.tw.WriteHeader(h); err != nil {
		return err
	}
	_, err := aw.tw.Write(body)
	return err
}

// maxDepth bounds how deep an archive's tree goes, as the disk's own
// walks do (internal/disk's maxDepth, which copies an import into the
// pool): the export holds a descriptor for each level.
const maxDepth = 1024

// tree writes the tree at root under prefix. It walks by descriptor, one
// name at a time relative to a directory it holds open, so that a path as
// long as the sandbox may make (PATH_MAX inside, more with the data dir's
// path before it on the host) is written whole.
func (aw *archiveWriter) tree(ctx context.Context, root, prefix string) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("reading %s: %w", root, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("reading %s: %w", root, err)
	}
	return aw.dir(ctx, fd, prefix, &st)
}

// dir writes the directory open at fd, named name in the archive, with
// its lstat st, and everything beneath it in name order.
func (aw *archiveWriter) dir(ctx context.Context, fd int, name string, st *unix.Stat_t) error {
	if err := aw.header(name, st, ""); err != nil {
		return err
	}
	names, err := archive.ReadNames(fd)
	if err != nil {
		return fmt.Errorf("reading %s: %w", name, err)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := aw.entryAt(ctx, fd, n, path.Join(name, n)); err != nil {
			return err
		}
	}
	return nil
}

// entryAt writes entry base of the directory open at fd.
func (aw *archiveWriter) entryAt(ctx context.Context, fd int, base, name string) error {
	if err := checkLimits(name); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("reading %s: %w", name, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		sub, err := archive.OpenSubdir(fd, base)
		if err != nil {
			return fmt.Errorf("reading %s: %w", name, err)
		}
		defer unix.Close(sub)
		return aw.dir(ctx, sub, name, &st)
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax+1)
		n, err := unix.Readlinkat(fd, base, buf)
		if err != nil {
			return fmt.Errorf("reading %s: %w", name, err)
		}
		return aw.header(name, &st, string(buf[:n]))
	case unix.S_IFREG:
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := aw.links[key]; ok && st.Nlink > 1 {
			h := aw.tarHeader(name, &st)
			h.Typeflag, h.Linkname = tar.TypeLink, first
			aw.sums.WriteString(sumLine(h, ""))
			return aw.tw.WriteHeader(h)
		}
		if st.Nlink > 1 {
			aw.links[key] = name
		}
		ffd, err := unix.Openat(fd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("reading %s: %w", name, err)
		}
		f := os.NewFile(uintptr(ffd), name)
		defer f.Close()
		h := aw.tarHeader(name, &st)
		h.Typeflag, h.Size = tar.TypeReg, st.Size
		return aw.file(f, h)
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		return aw.header(name, &st, "")
	}
	return nil // sockets: nothing to keep
}

// checkLimits refuses a name no archive holds.
func checkLimits(name string) error {
	if len(name) > maxName {
		return fmt.Errorf("%s…: a path longer than %d bytes, which no archive holds", name[:64], maxName)
	}
	if strings.Count(name, "/") > maxDepth {
		return fmt.Errorf("%s…: deeper than %d directories, which no archive holds", name[:64], maxDepth)
	}
	return nil
}

// tarHeader is the header of name with the metadata of st.
func (aw *archiveWriter) tarHeader(name string, st *unix.Stat_t) *tar.Header {
	return &tar.Header{
		Name: name, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()).UTC(), Format: tar.FormatPAX,
	}
}

// header writes the entry of a directory, symlink, device or fifo.
func (aw *archiveWriter) header(name string, st *unix.Stat_t, link string) error {
	h := aw.tarHeader(name, st)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		h.Typeflag = tar.TypeDir
	case unix.S_IFLNK:
		h.Typeflag, h.Linkname = tar.TypeSymlink, link
	case unix.S_IFCHR, unix.S_IFBLK:
		h.Typeflag = tar.TypeChar
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			h.Typeflag = tar.TypeBlock
		}
		h.Devmajor, h.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		h.Typeflag = tar.TypeFifo
	}
	aw.sums.WriteString(sumLine(h, ""))
	return aw.tw.WriteHeader(h)
}

// file writes a regular file, hashing it on the way.
func (aw *archiveWriter) file(f *os.File, h *tar.Header) error {
	if err := aw.tw.WriteHeader(h); err != nil {
		return err
	}
	sum := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(aw.tw, sum), f, h.Size); err != nil {
		return fmt.Errorf("reading %s: %w", h.Name, err)
	}
	line := sumLine(h, hex.EncodeToString(sum.Sum(nil)))
	if aw.fileTimes {
		line = strings.TrimSuffix(line, "\n") + " " + strconv.FormatInt(h.ModTime.UnixNano(), 10) + "\n"
	}
	aw.sums.WriteString(line)
	return nil
}

// ReadArchive unpacks an archive written by WriteArchive into dest, an
// empty directory, as dest/disk and (for a memory template) dest/mem, and
// returns its manifest. The archive is hostile input: it is refused with an
// error wrapping ErrArchive unless every entry is where it may be (under
// disk/ or mem/, no "..", no absolute path, no entry twice, every parent a
// directory of the archive, so nothing is ever written through a symlink),
// relative symlinks stay inside disk/, hard links name an earlier file, and
// every checksum matches, and its files hold at most maxBytes (no limit
// when 0), so that it cannot fill the disk. On an error dest may hold part
// of it: the caller unpacks into a temporary directory and removes it.
// A diff archive (WriteDiff) is refused: it is not a whole tree.
func ReadArchive(ctx context.Context, r io.Reader, dest string, maxBytes int64) (*Manifest, error) {
	return readArchive(ctx, r, dest, "", nil, maxBytes)
}

// readArchive reads a whole archive into dest or, when base is not nil,
// a diff against base whose disk applies to the tree at diskRoot (and
// whose memory image goes into dest).
func readArchive(ctx context.Context, r io.Reader, dest, diskRoot string, base *Base, maxBytes int64) (*Manifest, error) {
	zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading archive: %w", err)
	}
	defer zr.Close()
	d, err := archive.OpenDir(dest)
	if err != nil {
		return nil, fmt.Errorf("reading archive: %w", err)
	}
	defer d.Close()
	ar := &archiveReader{tr: tar.NewReader(zr), d: d, kinds: map[string]byte{".": tar.TypeDir}, left: maxBytes, base: base}
	if base != nil {
		if ar.disk, err = archive.OpenDir(diskRoot); err != nil {
			return nil, fmt.Errorf("reading archive: %w", err)
		}
		defer ar.disk.Close()
	}
	m, err := ar.read(ctx)
	if err != nil {
		return nil, err
	}
	// The tar ends before the zstd frame does: read the frame to its end,
	// where the decoder checks the frame's checksum (XXH64 of everything
	// decompressed). The tar's padding and headers' unused bytes are in
	// no checksum of ours, so without this an archive with such a byte
	// changed was taken. Nothing may follow the tar but zeros.
	rest, err := io.Copy(nonZero{}, io.LimitReader(zr, 1<<20))
	switch {
	case err != nil:
		return nil, damaged(err)
	case rest == 1<<20:
		return nil, archiveErr("data after the archive")
	}
	return m, nil
}

// nonZero takes what follows an archive's tar, which may only be zeros
// (the end of the tar).
type nonZero struct{}

func (nonZero) Write(p []byte) (int, error) {
	for _, b := range p {
		if b != 0 {
			return 0, archiveErr("data after the archive")
		}
	}
	return len(p), nil
}

type archiveReader struct {
	tr *tar.Reader
	// d is the destination: every entry is made relative to its
	// directory's descriptor, never by a host path, whose length would
	// add the data dir's to the sandbox's own.
	d     *archive.Dir
	kinds map[string]byte // name -> type of every entry unpacked so far
	sums  bytes.Buffer
	dirs  []*tar.Header // directories, to set their times once filled
	left  int64         // bytes its files may still hold; no limit if 0 at the start
	// For a diff: the base it must name, and the tree its disk entries
	// apply to (every other entry goes under d).
	base *Base
	disk *archive.Dir
}

// at is the directory entry name is made in and its name there: under
// d, or for a diff's disk entry, in the tree the diff applies to ("."
// for the disk itself).
func (ar *archiveReader) at(name string) (*archive.Dir, string) {
	if ar.disk != nil {
		if name == DiskEntry {
			return ar.disk, "."
		}
		if rest, ok := strings.CutPrefix(name, DiskEntry+"/"); ok {
			return ar.disk, rest
		}
	}
	return ar.d, name
}

// damaged turns a read error of the stream into an archive error.
func damaged(err error) error {
	var ae *api.Error
	if errors.As(err, &ae) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return err // our own disk, not the archive
	}
	return archiveErr("damaged or cut short: %v", err)
}

func (ar *archiveReader) read(ctx context.Context) (*Manifest, error) {
	h, err := ar.tr.Next()
	if err != nil {
		return nil, damaged(err)
	}
	if h.Name != ManifestEntry || h.Typeflag != tar.TypeReg || h.Size > maxManifest {
		return nil, archiveErr("the first entry is %q, not the manifest", h.Name)
	}
	body, sum, err := ar.readSmall(h)
	if err != nil {
		return nil, err
	}
	ar.sums.WriteString(sumLine(h, sum))
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, archiveErr("manifest: %v", err)
	}
	switch {
	case ar.base == nil && m.Base != nil:
		return nil, archiveErr("a checkpoint's diff against template %s, not a whole archive", m.Base.Name)
	case ar.base == nil && m.Format != ManifestFormat:
		return nil, archiveErr("manifest format %d; this loam reads %d", m.Format, ManifestFormat)
	case ar.base != nil && (m.Format != DiffFormat || m.Base == nil || *m.Base != *ar.base):
		return nil, archiveErr("not a diff against %s (%s)", ar.base.Name, ar.base.Digest)
	}
	m.Snapshot = ""
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h, err := ar.tr.Next()
		if err != nil {
			return nil, damaged(err)
		}
		if h.Name == SumsEntry {
			return &m, ar.finish(h)
		}
		if h.Name == RemovedEntry && ar.base != nil {
			if err := ar.removals(h); err != nil {
				return nil, err
			}
			continue
		}
		if err := ar.entry(h, m.Memory); err != nil {
			return nil, err
		}
	}
}

// readSmall reads a small entry whole, with its checksum.
func (ar *archiveReader) readSmall(h *tar.Header) ([]byte, string, error) {
	body, err := io.ReadAll(ar.tr)
	if err != nil {
		return nil, "", damaged(err)
	}
	sum := sha256.Sum256(body)
	return body, hex.EncodeToString(sum[:]), nil
}

// finish checks the checksums entry and that nothing follows it.
func (ar *archiveReader) finish(h *tar.Header) error {
	if h.Typeflag != tar.TypeReg || h.Size > maxSums {
		return archiveErr("bad %s entry", SumsEntry)
	}
	body, _, err := ar.readSmall(h)
	if err != nil {
		return err
	}
	if !bytes.Equal(body, ar.sums.Bytes()) {
		return archiveErr("checksums do not match the content")
	}
	if _, ok := ar.kinds[DiskEntry]; !ok {
		return archiveErr("no disk")
	}
	if _, ok := ar.kinds[RemovedEntry]; ar.base != nil && !ok {
		return archiveErr("a diff without its %s entry", RemovedEntry)
	}
	if _, err := ar.tr.Next(); err != io.EOF {
		if err == nil {
			return archiveErr("entries after %s", SumsEntry)
		}
		return damaged(err)
	}
	for i := len(ar.dirs) - 1; i >= 0; i-- {
		d := ar.dirs[i]
		_ = ar.chtimes(strings.TrimSuffix(d.Name, "/"), d.ModTime)
	}
	return nil
}

// checkName refuses a name that is not a clean relative path under disk/
// or (for a memory template) mem/, or that was seen before.
func (ar *archiveReader) checkName(h *tar.Header, memory bool) (string, error) {
	name := strings.TrimSuffix(h.Name, "/")
	switch {
	case name == "" || len(name) > maxName || strings.ContainsRune(name, 0):
		return "", archiveErr("bad entry name %q", h.Name)
	case strings.HasPrefix(name, "/"):
		return "", archiveErr("absolute path %q", h.Name)
	case path.Clean(name) != name || slicesContains(strings.Split(name, "/"), ".."):
		return "", archiveErr("path %q is not clean (.. or .)", h.Name)
	}
	if strings.Count(name, "/") > maxDepth {
		// Deeper than the disk's own walks go: the import could not copy it.
		return "", archiveErr("entry %q…: deeper than %d directories", name[:64], maxDepth)
	}
	top, _, _ := strings.Cut(name, "/")
	if top != DiskEntry && (top != MemEntry || !memory) {
		return "", archiveErr("unexpected entry %q", h.Name)
	}
	if _, ok := ar.kinds[RemovedEntry]; ok && top == DiskEntry {
		return "", archiveErr("disk entry %q after the %s entry", h.Name, RemovedEntry)
	}
	if _, ok := ar.kinds[name]; ok {
		return "", archiveErr("entry %q appears twice", h.Name)
	}
	if ar.kinds[path.Dir(name)] != tar.TypeDir {
		return "", archiveErr("entry %q is not in a directory of the archive", h.Name)
	}
	return name, nil
}

func slicesContains(s []string, v string) bool {
	for _, e := range s {
		if e == v {
			return true
		}
	}
	return false
}

// entry checks one entry and unpacks it.
func (ar *archiveReader) entry(h *tar.Header, memory bool) error {
	name, err := ar.checkName(h, memory)
	if err != nil {
		return err
	}
	top, _, _ := strings.Cut(name, "/")
	if top == MemEntry && h.Typeflag != tar.TypeDir && h.Typeflag != tar.TypeReg {
		return archiveErr("memory image entry %q is not a file", h.Name)
	}
	if h.Mode&^0o7777 != 0 || h.Uid < 0 || h.Gid < 0 || h.Size < 0 {
		return archiveErr("entry %q: bad mode, owner or size", h.Name)
	}
	mode := uint32(h.Mode)
	sum := ""
	d, at := ar.at(name)
	if at == "." {
		// A diff's disk itself: the tree it applies to, kept.
		if h.Typeflag != tar.TypeDir {
			return archiveErr("entry %q is not a directory", h.Name)
		}
		ar.kinds[name] = tar.TypeDir
		ar.sums.WriteString(sumLine(h, ""))
		ar.dirs = append(ar.dirs, h)
		return ar.rootMeta(h)
	}
	if d == ar.disk {
		if err := ar.replace(d, at, h); err != nil {
			return err
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if err := d.Mkdir(at, 0o700); err != nil {
			return ar.unpackErr(h, err)
		}
		ar.dirs = append(ar.dirs, h)
	case tar.TypeReg:
		if ar.left != 0 {
			if ar.left -= h.Size; ar.left <= 0 {
				return archiveErr("its files are larger than the space there is for them")
			}
		}
		if sum, err = ar.file(d, at, h); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := checkSymlink(name, h.Linkname); err != nil {
			return err
		}
		if err := d.Symlink(h.Linkname, at); err != nil {
			return ar.unpackErr(h, err)
		}
	case tar.TypeLink:
		if h.Linkname == name || ar.kinds[h.Linkname] != tar.TypeReg {
			return archiveErr("hard link %q to %q, which is not an earlier file", h.Name, h.Linkname)
		}
		od, old := ar.at(h.Linkname)
		if od != d {
			return archiveErr("hard link %q to %q, outside its tree", h.Name, h.Linkname)
		}
		if err := d.Link(old, at); err != nil {
			return ar.unpackErr(h, err)
		}
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		kind := uint32(unix.S_IFIFO)
		if h.Typeflag == tar.TypeChar {
			kind = unix.S_IFCHR
		} else if h.Typeflag == tar.TypeBlock {
			kind = unix.S_IFBLK
		}
		if err := d.Mknod(at, kind|0o600, int(unix.Mkdev(uint32(h.Devmajor), uint32(h.Devminor)))); err != nil {
			return ar.unpackErr(h, err)
		}
	default:
		return archiveErr("entry %q has an unsupported type %q", h.Name, h.Typeflag)
	}
	kind := h.Typeflag
	if kind == tar.TypeLink {
		kind = tar.TypeReg // a link is a file too: a later link may name it
	}
	ar.kinds[name] = kind
	ar.sums.WriteString(sumLine(h, sum))
	if h.Typeflag == tar.TypeLink {
		return nil // shares the first name's owner and mode
	}
	if err := d.Lchown(at, h.Uid, h.Gid); err != nil {
		return ar.unpackErr(h, err)
	}
	if h.Typeflag != tar.TypeSymlink {
		// After chown, which clears set-id bits.
		if err := d.Chmod(at, fileMode(mode)); err != nil && !errors.Is(err, unix.EINVAL) {
			return ar.unpackErr(h, err)
		} else if err != nil {
			// A device or fifo, which Chmod does not open.
			if err := chmodNode(d, at, mode); err != nil {
				return ar.unpackErr(h, err)
			}
		}
	}
	return nil
}

// unpackErr describes the failure to make entry h: a name the file system
// refuses (a component longer than it takes) is the archive's, an invalid
// request naming the entry; anything else is this host's.
func (ar *archiveReader) unpackErr(h *tar.Header, err error) error {
	if errors.Is(err, unix.ENAMETOOLONG) {
		return archiveErr("entry %q: its name is too long for this file system", h.Name)
	}
	return fmt.Errorf("unpacking %s: %w", h.Name, err)
}

// chmodNode sets the mode of a device or fifo the archive made, which is
// never opened: by name, in its directory, which the archive made too and
// no one else writes meanwhile.
func chmodNode(d *archive.Dir, name string, mode uint32) error {
	st, err := d.Lstat(name)
	if err != nil {
		return err
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFCHR && t != unix.S_IFBLK && t != unix.S_IFIFO {
		return fmt.Errorf("%s changed type: %w", name, unix.EINVAL)
	}
	fd, err := d.OpenDirAt(path.Dir(name))
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fchmodat(fd, path.Base(name), mode, 0)
}

// fileMode turns permission, set-id and sticky bits into an fs.FileMode.
func fileMode(m uint32) fs.FileMode {
	fm := fs.FileMode(m & 0o777)
	if m&unix.S_ISUID != 0 {
		fm |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		fm |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

// file writes a regular file's content, never through an existing name.
func (ar *archiveReader) file(d *archive.Dir, name string, h *tar.Header) (string, error) {
	f, err := d.CreateFile(name, 0o600)
	if err != nil {
		return "", ar.unpackErr(h, err)
	}
	sum := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, sum), ar.tr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", damaged(err)
	}
	if err := d.Chtimes(name, h.ModTime); err != nil {
		return "", ar.unpackErr(h, err)
	}
	return hex.EncodeToString(sum.Sum(nil)), nil
}

// checkSymlink refuses a symlink target that no file system takes. Any
// target, absolute or relative, is resolved inside the sandbox's own root,
// as in any root filesystem (/etc/localtime), so it stays in.
func checkSymlink(name, target string) error {
	if target == "" || len(target) > maxName || strings.ContainsRune(target, 0) {
		return archiveErr("symlink %q has a bad target", name)
	}
	if strings.HasPrefix(target, "/") {
		return nil
	}
	// A relative target that climbs past the disk's root (../../../etc
	// from two levels down) stays at it, as ".." at / does in Linux: the
	// target is only stored, and resolved inside the sandbox; the host
	// never goes through it (every entry's parent is a directory of the
	// archive).
	return nil
}
