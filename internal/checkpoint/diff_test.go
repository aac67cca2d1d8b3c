package checkpoint

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// copyTree copies src to dst as cp -a does (owners, modes, times, hard
// links): a pool's clone of a template.
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
}

// changed makes, from base, the disk of a sandbox that changed it in
// every way a diff must carry, and returns it.
func changed(t *testing.T, base string) string {
	disk := filepath.Join(t.TempDir(), "disk")
	copyTree(t, base, disk)
	p := func(name string) string { return filepath.Join(disk, name) }
	// The same size and mtime, other bytes: only a comparison of the
	// bytes finds it.
	st, err := os.Stat(p("etc/hostname"))
	must(t, err)
	must(t, os.WriteFile(p("etc/hostname"), []byte("evil\n"), 0o644))
	must(t, os.Chtimes(p("etc/hostname"), st.ModTime(), st.ModTime()))
	must(t, os.WriteFile(p("home/loam/new"), []byte("added"), 0o600))
	must(t, os.MkdirAll(p("home/loam/dir/sub"), 0o700))
	must(t, os.WriteFile(p("home/loam/dir/sub/f"), []byte("deep"), 0o644))
	must(t, os.Remove(p("usr/gone")))
	must(t, os.RemoveAll(p("usr/gonedir")))
	must(t, os.Remove(p("etc/typechange")))
	must(t, os.Mkdir(p("etc/typechange"), 0o755))
	must(t, os.WriteFile(p("etc/typechange/in"), []byte("was a file"), 0o644))
	must(t, os.RemoveAll(p("usr/dirtolink")))
	must(t, os.Symlink("/elsewhere", p("usr/dirtolink")))
	must(t, os.Chmod(p("usr/mode"), 0o600))
	must(t, os.Remove(p("bin/name")))
	must(t, os.Symlink("../etc/other", p("bin/name")))
	must(t, os.Remove(p("bin/tool2"))) // a hard link broken
	return disk
}

// makeBase is makeDisk and more: a big file that stays, and what
// changed removes or changes.
func makeBase(t *testing.T) string {
	base := makeDisk(t)
	p := func(name string) string { return filepath.Join(base, name) }
	must(t, os.MkdirAll(p("usr/gonedir/a"), 0o755))
	must(t, os.MkdirAll(p("usr/dirtolink"), 0o755))
	big := make([]byte, 1<<20)
	_, _ = rand.Read(big)
	must(t, os.WriteFile(p("usr/big"), big, 0o644))
	for _, f := range []string{"usr/gone", "usr/gonedir/a/f", "etc/typechange", "usr/mode", "usr/dirtolink/f"} {
		must(t, os.WriteFile(p(f), []byte(f), 0o644))
	}
	return base
}

