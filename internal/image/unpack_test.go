package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/archive/archivetest"
	"loam.dev/loam/internal/image/imagetest"
)

// entry is one tar entry of a test layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
}

// layerTar is the tar of a test layer (imagetest.Layer, with this file's
// shorter entries).
func layerTar(t testing.TB, entries ...entry) []byte {
	t.Helper()
	out := make([]imagetest.Entry, len(entries))
	for i, e := range entries {
		out[i] = imagetest.Entry{Name: e.name, Type: e.typ, Body: []byte(e.body), Link: e.link, Mode: e.mode, UID: e.uid, GID: e.gid}
	}
	return imagetest.Layer(t, out...)
}

func unpackLayers(t *testing.T, layers ...[]byte) (string, error) {
	t.Helper()
	dir := t.TempDir()
	u, err := NewUnpacker(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	for _, l := range layers {
		if err := u.ApplyCompressed(t.Context(), bytes.NewReader(l)); err != nil {
			return dir, err
		}
	}
	return dir, nil
}

func gz(t testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func wantFile(t *testing.T, dir, name, body string) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Errorf("%s: %v", name, err)
		return
	}
	if string(got) != body {
		t.Errorf("%s = %q, want %q", name, got, body)
	}
}

func wantGone(t *testing.T, dir, name string) {
	t.Helper()
	if _, err := os.Lstat(filepath.Join(dir, name)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s: got %v, want it gone", name, err)
	}
}

func TestWhiteoutsAndOpaqueDirs(t *testing.T) {
	lower := layerTar(t,
		entry{name: "etc/", typ: tar.TypeDir},
		entry{name: "etc/keep", body: "keep"},
		entry{name: "etc/gone", body: "gone"},
		entry{name: "var/", typ: tar.TypeDir},
		entry{name: "var/cache/", typ: tar.TypeDir},
		entry{name: "var/cache/old", body: "old"},
		entry{name: "var/cache/sub/", typ: tar.TypeDir},
		entry{name: "var/cache/sub/deep", body: "deep"},
		entry{name: "tree/", typ: tar.TypeDir},
		entry{name: "tree/leaf", body: "leaf"},
	)
	upper := layerTar(t,
		entry{name: "etc/.wh.gone", typ: tar.TypeReg},
		entry{name: ".wh.tree", typ: tar.TypeReg},
		// The new file comes before the opaque marker: it must survive it.
		entry{name: "var/cache/new", body: "new"},
		entry{name: "var/cache/.wh..wh..opq", typ: tar.TypeReg},
		entry{name: "etc/keep", body: "kept, changed"},
	)
	dir, err := unpackLayers(t, gz(t, lower), upper)
	if err != nil {
		t.Fatal(err)
	}
	wantFile(t, dir, "etc/keep", "kept, changed")
	wantGone(t, dir, "etc/gone")
	wantGone(t, dir, "etc/.wh.gone")
	wantGone(t, dir, "tree")
	wantFile(t, dir, "var/cache/new", "new")
	wantGone(t, dir, "var/cache/old")
	wantGone(t, dir, "var/cache/sub")
	wantGone(t, dir, "var/cache/.wh..wh..opq")
}

// TestSymlinkEscapes: no layer can write, remove or link outside the root,
// whether by name or through a symlink it or a lower layer made.
func TestSymlinkEscapes(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		layers [][]byte
	}{
		{"dotdot name", [][]byte{layerTar(t, entry{name: "../../../../" + victim, body: "pwned"})}},
		{"absolute symlink then write through it", [][]byte{
			layerTar(t, entry{name: "esc", typ: tar.TypeSymlink, link: outside}),
			layerTar(t, entry{name: "esc/victim", body: "pwned"}),
		}},
		{"relative symlink climbing out, same layer", [][]byte{layerTar(t,
			entry{name: "a/", typ: tar.TypeDir},
			entry{name: "a/up", typ: tar.TypeSymlink, link: "../../../../../../../../" + outside},
			entry{name: "a/up/victim", body: "pwned"},
		)}},
		{"whiteout through a symlink", [][]byte{
			layerTar(t, entry{name: "esc", typ: tar.TypeSymlink, link: outside}),
			layerTar(t, entry{name: "esc/.wh.victim"}),
		}},
		{"opaque through a symlink", [][]byte{
			layerTar(t, entry{name: "esc", typ: tar.TypeSymlink, link: outside}),
			layerTar(t, entry{name: "esc/.wh..wh..opq"}),
		}},
		{"hard link to a host file", [][]byte{layerTar(t, entry{name: "hl", typ: tar.TypeLink, link: "../../../../../../" + victim})}},
		{"hard link through a symlink", [][]byte{layerTar(t,
			entry{name: "esc", typ: tar.TypeSymlink, link: outside},
			entry{name: "hl", typ: tar.TypeLink, link: "esc/victim"},
		)}},
		{"file over a symlink to a host file", [][]byte{layerTar(t,
			entry{name: "f", typ: tar.TypeSymlink, link: victim},
			entry{name: "f", body: "pwned"},
		)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir, _ := unpackLayers(t, tc.layers...) // an error is fine; an escape is not
			got, err := os.ReadFile(victim)
			if err != nil || string(got) != "host" {
				t.Fatalf("the host's file: %q, %v; want it untouched", got, err)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(victim, &st); err != nil || st.Nlink != 1 {
				t.Errorf("the host's file has %d links (%v), want 1", st.Nlink, err)
			}
			if fi, err := os.Lstat(filepath.Join(dir, "f")); err == nil && fi.Mode().IsRegular() {
				wantFile(t, dir, "f", "pwned") // replaced in the root, not written through
			}
		})
	}
}

