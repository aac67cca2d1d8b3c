package checkpoint

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/archive/archivetest"
)

// makeDisk makes a small tree with the kinds of entries a root filesystem has.
func makeDisk(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"etc", "bin", "home/loam"} {
		must(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	must(t, os.WriteFile(filepath.Join(dir, "etc/hostname"), []byte("loam\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "bin/tool"), bytes.Repeat([]byte("x"), 100000), 0o755))
	must(t, unix.Chmod(filepath.Join(dir, "bin/tool"), 0o4755))
	must(t, os.Link(filepath.Join(dir, "bin/tool"), filepath.Join(dir, "bin/tool2")))
	must(t, os.Symlink("/usr/share/zoneinfo/UTC", filepath.Join(dir, "etc/localtime")))
	must(t, os.Symlink("../etc/hostname", filepath.Join(dir, "bin/name")))
	must(t, unix.Mkfifo(filepath.Join(dir, "home/fifo"), 0o600))
	if os.Geteuid() == 0 {
		must(t, os.Chown(filepath.Join(dir, "home/loam"), 1000, 1000))
	}
	return dir
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestArchiveRoundTrip(t *testing.T) {
	disk := makeDisk(t)
	mem := t.TempDir()
	must(t, os.WriteFile(filepath.Join(mem, "pages.img"), bytes.Repeat([]byte{1, 2, 3}, 50000), 0o600))
	in := Manifest{Name: "warm", Template: "busybox", Resources: api.Resources{CPUs: 1, MemoryMiB: 256},
		AgentToken: "tok", From: "sb/v1", CreatedAt: time.Now().UTC().Truncate(time.Second), Snapshot: "local-only"}
	var buf bytes.Buffer
	must(t, WriteArchive(t.Context(), &buf, in, disk, mem))

	dest := t.TempDir()
	m, err := ReadArchive(t.Context(), bytes.NewReader(buf.Bytes()), dest, 0)
	must(t, err)
	if m.Snapshot != "" || !m.Memory || m.Name != "warm" || m.AgentToken != "tok" || m.Resources != in.Resources || !m.CreatedAt.Equal(in.CreatedAt) {
		t.Errorf("manifest = %+v, want %+v with memory and no snapshot", m, in)
	}
	got := filepath.Join(dest, DiskEntry)
	if b, _ := os.ReadFile(filepath.Join(got, "etc/hostname")); string(b) != "loam\n" {
		t.Errorf("etc/hostname = %q", b)
	}
	if st, err := os.Lstat(filepath.Join(got, "bin/tool")); err != nil || st.Mode()&os.ModeSetuid == 0 || st.Mode().Perm() != 0o755 || st.Size() != 100000 {
		t.Errorf("bin/tool: %v, %v; want setuid 0755, 100000 bytes", st, err)
	}
	var a, b unix.Stat_t
	must(t, unix.Lstat(filepath.Join(got, "bin/tool"), &a))
	must(t, unix.Lstat(filepath.Join(got, "bin/tool2"), &b))
	if a.Ino != b.Ino {
		t.Error("bin/tool2 is not a hard link of bin/tool any more")
	}
	for link, want := range map[string]string{"etc/localtime": "/usr/share/zoneinfo/UTC", "bin/name": "../etc/hostname"} {
		if target, err := os.Readlink(filepath.Join(got, link)); err != nil || target != want {
			t.Errorf("%s -> %q, %v; want %q", link, target, err, want)
		}
	}
	if st, err := os.Lstat(filepath.Join(got, "home/fifo")); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("home/fifo: %v, %v; want a fifo", st, err)
	}
	if os.Geteuid() == 0 {
		must(t, unix.Lstat(filepath.Join(got, "home/loam"), &a))
		if a.Uid != 1000 {
			t.Errorf("home/loam is owned by %d, want 1000", a.Uid)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dest, MemEntry, "pages.img")); len(b) != 150000 {
		t.Errorf("mem/pages.img has %d bytes, want 150000", len(b))
	}
}

// entry is one entry of a hand-made archive.
type entry struct {
	h    tar.Header
	body string
}

func dir(name string) entry {
	return entry{h: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}}
}
func file(name, body string) entry {
	return entry{h: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}, body: body}
}
func symlink(name, target string) entry {
	return entry{h: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}
func hardlink(name, target string) entry {
	return entry{h: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

// craft makes an archive of the manifest, entries and the right checksums
// (or sums when it is not ""), so that a refusal is for what the entries are.
func craft(t *testing.T, memory bool, entries []entry, sums string) []byte {
	t.Helper()
	return craftWith(t, Manifest{Format: ManifestFormat, Memory: memory}, entries, sums)
}

// craftWith is craft with manifest m.
func craftWith(t *testing.T, m Manifest, entries []entry, sums string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	must(t, err)
	tw := tar.NewWriter(zw)
	body, _ := json.Marshal(m)
	all := append([]entry{file(ManifestEntry, string(body))}, entries...)
	var lines strings.Builder
	for _, e := range all {
		h := e.h
		must(t, tw.WriteHeader(&h))
		_, err := tw.Write([]byte(e.body))
		must(t, err)
		sum := ""
		if h.Typeflag == tar.TypeReg {
			s := sha256.Sum256([]byte(e.body))
			sum = hex.EncodeToString(s[:])
		}
		lines.WriteString(sumLine(&h, sum))
	}
	if sums == "" {
		sums = lines.String()
	}
	e := file(SumsEntry, sums)
	must(t, tw.WriteHeader(&e.h))
	_, err = tw.Write([]byte(sums))
	must(t, err)
	must(t, tw.Close())
	must(t, zw.Close())
	return buf.Bytes()
}

// deepPath makes, beneath root, directories of 200-byte names until their
// path is at least n bytes long, and a file "f" holding body in the last;
// by descriptor, since the host path would pass PATH_MAX. It returns the
// path relative to root.
func deepPath(t *testing.T, root string, n int, body string) string {
	t.Helper()
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	var parts []string
	for i := 0; len(strings.Join(parts, "/")) < n; i++ {
		name := fmt.Sprintf("%03d%s", i, strings.Repeat("d", 197))
		must(t, unix.Mkdirat(fd, name, 0o755))
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(t, err)
		unix.Close(fd)
		fd, parts = next, append(parts, name)
	}
	defer unix.Close(fd)
	f, err := unix.Openat(fd, "f", unix.O_WRONLY|unix.O_CREAT, 0o644)
	must(t, err)
	_, err = unix.Write(f, []byte(body))
	must(t, err)
	unix.Close(f)
	return strings.Join(append(parts, "f"), "/")
}

// readDeep reads the file at rel beneath root by descriptor.
func readDeep(root, rel string) (string, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return "", err
	}
	parts := strings.Split(rel, "/")
	for _, p := range parts[:len(parts)-1] {
		next, err := unix.Openat(fd, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		unix.Close(fd)
		if err != nil {
			return "", err
		}
		fd = next
	}
	defer unix.Close(fd)
	f, err := unix.Openat(fd, parts[len(parts)-1], unix.O_RDONLY, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(f)
	buf := make([]byte, 100)
	k, err := unix.Read(f, buf)
	return string(buf[:max(k, 0)]), err
}

// TestArchiveRoundTripLinksAndLongPaths: what a sandbox may make exports
// and imports again (issue 20, item 6): a relative symlink climbing past
// the root (valid in Linux, where ".." at / stays there), a path just
// under PATH_MAX and one past it, which the host may only reach by
// descriptor (its own path adds the data dir's).
func TestArchiveRoundTripLinksAndLongPaths(t *testing.T) {
	disk := makeDisk(t)
	must(t, os.Symlink("../../../etc", filepath.Join(disk, "home/loam/up")))
	near := deepPath(t, disk, 4000, "near")
	must(t, os.Mkdir(filepath.Join(disk, "far"), 0o755))
	far := "far/" + deepPath(t, filepath.Join(disk, "far"), 6000, "far")
	var buf bytes.Buffer
	must(t, WriteArchive(t.Context(), &buf, Manifest{Name: "x"}, disk, ""))
	dest := t.TempDir()
	if _, err := ReadArchive(t.Context(), bytes.NewReader(buf.Bytes()), dest, 0); err != nil {
		t.Fatalf("importing its own export: %v", err)
	}
	got := filepath.Join(dest, DiskEntry)
	if target, err := os.Readlink(filepath.Join(got, "home/loam/up")); err != nil || target != "../../../etc" {
		t.Errorf("home/loam/up -> %q, %v", target, err)
	}
	for rel, want := range map[string]string{near: "near", far: "far"} {
		if b, err := readDeep(got, rel); err != nil || b != want {
			t.Errorf("%d-byte path: %q, %v; want %q", len(rel), b, err, want)
		}
	}
}

// deep is n nested directories under disk/.
func deep(n int) []entry {
	var es []entry
	name := "disk"
	for range n {
		name += "/d"
		es = append(es, dir(name))
	}
	return es
}

func TestArchiveRefusesDamage(t *testing.T) {
	var good bytes.Buffer
	must(t, WriteArchive(t.Context(), &good, Manifest{Name: "x"}, makeDisk(t), ""))
	flipped := bytes.Clone(good.Bytes())
	flipped[len(flipped)/2] ^= 0x40
	base := []entry{dir("disk"), dir("disk/etc"), file("disk/etc/hostname", "loam\n")}
	with := func(es ...entry) []entry { return append(append([]entry{}, base...), es...) }

	tests := []struct {
		name string
		data []byte
		want string
		max  int64
	}{
		{"crafted archive is good", craft(t, false, base, ""), "", 0},
		{"truncated", good.Bytes()[:good.Len()/2], "cut short", 0},
		{"truncated at the end", good.Bytes()[:good.Len()-10], "cut short", 0},
		{"flipped byte", flipped, "refused", 0},
		{"not zstd", []byte("hello, this is not an archive"), "refused", 0},
		{"empty", nil, "refused", 0},
		{"wrong checksum", craft(t, false, base, "0 0 0 0 0 0 0 - \"x\" \"\"\n"), "checksums do not match", 0},
		{"content changed", craft(t, false, with(file("disk/a", "one")), strings.Replace(sumsOf(t, with(file("disk/a", "two"))), "two", "one", 1)), "checksums do not match", 0},
		{"dot dot", craft(t, false, with(file("disk/../x", "evil")), ""), "not clean", 0},
		{"dot dot inside", craft(t, false, with(file("disk/etc/../../x", "evil")), ""), "not clean", 0},
		{"absolute", craft(t, false, with(file("/tmp/x", "evil")), ""), "absolute", 0},
		{"outside disk", craft(t, false, with(file("x", "evil")), ""), "unexpected entry", 0},
		{"mem without memory", craft(t, false, with(dir("mem"), file("mem/x", "m")), ""), "unexpected entry", 0},
		{"symlink climbing past the root", craft(t, false, with(symlink("disk/etc/esc", "../../../x")), ""), "", 0},
		{"too deep", craft(t, false, with(deep(1025)...), ""), "deeper than", 0},
		{"name too long for the file system", craft(t, false, with(file("disk/"+strings.Repeat("n", 300), "x")), ""), "too long", 0},
		{"write through symlink", craft(t, false, with(symlink("disk/l", "/tmp"), file("disk/l/x", "evil")), ""), "not in a directory", 0},
		{"write through relative symlink", craft(t, false, with(symlink("disk/l", "etc"), file("disk/l/y", "evil")), ""), "not in a directory", 0},
		{"hard link outside", craft(t, false, with(hardlink("disk/h", "/etc/passwd")), ""), "not an earlier file", 0},
		{"hard link to dir", craft(t, false, with(hardlink("disk/h", "disk/etc")), ""), "not an earlier file", 0},
		{"twice", craft(t, false, with(file("disk/etc/hostname", "again")), ""), "appears twice", 0},
		{"no parent", craft(t, false, with(file("disk/nodir/x", "x")), ""), "not in a directory", 0},
		{"symlink in mem", craft(t, true, with(dir("mem"), symlink("mem/x", "/etc/passwd")), ""), "not a file", 0},
		{"no disk", craft(t, false, nil, ""), "no disk", 0},
		{"too large", craft(t, false, with(file("disk/big", strings.Repeat("x", 1000))), ""), "larger than the space", 500},
		{"fits", craft(t, false, with(file("disk/big", strings.Repeat("x", 1000))), ""), "", 2000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := t.TempDir()
			dest := filepath.Join(parent, "dest")
			must(t, os.Mkdir(dest, 0o700))
			_, err := ReadArchive(t.Context(), bytes.NewReader(tt.data), dest, tt.max)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("ReadArchive: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("ReadArchive accepted it, want an error with %q", tt.want)
			}
			if !errors.Is(err, ErrArchive) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ReadArchive: %v; want an invalid error with %q", err, tt.want)
			}
			for _, p := range []string{filepath.Join(parent, "x"), "/tmp/x", "/tmp/y"} {
				if b, err := os.ReadFile(p); err == nil && string(b) == "evil" {
					t.Errorf("%s was written outside dest", p)
				}
			}
		})
	}
}

// sumsOf is the checksums entry craft would write for entries.
func sumsOf(t *testing.T, entries []entry) string {
	t.Helper()
	data := craft(t, false, entries, "")
	zr, err := zstd.NewReader(bytes.NewReader(data))
	must(t, err)
	defer zr.Close()
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		must(t, err)
		if h.Name == SumsEntry {
			var b bytes.Buffer
			_, err := b.ReadFrom(tr)
			must(t, err)
			return b.String()
		}
	}
}

// TestArchiveRefusesEveryFlippedByte: an archive with any one byte changed
// is refused, wherever the byte is (a file's content, tar headers and
// padding, zstd's framing, its trailing checksum, which only a reader that
// reads the stream to its end checks), unless the change is no change:
// some bits of zstd's framing decode to the same bytes, and such an
// archive is the same archive.
func TestArchiveRefusesEveryFlippedByte(t *testing.T) {
	var good bytes.Buffer
	must(t, WriteArchive(t.Context(), &good, Manifest{Name: "x"}, makeDisk(t), ""))
	content := archivetest.Unzstd(good.Bytes())
	parent := t.TempDir()
	same := 0
	for i := range good.Len() {
		flipped := bytes.Clone(good.Bytes())
		flipped[i] ^= 0x01
		dest := filepath.Join(parent, strconv.Itoa(i))
		must(t, os.Mkdir(dest, 0o700))
		_, err := ReadArchive(t.Context(), bytes.NewReader(flipped), dest, 0)
		switch {
		case err == nil && !bytes.Equal(archivetest.Unzstd(flipped), content):
			t.Errorf("byte %d of %d flipped: accepted, and the archive's content changed", i, good.Len())
		case err == nil:
			same++
		case !errors.Is(err, ErrArchive):
			t.Errorf("byte %d of %d flipped: %v, want an archive error", i, good.Len(), err)
		}
		must(t, os.RemoveAll(dest))
	}
	t.Logf("%d of %d flips decoded to the same archive", same, good.Len())
}
