package disk

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/internal/testenv"
)

// capNetRaw is a security.capability value granting cap_net_raw, as ping
// has it (VFS_CAP_REVISION_2, effective).
var capNetRaw = []byte{0x01, 0, 0, 0x02, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// sparseSize is the size of the rich tree's sparse file.
const sparseSize = 16 << 20

// stamp is the time the rich tree's entries are given, so that a copy
// that does not keep times shows.
var stamp = time.Date(2001, 2, 3, 4, 5, 6, 789, time.UTC)

// richTree makes a tree with every kind of entry copyTree must keep, and
// returns its root. Only root can make some of them: devices, owners,
// security.capability.
func richTree(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	mustOK(t, os.Mkdir(src, 0o755))
	p := func(rel string) string { return filepath.Join(src, rel) }
	for _, d := range []string{"bin", "etc", "empty", "tmp", "home/u", "deep/a/b/c"} {
		mustOK(t, os.MkdirAll(p(d), 0o755))
	}
	write(t, p("etc/hostname"), "loam\n", 0o644)
	write(t, p("bin/ping"), "#!ping\n", 0o755)
	write(t, p("bin/su"), "#!su\n", 0o4755)
	write(t, p("bin/wall"), "#!wall\n", 0o2755)
	write(t, p("etc/shadow"), "root:*:\n", 0o640)
	write(t, p("etc/locked"), "nobody may read this\n", 0)
	write(t, p("deep/a/b/c/leaf"), "leaf\n", 0o644)
	mustOK(t, unix.Chmod(p("tmp"), 0o1777))
	mustOK(t, unix.Chmod(p("home/u"), 0o2750))
	mustOK(t, unix.Chmod(p("empty"), 0o500))

	big := make([]byte, 3<<20+17) // not a multiple of any block or buffer size
	_, _ = rand.Read(big)
	mustOK(t, os.WriteFile(p("big"), big, 0o644))
	// Sparse: 16 MiB with 4 kB of data in the middle.
	f, err := os.Create(p("sparse"))
	mustOK(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte("s"), 4096), sparseSize/2)
	mustOK(t, err)
	mustOK(t, f.Truncate(sparseSize))
	mustOK(t, f.Close())

	mustOK(t, os.Link(p("bin/ping"), p("bin/ping-link")))
	mustOK(t, os.Link(p("bin/ping"), p("deep/a/ping-elsewhere")))
	mustOK(t, os.Symlink("/etc/passwd", p("abs-link")))
	mustOK(t, os.Symlink("../etc/hostname", p("bin/rel-link")))
	mustOK(t, os.Symlink("nowhere/at/all", p("dangling")))
	mustOK(t, os.Symlink("/", p("root-link"))) // a directory, if it were followed
	mustOK(t, os.Link(p("dangling"), p("dangling-link")))
	mustOK(t, unix.Mkfifo(p("fifo"), 0))
	mustOK(t, unix.Mknod(p("null"), unix.S_IFCHR, int(unix.Mkdev(1, 3))))
	mustOK(t, unix.Mknod(p("loop"), unix.S_IFBLK, int(unix.Mkdev(7, 200))))
	l, err := net.Listen("unix", p("sock"))
	mustOK(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	mustOK(t, l.Close())

	mustOK(t, unix.Setxattr(p("bin/ping"), "security.capability", capNetRaw, 0))
	mustOK(t, unix.Setxattr(p("etc/hostname"), "user.origin", []byte("template"), 0))
	mustOK(t, unix.Setxattr(p("home"), "user.dir", []byte("a directory's"), 0))
	mustOK(t, unix.Setxattr(src, "user.root", []byte("the root's"), 0))

	mustOK(t, os.Chown(p("home/u"), 1000, 1000))
	mustOK(t, os.Chown(p("etc/shadow"), 0, 42))
	mustOK(t, os.Lchown(p("abs-link"), 7, 8))
	mustOK(t, os.Chown(p("fifo"), 9, 10))
	// Modes after owners, since chown clears setuid bits; and not at
	// creation, where the umask applies.
	for rel, mode := range map[string]uint32{"home/u": 0o2750, "fifo": 0o620, "null": 0o666, "loop": 0o660} {
		mustOK(t, unix.Chmod(p(rel), mode))
	}

	// Times last, deepest first, since making entries changes their
	// directories' times.
	var paths []string
	mustOK(t, filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		paths = append(paths, path)
		return err
	}))
	slices.Reverse(paths)
	for i, path := range paths {
		ts := unix.NsecToTimespec(stamp.Add(time.Duration(i) * time.Hour).UnixNano())
		mustOK(t, unix.UtimesNanoAt(unix.AT_FDCWD, path, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
	}
	return src
}

// TestCopyTree copies the rich tree and checks each kind of entry.
func TestCopyTree(t *testing.T) {
	testenv.Root(t)
	src := richTree(t)
	dst := t.TempDir()
	mustOK(t, copyTree(t.Context(), src, dst))

	q := func(rel string) string { return filepath.Join(dst, rel) }
	// Everything is there and the same, as far as a manifest can say.
	if want, got := manifest(t, src), manifest(t, dst); !slices.Equal(got, want) {
		t.Errorf("copy differs from the source:\n%s", diffLines(want, got))
	}

	tests := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"contents", func(t *testing.T) {
			for _, rel := range []string{"big", "etc/hostname", "deep/a/b/c/leaf", "etc/locked"} {
				if !bytes.Equal(readAll(t, filepath.Join(src, rel)), readAll(t, q(rel))) {
					t.Errorf("%s differs", rel)
				}
			}
		}},
		{"sparse file stays sparse", func(t *testing.T) {
			st := lstatOf(t, q("sparse"))
			if st.Size != sparseSize {
				t.Errorf("size %d, want %d", st.Size, sparseSize)
			}
			if st.Blocks*512 > sparseSize/4 {
				t.Errorf("takes %d bytes on disk for 4 kB of data", st.Blocks*512)
			}
			f, err := os.Open(q("sparse"))
			mustOK(t, err)
			defer f.Close()
			buf := make([]byte, 8192)
			_, err = f.ReadAt(buf, sparseSize/2-4096)
			mustOK(t, err)
			if want := append(make([]byte, 4096), bytes.Repeat([]byte("s"), 4096)...); !bytes.Equal(buf, want) {
				t.Error("data around the sparse file's middle differs")
			}
		}},
		{"symlinks are links", func(t *testing.T) {
			for rel, want := range map[string]string{
				"abs-link": "/etc/passwd", "bin/rel-link": "../etc/hostname",
				"dangling": "nowhere/at/all", "root-link": "/",
			} {
				if got, err := os.Readlink(q(rel)); err != nil || got != want {
					t.Errorf("%s -> %q, %v; want a link to %q", rel, got, err, want)
				}
			}
		}},
		{"hard links", func(t *testing.T) {
			ino := lstatOf(t, q("bin/ping")).Ino
			for _, rel := range []string{"bin/ping-link", "deep/a/ping-elsewhere"} {
				if got := lstatOf(t, q(rel)).Ino; got != ino {
					t.Errorf("%s is inode %d, bin/ping %d; want one file", rel, got, ino)
				}
			}
			if a, b := lstatOf(t, q("dangling")).Ino, lstatOf(t, q("dangling-link")).Ino; a != b {
				t.Errorf("hard-linked symlinks are inodes %d and %d", a, b)
			}
			if n := lstatOf(t, q("bin/ping")).Nlink; n != 3 {
				t.Errorf("bin/ping has %d links, want 3", n)
			}
		}},
		{"special files", func(t *testing.T) {
			for rel, want := range map[string]uint32{
				"fifo": unix.S_IFIFO | 0o620, "null": unix.S_IFCHR | 0o666,
				"loop": unix.S_IFBLK | 0o660, "sock": unix.S_IFSOCK,
			} {
				st := lstatOf(t, q(rel))
				if mask := uint32(unix.S_IFMT | 0o7777); rel == "sock" {
					if st.Mode&unix.S_IFMT != want {
						t.Errorf("%s: mode %#o, want a socket", rel, st.Mode)
					}
				} else if st.Mode&mask != want {
					t.Errorf("%s: mode %#o, want %#o", rel, st.Mode&mask, want)
				}
			}
			if st := lstatOf(t, q("null")); st.Rdev != unix.Mkdev(1, 3) {
				t.Errorf("null: device %#x, want 1:3", st.Rdev)
			}
			if st := lstatOf(t, q("loop")); st.Rdev != unix.Mkdev(7, 200) {
				t.Errorf("loop: device %#x, want 7:200", st.Rdev)
			}
		}},
		{"modes", func(t *testing.T) {
			for rel, want := range map[string]uint32{
				"bin/su": 0o4755, "bin/wall": 0o2755, "tmp": 0o1777, "home/u": 0o2750,
				"etc/locked": 0, "empty": 0o500, "etc/shadow": 0o640, ".": 0o755,
			} {
				if got := lstatOf(t, q(rel)).Mode & 0o7777; got != want {
					t.Errorf("%s: mode %#o, want %#o", rel, got, want)
				}
			}
		}},
		{"owners", func(t *testing.T) {
			for rel, want := range map[string][2]uint32{
				"home/u": {1000, 1000}, "etc/shadow": {0, 42}, "abs-link": {7, 8}, "fifo": {9, 10},
			} {
				if st := lstatOf(t, q(rel)); st.Uid != want[0] || st.Gid != want[1] {
					t.Errorf("%s: owner %d:%d, want %d:%d", rel, st.Uid, st.Gid, want[0], want[1])
				}
			}
		}},
		{"times", func(t *testing.T) {
			for _, rel := range []string{".", "home", "deep/a/b", "big", "abs-link", "fifo", "empty"} {
				want, got := lstatOf(t, filepath.Join(src, rel)).Mtim, lstatOf(t, q(rel)).Mtim
				if got != want {
					t.Errorf("%s: mtime %v, want %v", rel, time.Unix(got.Unix()), time.Unix(want.Unix()))
				}
			}
		}},
		{"xattrs", func(t *testing.T) {
			for _, x := range []struct{ rel, name, want string }{
				{"bin/ping", "security.capability", string(capNetRaw)},
				{"etc/hostname", "user.origin", "template"},
				{"home", "user.dir", "a directory's"},
				{".", "user.root", "the root's"},
			} {
				buf := make([]byte, 256)
				n, err := unix.Lgetxattr(q(x.rel), x.name, buf)
				if err != nil || string(buf[:n]) != x.want {
					t.Errorf("%s: %s = %q, %v; want %q", x.rel, x.name, buf[:max(n, 0)], err, x.want)
				}
			}
		}},
		{"empty directory", func(t *testing.T) {
			entries, err := os.ReadDir(q("empty"))
			if err != nil || len(entries) != 0 {
				t.Errorf("empty: %d entries, %v; want an empty directory", len(entries), err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.check)
	}
}

// TestCopyTreeLikeCp holds copyTree to what `cp -a` made, on the same tree.
func TestCopyTreeLikeCp(t *testing.T) {
	testenv.Root(t)
	if _, err := exec.LookPath("cp"); err != nil {
		t.Skip("no cp to compare with")
	}
	src := richTree(t)
	ours, theirs := t.TempDir(), t.TempDir()
	mustOK(t, copyTree(t.Context(), src, ours))
	if out, err := exec.Command("cp", "-a", "--", src+"/.", theirs+"/").CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	if want, got := manifest(t, theirs), manifest(t, ours); !slices.Equal(got, want) {
		t.Errorf("copyTree and cp -a differ:\n%s", diffLines(want, got))
	}
}

// TestCopyTreeLiveChanges changes the source the moment before the copy
// reaches an entry, as a running sandbox could.
func TestCopyTreeLiveChanges(t *testing.T) {
	testenv.Root(t)
	outside := t.TempDir()
	write(t, filepath.Join(outside, "secret"), "host secret\n", 0o600)
	tests := []struct {
		name    string
		at      string // the entry before which the source changes
		change  func(t *testing.T, src string)
		wantErr error // nil: the copy succeeds
		gone    []string
	}{
		{"file deleted", "a", func(t *testing.T, src string) {
			mustOK(t, os.Remove(filepath.Join(src, "b")))
		}, nil, []string{"b"}},
		{"directory deleted", "a", func(t *testing.T, src string) {
			mustOK(t, os.RemoveAll(filepath.Join(src, "d")))
		}, nil, []string{"d"}},
		{"file deleted from a directory being copied", "d/x", func(t *testing.T, src string) {
			mustOK(t, os.Remove(filepath.Join(src, "d/y")))
		}, nil, []string{"d/y"}},
		{"file swapped for a link", "b", func(t *testing.T, src string) {
			mustOK(t, os.Remove(filepath.Join(src, "b")))
			mustOK(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(src, "b")))
		}, errChanged, nil},
		{"file swapped for a fifo", "b", func(t *testing.T, src string) {
			mustOK(t, os.Remove(filepath.Join(src, "b")))
			mustOK(t, unix.Mkfifo(filepath.Join(src, "b"), 0o644))
		}, errChanged, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := t.TempDir()
			write(t, filepath.Join(src, "a"), "a\n", 0o644)
			write(t, filepath.Join(src, "b"), "b\n", 0o644)
			mustOK(t, os.Mkdir(filepath.Join(src, "d"), 0o755))
			write(t, filepath.Join(src, "d/x"), "x\n", 0o644)
			write(t, filepath.Join(src, "d/y"), "y\n", 0o644)
			dst := t.TempDir()
			err := copyMeddled(t, src, dst, tt.at, func() { tt.change(t, src) })
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("copy: %v, want %v", err, tt.wantErr)
				}
				t.Logf("copy failed as it should: %v", err)
			} else if err != nil {
				t.Fatalf("copy: %v", err)
			}
			for _, rel := range tt.gone {
				if _, err := os.Lstat(filepath.Join(dst, rel)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s: %v, want it left out", rel, err)
				}
			}
			if tt.wantErr == nil {
				if got := readAll(t, filepath.Join(dst, "a")); string(got) != "a\n" {
					t.Errorf("a = %q after the change", got)
				}
			}
			if strings.Contains(manifestString(t, dst), "host secret") {
				t.Error("the copy holds the file outside")
			}
		})
	}
}

