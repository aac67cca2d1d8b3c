package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

type entry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func tarOf(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: mode, ModTime: time.Unix(1700000000, 0)}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)[:h.Size]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// setup makes base/dst, base/outside (0755, empty) and dst/conf, a
// symlink to outside a user of the sandbox planted.
func setup(t *testing.T) (base, dst string) {
	base = t.TempDir()
	dst = filepath.Join(base, "dst")
	for _, d := range []string{dst, filepath.Join(base, "outside")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../outside", filepath.Join(dst, "conf")); err != nil {
		t.Fatal(err)
	}
	return base, dst
}

func extractInto(t *testing.T, dst string, data []byte, opts Options) error {
	t.Helper()
	d, err := OpenDir(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	return Extract(context.Background(), d, bytes.NewReader(data), opts)
}

// TestExtractNoSymlinkFollowed is the attacks of issue 20: a tar's own
// symlink climbing out, and a symlink planted in the directory, must not
// let an entry land outside or change the mode of what they point to.
// It runs on the host and, through test/TestPathsInSandbox, inside gVisor.
func TestExtractNoSymlinkFollowed(t *testing.T) {
	reg, dir, sym := byte(tar.TypeReg), byte(tar.TypeDir), byte(tar.TypeSymlink)
	for _, tc := range []struct {
		name    string
		entries []entry
	}{
		{"climbing symlink", []entry{{name: "d", typ: sym, link: "../../../../../../.."}, {name: "d/" + "tmp/x", typ: reg, body: "x"}}},
		{"climbing symlink to outside", []entry{{name: "d", typ: sym, link: "../outside"}, {name: "d/x", typ: reg, body: "x"}}},
		{"planted symlink, dir entry", []entry{{name: "conf/", typ: dir, mode: 0o777}}},
		{"planted symlink, file beneath", []entry{{name: "conf/x", typ: reg, body: "x"}}},
		{"planted symlink, dir beneath", []entry{{name: "conf/sub/", typ: dir, mode: 0o777}}},
		{"planted symlink, symlink beneath", []entry{{name: "conf/l", typ: sym, link: "/"}}},
		{"dotdot", []entry{{name: "../outside/x", typ: reg, body: "x"}}},
		{"absolute", []entry{{name: "/outside/x", typ: reg, body: "x"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, dst := setup(t)
			marker := filepath.Join(os.TempDir(), "x")
			_, markerBefore := os.Lstat(marker)
			err := extractInto(t, dst, tarOf(t, tc.entries...), Options{SetID: true})
			if !errors.Is(err, ErrRefused) {
				t.Errorf("extract: %v, want refused", err)
			}
			outside := filepath.Join(base, "outside")
			if fi, err := os.Lstat(outside); err != nil || fi.Mode() != fs.ModeDir|0o755 {
				t.Errorf("outside: %v, %v; want a directory 0755", fi.Mode(), err)
			}
			if left, _ := os.ReadDir(outside); len(left) != 0 {
				t.Errorf("written outside: %v", left)
			}
			if _, err := os.Lstat(marker); markerBefore != nil && err == nil {
				os.Remove(marker)
				t.Errorf("%s was written", marker)
			}
		})
	}
}

// TestExtractReplacesPlantedLink: a file entry at the planted symlink's
// name replaces the link, never writes its target.
func TestExtractReplacesPlantedLink(t *testing.T) {
	base, dst := setup(t)
	err := extractInto(t, dst, tarOf(t, entry{name: "conf", typ: tar.TypeReg, body: "mine"}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "conf")); err != nil || string(b) != "mine" {
		t.Fatalf("conf: %q, %v", b, err)
	}
	if left, _ := os.ReadDir(filepath.Join(base, "outside")); len(left) != 0 {
		t.Fatalf("written outside: %v", left)
	}
}

// TestExtractTree: a plain tree lands whole, a read-only directory of the
// tar included (its mode is set once it is filled).
func TestExtractTree(t *testing.T) {
	_, dst := setup(t)
	data := tarOf(t,
		entry{name: "src/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "src/main.go", typ: tar.TypeReg, body: "package main\n"},
		entry{name: "src/link", typ: tar.TypeSymlink, link: "main.go"},
		entry{name: "ro/", typ: tar.TypeDir, mode: 0o555},
		entry{name: "ro/f", typ: tar.TypeReg, body: "f", mode: 0o4755},
		entry{name: "a/b/c", typ: tar.TypeReg, body: "deep"},
	)
	if err := extractInto(t, dst, data, Options{}); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"src/main.go": "package main\n", "src/link": "package main\n", "ro/f": "f", "a/b/c": "deep"} {
		if b, err := os.ReadFile(filepath.Join(dst, name)); err != nil || string(b) != body {
			t.Errorf("%s: %q, %v", name, b, err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(dst, "ro")); err != nil || fi.Mode().Perm() != 0o555 {
		t.Errorf("ro: %v, %v", fi.Mode(), err)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "ro/f")); err != nil || fi.Mode() != 0o755 {
		t.Errorf("ro/f: %v, %v; want 0755 without SetID", fi.Mode(), err)
	}
	_ = os.Chmod(filepath.Join(dst, "ro"), 0o755)
}

// TestRemoveAtFollowsNoSymlink: removing a tree that holds symlinks to
// directories outside removes the links, not what they point to.
func TestRemoveAtFollowsNoSymlink(t *testing.T) {
	base, dst := setup(t)
	outside := filepath.Join(base, "outside")
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dst, "a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dst, "a/b/abs")); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(base)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.RemoveAll("dst"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dst still there: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "keep" {
		t.Fatalf("outside/keep: %q, %v", b, err)
	}
}

// TestDirRefusesSymlinkedWay: Dir's calls refuse a symlink on the way
// and at the last component of Chmod, whatever the kernel's O_DIRECTORY.
func TestDirRefusesSymlinkedWay(t *testing.T) {
	base, dst := setup(t)
	d, err := OpenDir(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Mkdir("conf/x", 0o755); err == nil {
		t.Error("Mkdir through the symlink succeeded")
	}
	if err := d.Chmod("conf", 0o777); err == nil {
		t.Error("Chmod of the symlink succeeded")
	}
	if _, err := d.OpenDirAt("conf"); err == nil {
		t.Error("OpenDirAt of the symlink succeeded")
	}
	if err := d.WriteFile("conf/x", []byte("x"), 0o644); err == nil {
		t.Error("WriteFile through the symlink succeeded")
	}
	if fi, err := os.Lstat(filepath.Join(base, "outside")); err != nil || fi.Mode() != fs.ModeDir|0o755 {
		t.Errorf("outside: %v, %v", fi.Mode(), err)
	}
	if left, _ := os.ReadDir(filepath.Join(base, "outside")); len(left) != 0 {
		t.Errorf("written outside: %v", left)
	}
}

// TestExtractLayerRemovalsForgetKeptDirs: after an opaque marker or a
// whiteout removes a directory the extractor held open, the next entry
// beneath it lands in a new directory, not in the removed one.
func TestExtractLayerRemovalsForgetKeptDirs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []entry
	}{
		{"opaque", []entry{{name: "a/b/c", typ: tar.TypeReg, body: "c"}, {name: "a/.wh..wh..opq", typ: tar.TypeReg}, {name: "a/b/d", typ: tar.TypeReg, body: "d"}}},
		{"whiteout", []entry{{name: "a/b/c", typ: tar.TypeReg, body: "c"}, {name: "a/.wh.b", typ: tar.TypeReg}, {name: "a/b/d", typ: tar.TypeReg, body: "d"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, dst := setup(t)
			if err := extractInto(t, dst, tarOf(t, tc.entries...), Options{Layer: true, SetID: true}); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(dst, "a/b/d")); err != nil || string(b) != "d" {
				t.Errorf("a/b/d: %q, %v", b, err)
			}
			if _, err := os.Lstat(filepath.Join(dst, "a/b/c")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a/b/c: %v, want removed", err)
			}
		})
	}
}
