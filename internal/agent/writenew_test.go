package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteNewFollowsNoSymlink: the temp files of secret and identity
// files are made new, so a symlink a user planted at the temp name is
// neither written through nor chowned (os.WriteFile and os.Chown follow
// it).
func TestWriteNewFollowsNoSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "secret.loam-tmp")
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := writeNew(tmp, []byte("secret"), 0o400, 12345, 12345); err == nil {
		t.Error("writeNew wrote through a symlink")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("the symlink's target holds %q", b)
	}
	fi, err := os.Stat(target)
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("the target's mode: %v, %v", fi.Mode(), err)
	}
	fresh := filepath.Join(dir, "fresh")
	if err := writeNew(fresh, []byte("secret"), 0o400, -1, -1); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(fresh); err != nil || fi.Mode() != 0o400 {
		t.Errorf("fresh: %v, %v; want 0400", fi.Mode(), err)
	}
}