// TestCopyTreeFails: every failure but a deleted entry fails the copy.
func TestCopyTreeFails(t *testing.T) {
	testenv.Root(t)
	tests := []struct {
		name  string
		setup func(t *testing.T, src, dst string) context.Context
		want  error // nil: any error
	}{
		{"target exists", func(t *testing.T, src, dst string) context.Context {
			write(t, filepath.Join(dst, "b"), "in the way\n", 0o644)
			return t.Context()
		}, fs.ErrExist},
		{"target directory exists", func(t *testing.T, src, dst string) context.Context {
			write(t, filepath.Join(dst, "d"), "in the way\n", 0o644)
			return t.Context()
		}, fs.ErrExist},
		{"attribute cannot be set", func(t *testing.T, src, dst string) context.Context {
			// An attribute the target filesystem cannot hold: ramfs
			// takes no trusted.* attributes.
			mustOK(t, unix.Setxattr(filepath.Join(src, "b"), "trusted.x", []byte("1"), 0))
			mountFS(t, dst, "ramfs")
			return t.Context()
		}, unix.EOPNOTSUPP},
		{"source root is a link", func(t *testing.T, src, dst string) context.Context {
			real := filepath.Join(t.TempDir(), "real")
			mustOK(t, os.Rename(src, real))
			mustOK(t, os.Symlink(real, src))
			return t.Context()
		}, unix.ENOTDIR}, // what O_DIRECTORY|O_NOFOLLOW makes of a symlink
		{"cancelled", func(t *testing.T, src, dst string) context.Context {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			return ctx
		}, context.Canceled},
		{"too deep", func(t *testing.T, src, dst string) context.Context {
			fd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			mustOK(t, err)
			for range maxDepth + 1 {
				mustOK(t, unix.Mkdirat(fd, "n", 0o755))
				next, err := unix.Openat(fd, "n", unix.O_RDONLY|unix.O_DIRECTORY, 0)
				mustOK(t, err)
				unix.Close(fd)
				fd = next
			}
			unix.Close(fd)
			return t.Context()
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "src")
			mustOK(t, os.Mkdir(src, 0o755))
			write(t, filepath.Join(src, "b"), "b\n", 0o644)
			mustOK(t, os.Mkdir(filepath.Join(src, "d"), 0o755))
			dst := t.TempDir()
			ctx := tt.setup(t, src, dst)
			err := copyTree(ctx, src, dst)
			if err == nil {
				t.Fatal("copy succeeded")
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("copy: %v, want %v", err, tt.want)
			}
			if msg := err.Error(); len(msg) < 400 {
				t.Log(msg)
			}
		})
	}
}