func TestHardlinksModesOwners(t *testing.T) {
	dir, err := unpackLayers(t, layerTar(t,
		entry{name: "bin/", typ: tar.TypeDir},
		entry{name: "bin/tool", body: "#!/bin/sh\n", mode: 0o4755, uid: 0, gid: 0},
		entry{name: "bin/alias", typ: tar.TypeLink, link: "bin/tool"},
		entry{name: "home/", typ: tar.TypeDir},
		entry{name: "home/app/", typ: tar.TypeDir, mode: 0o750, uid: 1234, gid: 5678},
		entry{name: "home/app/secret", body: "s", mode: 0o600, uid: 1234, gid: 5678},
		entry{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		entry{name: "usr/lib/libx.so", typ: tar.TypeSymlink, link: "libx.so.1", uid: 7, gid: 8},
		entry{name: "dev/null", typ: tar.TypeChar},
	))
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, mode fs.FileMode, uid, gid int) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != mode || int(st.Uid) != uid || int(st.Gid) != gid {
			t.Errorf("%s: %v %d:%d, want %v %d:%d", name, fi.Mode(), st.Uid, st.Gid, mode, uid, gid)
		}
	}
	check("bin/tool", fs.ModeSetuid|0o755, 0, 0)
	check("home/app", fs.ModeDir|0o750, 1234, 5678)
	check("home/app/secret", 0o600, 1234, 5678)
	check("tmp", fs.ModeDir|fs.ModeSticky|0o777, 0, 0)
	check("usr/lib/libx.so", fs.ModeSymlink|0o777, 7, 8)
	a, _ := os.Stat(filepath.Join(dir, "bin/tool"))
	b, _ := os.Stat(filepath.Join(dir, "bin/alias"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Errorf("bin/alias is not a hard link of bin/tool")
	}
	wantGone(t, dir, "dev/null")
	if fi, err := os.Stat(filepath.Join(dir, "bin/tool")); err == nil && fi.ModTime().Unix() != 1700000000 {
		t.Errorf("bin/tool mtime %v, want the layer's", fi.ModTime())
	}
}

func TestBadLayer(t *testing.T) {
	_, err := unpackLayers(t, gz(t, []byte("not a tar at all, but long enough to be read as one............"))[:20])
	if !errors.Is(err, ErrBadLayer) {
		t.Errorf("truncated gzip: got %v, want ErrBadLayer", err)
	}
}

// TestSparseLayerBomb: a layer of a few kilobytes holding a sparse file
// of 1 TiB, which the tar reader reads back as that many zeros, is refused
// before a byte of it is written, as the data dir's lack of space.
func TestSparseLayerBomb(t *testing.T) {
	bomb, err := archivetest.SparseTar("usr/big", 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := unpackLayers(t, gz(t, bomb))
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeInsufficientStorage {
		t.Fatalf("the sparse bomb: %v, want insufficient storage", err)
	}
	wantGone(t, dir, "usr/big")
}

// TestSymlinkedParents: a layer writing under a directory that a lower
// layer made a symlink (absolute, as Debian's /var/run -> /run, or
// relative) writes where the link leads inside the root, as the sandbox
// will see it; a link climbing above the root stops at it.
func TestSymlinkedParents(t *testing.T) {
	dir, err := unpackLayers(t,
		layerTar(t,
			entry{name: "run/", typ: tar.TypeDir},
			entry{name: "var/", typ: tar.TypeDir},
			entry{name: "var/run", typ: tar.TypeSymlink, link: "/run"},
			entry{name: "usr/lib/", typ: tar.TypeDir},
			entry{name: "lib", typ: tar.TypeSymlink, link: "usr/lib"},
			entry{name: "up", typ: tar.TypeSymlink, link: "../../../.."},
		),
		layerTar(t,
			entry{name: "var/run/app.pid", body: "42"},
			entry{name: "lib/libz.so", body: "z"},
			entry{name: "up/etc/top", body: "top"},
			entry{name: "lib/hard", typ: tar.TypeLink, link: "var/run/app.pid"},
		),
	)
	if err != nil {
		t.Fatal(err)
	}
	wantFile(t, dir, "run/app.pid", "42")
	wantFile(t, dir, "usr/lib/libz.so", "z")
	wantFile(t, dir, "etc/top", "top")
	wantFile(t, dir, "usr/lib/hard", "42")
	if fi, err := os.Lstat(filepath.Join(dir, "var/run")); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("var/run is no longer a symlink: %v, %v", fi, err)
	}
}

func TestSymlinkLoop(t *testing.T) {
	_, err := unpackLayers(t, layerTar(t,
		entry{name: "a", typ: tar.TypeSymlink, link: "b"},
		entry{name: "b", typ: tar.TypeSymlink, link: "/a"},
		entry{name: "a/file", body: "x"},
	))
	if !errors.Is(err, ErrBadLayer) {
		t.Errorf("writing through a loop of links: %v, want ErrBadLayer", err)
	}
}
