package cli

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"loam.dev/loam/internal/archive"
	"loam.dev/loam/internal/archive/archivetest"
)

// TestExtractLocalRefusesSparseBomb: a sandbox's tar holding a sparse file
// of 1 TiB (a few kilobytes on the wire) is refused by loam cp before a
// byte of it is written, rather than filling the local disk with zeros; a
// sparse file that fits is copied whole.
func TestExtractLocalRefusesSparseBomb(t *testing.T) {
	bomb, err := archivetest.SparseTar("big", 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "out")
	if err := extractLocal(bytes.NewReader(bomb), dir); !errors.Is(err, archive.ErrTooLarge) {
		t.Errorf("the sparse bomb: %v, want it refused as too large", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "big")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("big: %v, want it not written", err)
	}

	small, err := archivetest.SparseTar("small", 8192)
	if err != nil {
		t.Fatal(err)
	}
	if err := extractLocal(bytes.NewReader(small), dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "small")); err != nil || fi.Size() != 8192 {
		t.Errorf("small: %v, %v; want 8192 bytes", fi, err)
	}
}
