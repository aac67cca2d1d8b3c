package sandbox_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
)

// exportOf is the archive of a template of disk (and mem, when not "").
func exportOf(tb testing.TB, m checkpoint.Manifest, disk, mem string) []byte {
	tb.Helper()
	var buf bytes.Buffer
	if err := checkpoint.WriteArchive(tb.Context(), &buf, m, disk, mem); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// zstdOf is b compressed as an archive is.
func zstdOf(b []byte) []byte {
	zw, _ := zstd.NewWriter(nil)
	defer zw.Close()
	return zw.EncodeAll(b, nil)
}

// rezip is the archive with its tar rewritten by edit: for seeds that are
// well-formed zstd tars with wrong content.
func rezip(tb testing.TB, archive []byte, edit func(h *tar.Header, body []byte) (*tar.Header, []byte)) []byte {
	tb.Helper()
	zr, err := zstd.NewReader(bytes.NewReader(archive))
	if err != nil {
		tb.Fatal(err)
	}
	defer zr.Close()
	var out bytes.Buffer
	zw, _ := zstd.NewWriter(&out)
	tr, tw := tar.NewReader(zr), tar.NewWriter(zw)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		var body bytes.Buffer
		body.ReadFrom(tr)
		h2, b := edit(h, body.Bytes())
		if h2 == nil {
			continue
		}
		h2.Size = int64(len(b))
		if h2.Typeflag != tar.TypeReg {
			h2.Size = 0
		}
		if err := tw.WriteHeader(h2); err != nil {
			tb.Fatal(err)
		}
		tw.Write(b)
	}
	tw.Close()
	zw.Close()
	return out.Bytes()
}

// FuzzImportTemplate imports fuzzed template archives through the
// Manager (the real archive reader, the real copy pool and store): each is
// taken whole, or refused as invalid leaving nothing behind, no template,
// no snapshot, no temporary directory.
//
// A seed goes in twice: as the archive, and as its tar with tar set, which
// the target compresses itself, so that the fuzzer's changes reach the tar
// and the manifest beneath the compression.
func FuzzImportTemplate(f *testing.F) {
	e := newEnv(f)
	disk := makeTinyTree(f)
	mem := f.TempDir()
	must(f, os.WriteFile(filepath.Join(mem, "pages.img"), bytes.Repeat([]byte{7}, 3000), 0o600))
	man := checkpoint.Manifest{Name: "warm", Template: "tiny", Resources: api.Resources{CPUs: 1, MemoryMiB: 256},
		AgentToken: "tok", From: "box/v1", CreatedAt: time.Unix(1700000000, 0).UTC()}
	add := func(archive []byte) {
		f.Add(archive, false)
		if zr, err := zstd.NewReader(bytes.NewReader(archive)); err == nil {
			var tarBytes bytes.Buffer
			if _, err := tarBytes.ReadFrom(zr); err == nil {
				f.Add(tarBytes.Bytes(), true)
			}
			zr.Close()
		}
	}
	good := exportOf(f, man, disk, "")
	add(good)
	add(exportOf(f, man, disk, mem))
	noToken := man
	noToken.AgentToken = ""
	add(exportOf(f, noToken, disk, mem))
	badRes := man
	badRes.Resources.CPUs = 1000
	add(exportOf(f, badRes, disk, ""))
	add(good[:len(good)/2])
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0xff
	add(flipped)
	rename := func(from, to string) []byte {
		return rezip(f, good, func(h *tar.Header, b []byte) (*tar.Header, []byte) {
			if h.Name == from {
				h.Name = to
			}
			return h, b
		})
	}
	add(rename("disk/hello.txt", "disk/../hello.txt"))
	add(rename("disk/hello.txt", "/disk/hello.txt"))
	add(rename("disk/hello.txt", "mem/hello.txt"))
	add(rezip(f, good, func(h *tar.Header, b []byte) (*tar.Header, []byte) {
		if h.Name == "disk/etc/resolv.conf" {
			h.Linkname = "../../../etc/shadow"
		}
		return h, b
	}))
	add(rezip(f, good, func(h *tar.Header, b []byte) (*tar.Header, []byte) {
		if h.Name == "disk/hello.txt" {
			return &tar.Header{Name: "disk/hello.txt", Typeflag: tar.TypeLink, Linkname: "../outside", Mode: 0o644}, nil
		}
		return h, b
	}))
	add(rezip(f, good, func(h *tar.Header, b []byte) (*tar.Header, []byte) {
		if h.Name == checkpoint.ManifestEntry {
			return h, []byte(`{"format":1,"name":"x","memory":false,"resources":{},"created_at":"2024-01-01T00:00:00Z","bogus":1}`)
		}
		return h, b
	}))
	add([]byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0})
	add([]byte("not an archive"))

	// The well-formed seed imports: the refusals below are not blanket.
	if _, err := e.cat.Import(f.Context(), "seed-good", bytes.NewReader(good)); err != nil {
		f.Fatalf("importing a well-formed archive: %v", err)
	}
	must(f, e.cat.Delete(f.Context(), "seed-good"))

	kept := filepath.Join(e.cfg.DataDir, "checkpoint-templates")
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, archive []byte, tar bool) {
		if tar {
			archive = zstdOf(archive)
		}
		name := fmt.Sprintf("imp-%d-%d", os.Getpid(), n.Add(1))
		snapshots := func() []string {
			s, err := e.pool.Snapshots(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		snapsBefore := snapshots()
		_, err := e.cat.Import(t.Context(), name, bytes.NewReader(archive))
		if err == nil {
			must(t, e.cat.Delete(t.Context(), name))
			return
		}
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeInvalid {
			t.Fatalf("import: %v, want invalid", err)
		}
		if entries, _ := os.ReadDir(kept); len(entries) != 0 {
			var names []string
			for _, d := range entries {
				names = append(names, d.Name())
			}
			t.Fatalf("a refused import left %v", names)
		}
		if after := snapshots(); !slices.Equal(after, snapsBefore) {
			t.Fatalf("a refused import changed the snapshots: %v, then %v", snapsBefore, after)
		}
	})
}