// meddler is a visitor that calls change just before the walk hands it
// the entry at path at.
type meddler struct {
	inner  visitor
	at     string
	change func()
}

func (m *meddler) entry(ctx context.Context, d *dir, name string, st *unix.Stat_t) error {
	if d.join(name) == m.at {
		m.change()
	}
	return m.inner.entry(ctx, d, name, st)
}

func (m *meddler) enter(ctx context.Context, d *dir, name string, sub *dir) (visitor, func(error) error, error) {
	child, leave, err := m.inner.enter(ctx, d, name, sub)
	if err != nil {
		return nil, nil, err
	}
	return &meddler{inner: child, at: m.at, change: m.change}, leave, nil
}

// copyMeddled is copyTree with a meddler in the walk.
func copyMeddled(t *testing.T, src, dst, at string, change func()) error {
	t.Helper()
	root, err := openRoot(src)
	mustOK(t, err)
	defer root.close()
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	mustOK(t, err)
	defer unix.Close(dfd)
	c := &treeCopier{dstRoot: dfd, links: make(map[fileID]string)}
	return walk(t.Context(), root, &meddler{inner: &copyDir{c: c, fd: dfd, rel: "."}, at: at, change: change}, walkOptions{})
}

// manifest describes every entry under root, one line each, sorted: type,
// mode, owner, size, device, mtime, link target or content hash, xattrs,
// and which entries are one file.
func manifest(t *testing.T, root string) []string {
	t.Helper()
	var lines []string
	inodes := map[uint64]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		st := lstatOf(t, path)
		line := fmt.Sprintf("%s %#o %d:%d", rel, st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			line += fmt.Sprintf(" size=%d %q", st.Size, shortHash(readAll(t, path)))
		case unix.S_IFLNK:
			target, err := os.Readlink(path)
			mustOK(t, err)
			line += " -> " + target
		case unix.S_IFCHR, unix.S_IFBLK:
			line += fmt.Sprintf(" dev=%#x", st.Rdev)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if first, ok := inodes[st.Ino]; ok {
				line += " same-as=" + first
			} else {
				inodes[st.Ino] = rel
			}
		}
		line += fmt.Sprintf(" mtime=%d.%09d", st.Mtim.Sec, st.Mtim.Nsec)
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			line += xattrString(t, path)
		}
		lines = append(lines, line)
		return nil
	})
	mustOK(t, err)
	slices.Sort(lines)
	return lines
}

