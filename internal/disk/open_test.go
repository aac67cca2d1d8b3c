package disk_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"loam.dev/loam/internal/disk"
)

func TestOpenForced(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	t.Setenv(disk.EnvDisk, disk.KindCopy)
	p, err := disk.Open(ctx, dir, 1<<30)
	must(t, err)
	if p.Kind() != disk.KindCopy {
		t.Fatalf("Kind = %s with %s=%s", p.Kind(), disk.EnvDisk, disk.KindCopy)
	}

	// The directory remembers its kind, so a restart without the variable
	// does not switch to btrfs and lose every volume.
	t.Setenv(disk.EnvDisk, "")
	p, err = disk.Open(ctx, dir, 1<<30)
	must(t, err)
	if p.Kind() != disk.KindCopy {
		t.Errorf("reopened as %s, want %s", p.Kind(), disk.KindCopy)
	}
	t.Setenv(disk.EnvDisk, disk.KindBtrfs)
	if p, err := disk.Open(ctx, dir, 1<<30); err == nil {
		t.Errorf("opened a copy pool as %s", p.Kind())
	}
	if _, err := disk.NewBtrfs(ctx, dir, 1<<30); err == nil {
		t.Error("NewBtrfs opened a copy pool")
	}
}

func TestOpenBadEnv(t *testing.T) {
	t.Setenv(disk.EnvDisk, "zfs")
	if _, err := disk.Open(t.Context(), t.TempDir(), 1<<30); err == nil {
		t.Errorf("Open with %s=zfs succeeded", disk.EnvDisk)
	}
}

// TestOpenPicksBtrfs: on a machine with btrfs, Open uses it.
func TestOpenPicksBtrfs(t *testing.T) {
	requireBtrfs(t)
	t.Setenv(disk.EnvDisk, "")
	p, err := disk.Open(t.Context(), t.TempDir(), 1<<30)
	must(t, err)
	if b, ok := p.(*disk.Btrfs); ok {
		t.Cleanup(func() {
			if err := b.Destroy(context.Background()); err != nil {
				t.Errorf("destroying pool: %v", err)
			}
		})
	}
	if p.Kind() != disk.KindBtrfs {
		t.Fatalf("Kind = %s, want %s", p.Kind(), disk.KindBtrfs)
	}
}

// TestOpenFallsBack: when btrfs fails (here: an image too small to
// format), Open makes a copy pool and leaves no trace of the attempt.
func TestOpenFallsBack(t *testing.T) {
	requireBtrfs(t)
	t.Setenv(disk.EnvDisk, "")
	dir := t.TempDir()
	p, err := disk.Open(t.Context(), dir, 1<<20)
	must(t, err)
	if p.Kind() != disk.KindCopy {
		t.Fatalf("Kind = %s, want %s", p.Kind(), disk.KindCopy)
	}
	for _, name := range []string{"disk.img", "disk.img.new"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s after falling back: %v, want none", name, err)
		}
	}
	if devs := loopDevicesUnder(t, dir); len(devs) != 0 {
		t.Errorf("loop devices %q left", devs)
	}
}
