package archive

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"loam.dev/loam/internal/archive/archivetest"
)

// The option sets of Extract's three callers: the agent's upload into a
// sandbox, loam cp out of one, and the image unpacker's layers.
var (
	uploadOpts = Options{SetID: true}
	cpOpts     = Options{}
	layerOpts  = Options{Layer: true, Owners: true, SetID: true}
)

// outcome is what one caller's extraction of a case must do.
type outcome int

const (
	refuse   outcome = iota // fail with ErrRefused
	apply                   // succeed
	failSafe                // fail, for any reason (a missing link target)
)

// TestExtractCallers holds each caller's rules side by side, on hostile
// tars and a tree with a planted symlink (dst/conf -> ../outside) and a
// file outside (outside/secret): whatever the outcome, nothing outside dst
// is written, linked to or has its mode changed. Uploads and cp refuse
// every escape; a layer takes ".." and symlinks as the sandbox will,
// inside its root, makes hard links only to what is inside, skips devices
// and applies whiteouts. It runs on the host and, through
// test/TestPathsInSandbox, inside gVisor.
func TestExtractCallers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the layer's owners need root")
	}
	reg, sym, lnk := byte(tar.TypeReg), byte(tar.TypeSymlink), byte(tar.TypeLink)
	type want struct{ upload, cp, layer outcome }
	for _, tc := range []struct {
		name    string
		entries []entry
		want    want
		// check, when set, looks at dst after each caller's extraction.
		check func(t *testing.T, caller, dst string)
	}{
		{"dotdot", []entry{{name: "../outside/x", typ: reg, body: "x"}}, want{refuse, refuse, apply},
			func(t *testing.T, caller, dst string) {
				if caller == "layer" {
					wantFile(t, dst, "outside/x", "x") // taken lexically, inside
				}
			}},
		{"absolute", []entry{{name: "/etc/x", typ: reg, body: "x"}}, want{refuse, refuse, apply},
			func(t *testing.T, caller, dst string) {
				if caller == "layer" {
					wantFile(t, dst, "etc/x", "x")
				}
			}},
		{"own climbing symlink", []entry{{name: "d", typ: sym, link: "../../../../.."}, {name: "d/tmp/x", typ: reg, body: "x"}}, want{refuse, refuse, apply},
			func(t *testing.T, caller, dst string) {
				if caller == "layer" {
					wantFile(t, dst, "tmp/x", "x") // the root's /tmp
				}
			}},
		{"planted symlink", []entry{{name: "conf/x", typ: reg, body: "x"}}, want{refuse, refuse, apply},
			func(t *testing.T, caller, dst string) {
				if caller == "layer" {
					wantFile(t, dst, "outside/x", "x") // conf -> ../outside, from the root
				}
			}},
		{"hard link out", []entry{{name: "l", typ: lnk, link: "../outside/secret"}}, want{refuse, refuse, failSafe}, nil},
		{"hard link through planted symlink", []entry{{name: "l", typ: lnk, link: "conf/secret"}}, want{refuse, refuse, failSafe}, nil},
		{"hard link inside", []entry{{name: "f", typ: reg, body: "f"}, {name: "l", typ: lnk, link: "f"}}, want{refuse, refuse, apply},
			func(t *testing.T, caller, dst string) {
				if caller == "layer" {
					wantFile(t, dst, "l", "f")
				}
			}},
		{"device", []entry{{name: "null", typ: tar.TypeChar}}, want{refuse, refuse, apply},
			func(t *testing.T, caller, dst string) {
				if _, err := os.Lstat(filepath.Join(dst, "null")); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s made a device node: %v", caller, err)
				}
			}},
		{"fifo", []entry{{name: "p", typ: tar.TypeFifo}}, want{refuse, refuse, apply},
			func(t *testing.T, caller, dst string) {
				if _, err := os.Lstat(filepath.Join(dst, "p")); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s made a fifo: %v", caller, err)
				}
			}},
		{"whiteout", []entry{{name: "keep", typ: reg, body: "k"}, {name: ".wh.keep", typ: reg}}, want{apply, apply, apply},
			func(t *testing.T, caller, dst string) {
				_, err := os.Lstat(filepath.Join(dst, "keep"))
				if caller == "layer" && !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("layer: keep survived its whiteout: %v", err)
				}
				if caller != "layer" {
					wantFile(t, dst, "keep", "k")
					wantFile(t, dst, ".wh.keep", "") // a file like any other
				}
			}},
		{"set-id", []entry{{name: "su", typ: reg, body: "s", mode: 0o4755}}, want{apply, apply, apply},
			func(t *testing.T, caller, dst string) {
				fi, err := os.Lstat(filepath.Join(dst, "su"))
				if err != nil {
					t.Fatal(err)
				}
				setuid := fi.Mode()&fs.ModeSetuid != 0
				if setuid != (caller != "cp") {
					t.Errorf("%s: su has mode %v", caller, fi.Mode())
				}
			}},
	} {
		for _, c := range []struct {
			caller string
			opts   Options
			want   outcome
		}{{"upload", uploadOpts, tc.want.upload}, {"cp", cpOpts, tc.want.cp}, {"layer", layerOpts, tc.want.layer}} {
			t.Run(tc.name+"/"+c.caller, func(t *testing.T) {
				base, dst := setup(t)
				outside := filepath.Join(base, "outside")
				secret := filepath.Join(outside, "secret")
				if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
					t.Fatal(err)
				}
				err := extractInto(t, dst, tarOf(t, tc.entries...), c.opts)
				switch c.want {
				case refuse:
					if !errors.Is(err, ErrRefused) {
						t.Errorf("extract: %v, want refused", err)
					}
				case apply:
					if err != nil {
						t.Errorf("extract: %v, want it applied", err)
					}
				case failSafe:
					if err == nil {
						t.Errorf("extract succeeded, want a failure")
					}
				}
				if tc.check != nil && !t.Failed() {
					tc.check(t, c.caller, dst)
				}
				left, _ := os.ReadDir(outside)
				if len(left) != 1 || left[0].Name() != "secret" {
					t.Errorf("written outside: %v", left)
				}
				var st syscall.Stat_t
				if err := syscall.Lstat(secret, &st); err != nil || st.Nlink != 1 || st.Mode&0o7777 != 0o600 {
					t.Errorf("outside/secret: nlink %d mode %o, %v; want unlinked 0600", st.Nlink, st.Mode&0o7777, err)
				}
				if b, _ := os.ReadFile(secret); string(b) != "secret" {
					t.Errorf("outside/secret now holds %q", b)
				}
				if fi, err := os.Lstat(outside); err != nil || fi.Mode() != fs.ModeDir|0o755 {
					t.Errorf("outside: %v, %v; want a directory 0755", fi.Mode(), err)
				}
			})
		}
	}
}

