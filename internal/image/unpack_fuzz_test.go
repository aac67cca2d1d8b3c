package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

func zstdOf(tb testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	w, err := zstd.NewWriter(&buf)
	if err != nil {
		tb.Fatal(err)
	}
	w.Write(b)
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// FuzzUnpackLayers applies two fuzzed layers (plain, gzip or zstd) onto a
// root with a file and a directory planted beside it, then finishes the
// tree as a pull does: nothing outside the root may change, whatever the
// layers hold, and no device node is made.
func FuzzUnpackLayers(f *testing.F) {
	dir, sym, link, char, fifo := byte(tar.TypeDir), byte(tar.TypeSymlink), byte(tar.TypeLink), byte(tar.TypeChar), byte(tar.TypeFifo)
	base := layerTar(f,
		entry{name: "bin/", typ: dir}, entry{name: "bin/sh", body: "#!", mode: 0o755},
		entry{name: "etc/", typ: dir}, entry{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\n"},
		entry{name: "var/", typ: dir}, entry{name: "var/run", typ: sym, link: "/run"},
		entry{name: "usr/bin/su", body: "su", mode: 0o4755, uid: 0, gid: 0},
		entry{name: "usr/bin/sudo", typ: link, link: "usr/bin/su"},
	)
	seeds := [][2][]byte{
		{base, layerTar(f, entry{name: "etc/.wh.passwd"}, entry{name: "bin/.wh..wh..opq"}, entry{name: "bin/ls", body: "ls"})},
		{gz(f, base), zstdOf(f, layerTar(f, entry{name: "var/run/pid", body: "1"}))},
		{layerTar(f, entry{name: "../../planted", body: "escape"}), nil},
		{layerTar(f, entry{name: "root", typ: sym, link: "/"}, entry{name: "root/planted", body: "through /"}), nil},
		{layerTar(f, entry{name: "up", typ: sym, link: "../.."}, entry{name: "up/outside/x", body: "up"}), nil},
		{layerTar(f, entry{name: "abs", typ: sym, link: "../../outside"}), layerTar(f, entry{name: "abs/x", body: "later layer"})},
		{layerTar(f, entry{name: "h", typ: link, link: "../planted"}), nil},
		{layerTar(f, entry{name: "loop", typ: sym, link: "loop/loop"}, entry{name: "loop/x", body: "loop"}), nil},
		{layerTar(f, entry{name: "dev/null", typ: char}, entry{name: "p", typ: fifo}), nil},
		{layerTar(f, entry{name: "a/b/c", body: "c"}), layerTar(f, entry{name: "a/.wh.b"}, entry{name: ".wh...", body: ""})},
		{layerTar(f, entry{name: "d", typ: dir}, entry{name: "d", body: "file over dir"}), layerTar(f, entry{name: "d/.wh..wh..opq"})},
		{[]byte{0x1f, 0x8b, 0, 0}, []byte{0x28, 0xb5, 0x2f, 0xfd, 1}},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, layer1, layer2 []byte) {
		top := t.TempDir()
		root, outside, planted := filepath.Join(top, "root"), filepath.Join(top, "outside"), filepath.Join(top, "planted")
		for _, d := range []string{root, outside} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(planted, []byte("keep"), 0o600); err != nil {
			t.Fatal(err)
		}
		u, err := NewUnpacker(root)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		err = u.ApplyCompressed(ctx, bytes.NewReader(layer1))
		if err == nil {
			err = u.ApplyCompressed(ctx, bytes.NewReader(layer2))
		}
		if err == nil {
			err = u.finish()
		}
		u.Close()
		_ = err // a bad layer fails the pull; what matters is where it wrote
		names, rerr := os.ReadDir(top)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if len(names) != 3 {
			t.Fatalf("beside the root: %v, want outside, planted, root", names)
		}
		if left, _ := os.ReadDir(outside); len(left) != 0 {
			t.Fatalf("written outside the root: %v", left)
		}
		var st unix.Stat_t
		if err := unix.Lstat(planted, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != 0o600 || st.Nlink != 1 || st.Uid != 0 {
			t.Fatalf("the planted file changed: %+v, %v", st, err)
		}
		if b, _ := os.ReadFile(planted); string(b) != "keep" {
			t.Fatalf("the planted file holds %q", b)
		}
		werr := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if t := d.Type(); t&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0 {
				return &fs.PathError{Op: "unpack", Path: p, Err: fs.ErrInvalid}
			}
			return nil
		})
		if werr != nil {
			t.Fatalf("in the root: %v", werr)
		}
	})
}