// TestDiffRoundTrip: a diff against a template, applied to a copy of it,
// makes the disk again (every entry as TreeDigest sees it, and the
// changed file's mtime), and holds none of what did not change.
func TestDiffRoundTrip(t *testing.T) {
	ctx := t.Context()
	base := makeBase(t)
	disk := changed(t, base)
	digest, err := TreeDigest(ctx, base)
	must(t, err)
	if again, _ := TreeDigest(ctx, base); again != digest {
		t.Fatalf("TreeDigest changed: %s, then %s", digest, again)
	}
	if other, _ := TreeDigest(ctx, disk); other == digest {
		t.Fatal("the changed disk has the template's digest")
	}
	b := Base{Name: "busybox", Digest: digest}
	mem := t.TempDir()
	must(t, os.WriteFile(filepath.Join(mem, "pages.img"), []byte("pages"), 0o600))
	var diff, whole bytes.Buffer
	must(t, WriteDiff(ctx, &diff, Manifest{Template: "busybox"}, disk, mem, base, b))
	must(t, WriteArchive(ctx, &whole, Manifest{Template: "busybox"}, disk, mem))
	if diff.Len() > whole.Len()/4 {
		t.Errorf("the diff is %d bytes, the whole archive %d: the unchanged 1 MiB file is in it", diff.Len(), whole.Len())
	}

	clone := filepath.Join(t.TempDir(), "clone")
	copyTree(t, base, clone)
	dest := t.TempDir()
	m, err := ApplyDiff(ctx, bytes.NewReader(diff.Bytes()), clone, dest, b, 0)
	must(t, err)
	if m.Base == nil || *m.Base != b || !m.Memory {
		t.Errorf("manifest %+v, want base %+v and memory", m, b)
	}
	want, _ := TreeDigest(ctx, disk)
	if got, _ := TreeDigest(ctx, clone); got != want {
		out, _ := exec.Command("diff", "-r", "--no-dereference", disk, clone).CombinedOutput()
		t.Errorf("the applied diff is not the disk:\n%s", out)
	}
	for _, f := range []string{"etc/hostname", "home/loam/new", "bin/tool"} {
		var a, c unix.Stat_t
		must(t, unix.Lstat(filepath.Join(disk, f), &a))
		must(t, unix.Lstat(filepath.Join(clone, f), &c))
		if a.Mtim != c.Mtim || a.Mode != c.Mode {
			t.Errorf("%s: mtime %v mode %o, want %v %o", f, c.Mtim, c.Mode, a.Mtim, a.Mode)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dest, MemEntry, "pages.img")); string(b) != "pages" {
		t.Errorf("memory image: %q", b)
	}

	// A diff is no template archive, nor a diff against another base.
	if _, err := ReadArchive(ctx, bytes.NewReader(diff.Bytes()), t.TempDir(), 0); !errors.Is(err, ErrArchive) {
		t.Errorf("ReadArchive of a diff: %v", err)
	}
	other := Base{Name: "busybox", Digest: "sha256:" + strings.Repeat("0", 64)}
	if _, err := ApplyDiff(ctx, bytes.NewReader(diff.Bytes()), t.TempDir(), t.TempDir(), other, 0); !errors.Is(err, ErrArchive) {
		t.Errorf("ApplyDiff against another base: %v", err)
	}
	if _, err := ApplyDiff(ctx, bytes.NewReader(whole.Bytes()), t.TempDir(), t.TempDir(), b, 0); !errors.Is(err, ErrArchive) {
		t.Errorf("ApplyDiff of a whole archive: %v", err)
	}

	// Nothing changed: a diff of the disk itself and its removed list.
	var none bytes.Buffer
	must(t, WriteDiff(ctx, &none, Manifest{}, base, "", base, b))
	if none.Len() > 1024 {
		t.Errorf("a diff of no change is %d bytes", none.Len())
	}
}