// wantFile fails t unless the regular file name beneath dst holds body.
func wantFile(t *testing.T, dst, name, body string) {
	t.Helper()
	fi, err := os.Lstat(filepath.Join(dst, name))
	if err != nil || !fi.Mode().IsRegular() {
		t.Errorf("%s: %v, %v; want a regular file", name, fi, err)
		return
	}
	if b, err := os.ReadFile(filepath.Join(dst, name)); err != nil || string(b) != body {
		t.Errorf("%s: %q, %v; want %q", name, b, err, body)
	}
}

// sparseTar is archivetest.SparseTar, failing t on an error.
func sparseTar(t *testing.T, name string, realSize int64) []byte {
	t.Helper()
	b, err := archivetest.SparseTar(name, realSize)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestExtractMaxBytes: files are counted against Options.MaxBytes by the
// size they read back as, so that neither a sparse file (a 1 TiB file in
// a 4 kB tar) nor a long run of them fills the disk: the file that would
// pass the cap is refused before a byte of it is written.
func TestExtractMaxBytes(t *testing.T) {
	reg := byte(tar.TypeReg)
	for _, tc := range []struct {
		name    string
		data    func(t *testing.T) []byte
		max     int64 // -1: the file system's free space
		refused bool
		present []string
		absent  []string
	}{
		{"under the cap", func(t *testing.T) []byte {
			return tarOf(t, entry{name: "a", typ: reg, body: "abc"}, entry{name: "b", typ: reg, body: "defg"})
		}, 7, false, []string{"a", "b"}, nil},
		{"over the cap", func(t *testing.T) []byte {
			return tarOf(t, entry{name: "a", typ: reg, body: "abc"}, entry{name: "b", typ: reg, body: "defgh"})
		}, 7, true, []string{"a"}, []string{"b"}},
		{"sparse bomb", func(t *testing.T) []byte { return sparseTar(t, "big", 1<<40) }, -1, true, nil, []string{"big"}},
		{"sparse file that fits", func(t *testing.T) []byte { return sparseTar(t, "small", 4096) }, -1, false, []string{"small"}, nil},
	} {
		for _, c := range []struct {
			caller string
			opts   Options
		}{{"upload", uploadOpts}, {"cp", cpOpts}, {"layer", Options{Layer: true, SetID: true}}} {
			t.Run(tc.name+"/"+c.caller, func(t *testing.T) {
				_, dst := setup(t)
				d, err := OpenDir(dst)
				if err != nil {
					t.Fatal(err)
				}
				defer d.Close()
				opts := c.opts
				if opts.MaxBytes = tc.max; tc.max < 0 {
					if opts.MaxBytes, err = d.FreeBytes(); err != nil {
						t.Fatal(err)
					}
				}
				err = Extract(t.Context(), d, bytes.NewReader(tc.data(t)), opts)
				if tc.refused != (errors.Is(err, ErrTooLarge) && errors.Is(err, ErrRefused)) {
					t.Errorf("extract: %v, want refused as too large: %v", err, tc.refused)
				}
				if !tc.refused && err != nil {
					t.Errorf("extract: %v", err)
				}
				for _, n := range tc.present {
					if _, err := os.Lstat(filepath.Join(dst, n)); err != nil {
						t.Errorf("%s: %v", n, err)
					}
				}
				for _, n := range tc.absent {
					if _, err := os.Lstat(filepath.Join(dst, n)); !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("%s: %v, want it not written", n, err)
					}
				}
				names, _ := os.ReadDir(dst)
				for _, de := range names {
					if strings.Contains(de.Name(), ".loam-") {
						t.Errorf("temporary file left: %s", de.Name())
					}
				}
			})
		}
	}
}
