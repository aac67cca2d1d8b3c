package files

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
)

// tarEntry is one entry of a tar a fuzz seed is made of.
type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func fuzzTar(tb testing.TB, entries ...tarEntry) []byte {
	tb.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: mode, Size: int64(len(e.body)), ModTime: time.Unix(1700000000, 0)}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			tb.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// userCodes are the error classes an upload's own content may earn: the
// user's mistakes, never the agent's failure.
var userCodes = []api.Code{api.CodeInvalid, api.CodeNotFound, api.CodeConflict, api.CodeForbidden}

// FuzzExtractTar extracts fuzzed tars into a directory with a file and a
// directory planted beside it: nothing may be written, linked or changed
// outside it, and a bad tar is the user's error, never the agent's.
func FuzzExtractTar(f *testing.F) {
	reg, dir, sym, link := byte(tar.TypeReg), byte(tar.TypeDir), byte(tar.TypeSymlink), byte(tar.TypeLink)
	seeds := [][]tarEntry{
		{{name: "src/", typ: dir, mode: 0o755}, {name: "src/main.go", typ: reg, body: "package main\n"}, {name: "src/run.sh", typ: reg, body: "#!/bin/sh\n", mode: 0o755}, {name: "src/link", typ: sym, link: "main.go"}},
		{{name: "./a/b/c.txt", typ: reg, body: "deep"}},
		{{name: "../planted", typ: reg, body: "overwritten"}},
		{{name: "/etc/escape", typ: reg, body: "x"}},
		{{name: "a/../../outside/x", typ: reg, body: "x"}},
		{{name: "up", typ: sym, link: ".."}, {name: "up/planted", typ: reg, body: "through a symlink"}},
		{{name: "out", typ: sym, link: "../outside"}, {name: "out/x", typ: reg, body: "x"}},
		{{name: "p", typ: sym, link: "../planted"}, {name: "p", typ: reg, body: "replaces the link, not its target"}},
		{{name: "hard", typ: link, link: "../planted"}},
		{{name: "d", typ: dir, mode: 0}, {name: "d/f", typ: reg, body: "in a dir of mode 0"}},
		{{name: "f", typ: reg, body: "file"}, {name: "f/g", typ: reg, body: "under a file"}},
		{{name: "dev", typ: tar.TypeChar}, {name: "fifo", typ: tar.TypeFifo}},
		{{name: "x", typ: dir}, {name: "x", typ: reg, body: "a file where a dir is"}},
		{{name: "s", typ: reg, body: "setuid", mode: 0o6755}},
		{{name: "d", typ: sym, link: "../../.."}, {name: "d/tmp/x", typ: reg, body: "through a climbing symlink"}},
		{{name: "conf/", typ: dir, mode: 0o777}, {name: "conf/x", typ: reg, body: "through the planted symlink"}},
		{{name: "conf/x", typ: reg, body: "through the planted symlink"}},
		{{name: "ro/", typ: dir, mode: 0o555}, {name: "ro/f", typ: reg, body: "in a read-only dir"}},
	}
	for _, s := range seeds {
		f.Add(fuzzTar(f, s...))
	}
	f.Add([]byte("not a tar"))
	f.Add(fuzzTar(f, tarEntry{name: "cut", typ: reg, body: "a body longer than what follows"})[:600])
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		dst, outside, planted := filepath.Join(base, "dst"), filepath.Join(base, "outside"), filepath.Join(base, "planted")
		for _, d := range []string{dst, outside} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(planted, []byte("keep"), 0o600); err != nil {
			t.Fatal(err)
		}
		// A symlink a user of the sandbox planted in the directory: no
		// entry may go through it, nor change its target's mode.
		if err := os.Symlink("../outside", filepath.Join(dst, "conf")); err != nil {
			t.Fatal(err)
		}
		err := extractTar(t.Context(), dst, bytes.NewReader(data))
		var ae *api.Error
		if err != nil && (!errors.As(err, &ae) || !slices.Contains(userCodes, ae.Code)) {
			t.Fatalf("extracting: %v (not the user's error)", err)
		}
		names, rerr := os.ReadDir(base)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if len(names) != 3 {
			t.Fatalf("beside the directory: %v, want dst, outside, planted", names)
		}
		if left, _ := os.ReadDir(outside); len(left) != 0 {
			t.Fatalf("written outside: %v", left)
		}
		if fi, err := os.Lstat(outside); err != nil || fi.Mode() != fs.ModeDir|0o755 {
			t.Fatalf("the directory outside changed: %v, %v", fi.Mode(), err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(planted, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != 0o600 || st.Nlink != 1 {
			t.Fatalf("the planted file changed: %+v, %v", st, err)
		}
		if b, _ := os.ReadFile(planted); string(b) != "keep" {
			t.Fatalf("the planted file holds %q", b)
		}
		// Only files, directories and symlinks, and no file shares its
		// inode with one outside.
		werr := filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR, unix.S_IFLNK:
			case unix.S_IFREG:
				if st.Nlink != 1 {
					t.Errorf("%s has %d links", p, st.Nlink)
				}
			default:
				t.Errorf("%s is of type %o", p, st.Mode&unix.S_IFMT)
			}
			return nil
		})
		if werr != nil {
			t.Fatal(werr)
		}
	})
}