func manifestString(t *testing.T, root string) string {
	var b strings.Builder
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			b.Write(readAll(t, path))
		}
		return err
	})
	mustOK(t, err)
	return b.String()
}

func xattrString(t *testing.T, path string) string {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(path, buf)
	if errors.Is(err, unix.ENOTSUP) {
		return ""
	}
	mustOK(t, err)
	var names []string
	for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
		if name != "" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var b strings.Builder
	for _, name := range names {
		val := make([]byte, 4096)
		m, err := unix.Lgetxattr(path, name, val)
		mustOK(t, err)
		fmt.Fprintf(&b, " %s=%q", name, val[:m])
	}
	return b.String()
}

func shortHash(data []byte) string {
	if len(data) <= 32 {
		return string(data)
	}
	var h uint64 = 14695981039346656037 // FNV-1a: enough to tell contents apart
	for _, c := range data {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return fmt.Sprintf("fnv:%x", h)
}

// diffLines lists the lines only in want (-) and only in got (+).
func diffLines(want, got []string) string {
	var b strings.Builder
	for _, l := range want {
		if !slices.Contains(got, l) {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

// mountFS mounts a fresh filesystem of type fstype on dir until the test
// ends.
func mountFS(t *testing.T, dir, fstype string) {
	t.Helper()
	if err := unix.Mount("none", dir, fstype, 0, ""); err != nil {
		t.Skipf("cannot mount %s: %v", fstype, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
}

func lstatOf(t *testing.T, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	mustOK(t, unix.Lstat(path, &st))
	return st
}

func readAll(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	mustOK(t, err)
	return data
}

// write writes a file with mode, which may have setuid bits (which
// os.FileMode keeps elsewhere).
func write(t *testing.T, path, content string, mode uint32) {
	t.Helper()
	mustOK(t, os.WriteFile(path, []byte(content), 0o600))
	mustOK(t, unix.Chmod(path, mode)) // not at creation: the umask applies there
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkCopyTree copies a generated tree shaped like a small root
// filesystem (4,000 files in 200 directories, mostly small, a tenth of them
// symlinks, about 160 MB) with copyTree, and with `cp -a` for comparison.
func BenchmarkCopyTree(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	src := filepath.Join(b.TempDir(), "src")
	size := genTree(b, src, 200, 4000)
	copiers := []struct {
		name string
		copy func(ctx context.Context, src, dst string) error
	}{
		{"copyTree", copyTree},
		{"cp-a", func(ctx context.Context, src, dst string) error {
			_, err := run(ctx, "cp", "-a", "--reflink=auto", "--", src+"/.", dst+"/")
			return err
		}},
	}
	for _, c := range copiers {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(size)
			dst := filepath.Join(b.TempDir(), "dst")
			for b.Loop() {
				b.StopTimer()
				if err := os.RemoveAll(dst); err != nil {
					b.Fatal(err)
				}
				if err := os.Mkdir(dst, 0o755); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := c.copy(b.Context(), src, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// genTree makes a tree of files in dirs directories under root, the same
// every time, and returns the size of its files.
func genTree(b *testing.B, root string, dirs, files int) int64 {
	b.Helper()
	rng := mrand.New(mrand.NewPCG(1, 2))
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	var total int64
	for i := range dirs {
		if err := os.MkdirAll(filepath.Join(root, fmt.Sprintf("d%d/s%d", i%20, i)), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	for i := range files {
		dir := filepath.Join(root, fmt.Sprintf("d%d/s%d", i%dirs%20, i%dirs))
		name := filepath.Join(dir, fmt.Sprint("f", i))
		if i%10 == 9 {
			if err := os.Symlink(fmt.Sprint("f", i-1), name); err != nil {
				b.Fatal(err)
			}
			continue
		}
		var size int
		switch r := rng.IntN(100); {
		case r < 70:
			size = 1<<10 + rng.IntN(7<<10)
		case r < 95:
			size = 8<<10 + rng.IntN(56<<10)
		default:
			size = 256<<10 + rng.IntN(768<<10)
		}
		if err := os.WriteFile(name, data[:size], 0o644); err != nil {
			b.Fatal(err)
		}
		total += int64(size)
	}
	return total
}