// TestDiffRefusesHostile: a crafted diff cannot reach outside the tree
// it applies to: not by a name, a removal, or a symlink of the base's.
func TestDiffRefusesHostile(t *testing.T) {
	b := Base{Name: "busybox", Digest: "sha256:" + strings.Repeat("a", 64)}
	man := Manifest{Format: DiffFormat, Base: &b}
	top := []entry{dir("disk"), dir("disk/etc")}
	with := func(es ...entry) []entry { return append(append([]entry{}, top...), es...) }
	removed := func(names ...string) entry {
		var body strings.Builder
		for _, n := range names {
			body.WriteString(`"` + n + `"` + "\n")
		}
		return file(RemovedEntry, body.String())
	}
	tests := []struct {
		name    string
		entries []entry
		want    string
		max     int64
	}{
		{"good", with(file("disk/etc/new", "x"), removed("disk/etc/hostname")), "", 0},
		{"no removed entry", with(file("disk/etc/new", "x")), "without its removed", 0},
		{"removed twice", with(removed(), removed()), "bad removed", 0},
		{"removal climbing out", with(removed("disk/../keep")), "not clean", 0},
		{"removal climbing out inside", with(removed("disk/etc/../../keep")), "not clean", 0},
		{"absolute removal", with(removed("/tmp/keep")), "absolute", 0},
		{"removal of the disk", with(removed("disk")), "appears twice", 0},
		{"removal outside the disk", with(removed("keep")), "unexpected entry", 0},
		{"removal in mem", with(removed("mem/x")), "unexpected entry", 0},
		{"removal through a base symlink", with(removed("disk/out/keep")), "not in a directory", 0},
		{"removal of an entry", with(file("disk/etc/f", "x"), removed("disk/etc/f")), "appears twice", 0},
		{"removal twice", with(removed("disk/etc/hostname", "disk/etc/hostname")), "appears twice", 0},
		{"entry after the removals", with(removed(), file("disk/etc/late", "x")), "after the removed", 0},
		{"write through a base symlink", with(file("disk/out/keep", "evil"), removed()), "not in a directory", 0},
		{"dir replacing a base symlink", with(dir("disk/out"), file("disk/out/keep", "evil"), removed()), "", 0},
		{"file replacing a base symlink", with(file("disk/outfile", "evil"), removed()), "", 0},
		{"dot dot", with(file("disk/../keep", "evil"), removed()), "not clean", 0},
		{"too large", with(file("disk/big", strings.Repeat("x", 1000)), removed()), "larger than the space", 500},
		{"root not a dir", []entry{file("disk", "x"), removed()}, "not a directory", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := t.TempDir()
			outside := filepath.Join(parent, "outside")
			must(t, os.Mkdir(outside, 0o755))
			must(t, os.WriteFile(filepath.Join(outside, "keep"), []byte("keep"), 0o644))
			must(t, os.WriteFile(filepath.Join(parent, "keep"), []byte("keep"), 0o644))
			clone := filepath.Join(parent, "clone")
			must(t, os.MkdirAll(filepath.Join(clone, "etc"), 0o755))
			must(t, os.WriteFile(filepath.Join(clone, "etc/hostname"), []byte("loam"), 0o644))
			must(t, os.Symlink(outside, filepath.Join(clone, "out")))
			must(t, os.Symlink(filepath.Join(outside, "keep"), filepath.Join(clone, "outfile")))
			dest := filepath.Join(parent, "dest")
			must(t, os.Mkdir(dest, 0o700))

			_, err := ApplyDiff(t.Context(), bytes.NewReader(craftWith(t, man, tt.entries, "")), clone, dest, b, tt.max)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("ApplyDiff: %v", err)
			case tt.want != "" && err == nil:
				t.Errorf("ApplyDiff accepted it, want an error with %q", tt.want)
			case tt.want != "" && (!errors.Is(err, ErrArchive) || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("ApplyDiff: %v; want an invalid error with %q", err, tt.want)
			}
			for _, p := range []string{filepath.Join(parent, "keep"), filepath.Join(outside, "keep")} {
				if got, err := os.ReadFile(p); err != nil || string(got) != "keep" {
					t.Errorf("%s, outside the tree, is now %q, %v", p, got, err)
				}
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 1 {
				t.Errorf("something was made outside the tree: %v", entries)
			}
		})
	}
}

// TestTreeDigestTimes: two trees alike but for a directory's times have
// one digest; a regular file's mtime, or a hard link made a copy,
// changes it.
func TestTreeDigestTimes(t *testing.T) {
	ctx := t.Context()
	a := makeDisk(t)
	b := filepath.Join(t.TempDir(), "b")
	copyTree(t, a, b)
	da, _ := TreeDigest(ctx, a)
	old := time.Now().Add(-time.Hour)
	must(t, os.Chtimes(filepath.Join(b, "etc"), old, old))
	if db, _ := TreeDigest(ctx, b); da != db {
		t.Errorf("a directory's times changed the digest: %s, %s", da, db)
	}
	must(t, os.Chtimes(filepath.Join(b, "etc/hostname"), old, old))
	if db, _ := TreeDigest(ctx, b); da == db {
		t.Error("a file's mtime did not change the digest")
	}
	c := filepath.Join(t.TempDir(), "c")
	copyTree(t, a, c)
	st, err := os.Stat(filepath.Join(c, "bin/tool2"))
	must(t, err)
	must(t, os.Remove(filepath.Join(c, "bin/tool2")))
	must(t, os.WriteFile(filepath.Join(c, "bin/tool2"), bytes.Repeat([]byte("x"), 100000), 0o755))
	must(t, unix.Chmod(filepath.Join(c, "bin/tool2"), 0o4755))
	must(t, os.Chtimes(filepath.Join(c, "bin/tool2"), st.ModTime(), st.ModTime()))
	if dc, _ := TreeDigest(ctx, c); dc == da {
		t.Error("a hard link made a copy has the same digest")
	}
}
