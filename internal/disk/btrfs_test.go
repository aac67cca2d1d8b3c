package disk_test

import (
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/disk/disktest"
)

func TestBtrfs(t *testing.T) {
	requireBtrfs(t)
	disktest.Run(t, func(t *testing.T) disk.Pool { return newBtrfs(t) })
}

// TestBtrfsReopen is a daemon restart: the pool is found mounted and
// reused, and after an unmount (a host reboot) it is mounted again with
// its volumes intact.
func TestBtrfsReopen(t *testing.T) {
	requireBtrfs(t)
	ctx := t.Context()
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "disk.img"), filepath.Join(dir, "mnt")
	p, err := disk.NewBtrfs(ctx, dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(context.Background()); err != nil {
			t.Errorf("destroying pool: %v", err)
		}
	})
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "f"), []byte("kept\n"), 0o644))
	must(t, p.ImportTemplate(ctx, "t", src))
	v, err := p.CreateVolume(ctx, "v", "t")
	must(t, err)
	must(t, p.Close())
	if !isMountPoint(t, mnt) {
		t.Fatal("Close unmounted the pool; running sandboxes need it")
	}

	p, err = disk.NewBtrfs(ctx, dir, 1<<30)
	must(t, err)
	if devs := loopDevicesOf(t, img); len(devs) != 1 {
		t.Errorf("after reopening a mounted pool, loop devices %q, want one", devs)
	}
	checkContent(t, filepath.Join(v, "f"), "kept\n")

	must(t, p.Unmount(ctx))
	if isMountPoint(t, mnt) {
		t.Error("still mounted after Unmount")
	}
	if devs := loopDevicesOf(t, img); len(devs) != 0 {
		t.Errorf("loop devices %q left after Unmount", devs)
	}

	p, err = disk.NewBtrfs(ctx, dir, 1<<30)
	must(t, err)
	checkContent(t, filepath.Join(v, "f"), "kept\n")
	if ok, err := p.HasTemplate(ctx, "t"); err != nil || !ok {
		t.Errorf("HasTemplate after remount = %v, %v; want true", ok, err)
	}

	must(t, p.Destroy(ctx))
	if devs := loopDevicesOf(t, img); len(devs) != 0 {
		t.Errorf("loop devices %q left after Destroy", devs)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("image after Destroy: %v, want it gone", err)
	}
}

// TestBtrfsOnBtrfs: a directory already on btrfs is used as it is, with
// no loop image.
func TestBtrfsOnBtrfs(t *testing.T) {
	outer := newBtrfs(t)
	ctx := t.Context()
	src := t.TempDir()
	must(t, outer.ImportTemplate(ctx, "t", src))
	root, err := outer.CreateVolume(ctx, "host", "t")
	must(t, err)

	dir := filepath.Join(root, "pool")
	p, err := disk.NewBtrfs(ctx, dir, 0)
	must(t, err)
	t.Cleanup(func() {
		if err := p.Destroy(context.Background()); err != nil {
			t.Errorf("destroying inner pool: %v", err)
		}
	})
	if _, err := os.Stat(filepath.Join(dir, "disk.img")); !os.IsNotExist(err) {
		t.Errorf("disk.img in a directory on btrfs: %v, want none", err)
	}
	disktestSmoke(t, p)
	if want := filepath.Join(dir, "volumes", "v"); p.VolumePath("v") != want {
		t.Errorf("VolumePath = %s, want %s", p.VolumePath("v"), want)
	}
}

// disktestSmoke checks a pool works at all: import, volume, snapshot, clone.
func disktestSmoke(t *testing.T, p disk.Pool) {
	t.Helper()
	ctx := t.Context()
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "f"), []byte("1\n"), 0o644))
	must(t, p.ImportTemplate(ctx, "t", src))
	v, err := p.CreateVolume(ctx, "v", "t")
	must(t, err)
	must(t, p.Snapshot(ctx, "v", "s"))
	must(t, os.WriteFile(filepath.Join(v, "f"), []byte("2\n"), 0o644))
	c, err := p.CloneSnapshot(ctx, "s", "c")
	must(t, err)
	checkContent(t, filepath.Join(c, "f"), "1\n")
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func checkContent(t testing.TB, path, want string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil || string(data) != want {
		t.Errorf("%s = %q, %v; want %q", path, data, err, want)
	}
}

// TestBtrfsDestroyBusy: a test that fails with a file still open in its
// pool must not leave the pool mounted or its loop device attached.
func TestBtrfsDestroyBusy(t *testing.T) {
	requireBtrfs(t)
	ctx := t.Context()
	dir := t.TempDir()
	p, err := disk.NewBtrfs(ctx, dir, 1<<30)
	must(t, err)
	disktestSmoke(t, p)
	f, err := os.Open(filepath.Join(p.VolumePath("v"), "f"))
	must(t, err)
	defer f.Close()

	must(t, p.Destroy(ctx))
	if isMountPoint(t, filepath.Join(dir, "mnt")) {
		t.Error("still mounted after Destroy")
	}
	f.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		devs := loopDevicesUnder(t, dir)
		if len(devs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("loop devices %q still attached after the last file closed", devs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// loopDevicesUnder lists loop devices whose backing file is under dir,
// deleted or not.
func loopDevicesUnder(t testing.TB, dir string) []string {
	t.Helper()
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	must(t, err)
	var devs []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(string(data), dir+"/") {
			devs = append(devs, f)
		}
	}
	return devs
}

// TestBtrfsUsageMatchesDu: Usage, which walks the volume itself, counts
// what `btrfs filesystem du` counts as exclusive: data no other file or
// subvolume shares, hard links once, inline data not at all.
func TestBtrfsUsageMatchesDu(t *testing.T) {
	p := newBtrfs(t)
	ctx := t.Context()
	src := t.TempDir()
	big := make([]byte, 1<<20)
	_, _ = rand.Read(big)
	must(t, os.WriteFile(filepath.Join(src, "shared"), big, 0o644))
	must(t, p.ImportTemplate(ctx, "t", src))
	v, err := p.CreateVolume(ctx, "v", "t")
	must(t, err)

	_, _ = rand.Read(big)
	must(t, os.MkdirAll(filepath.Join(v, "a/b"), 0o755))
	must(t, os.WriteFile(filepath.Join(v, "a/b/own"), big, 0o644))
	must(t, os.Link(filepath.Join(v, "a/b/own"), filepath.Join(v, "own-link")))
	must(t, os.WriteFile(filepath.Join(v, "inline"), []byte("tiny\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(v, "a/alone"), big[:256<<10], 0o644))
	must(t, os.Symlink("a/b/own", filepath.Join(v, "symlink")))
	if out, err := exec.Command("cp", "--reflink=always", filepath.Join(v, "a/b/own"), filepath.Join(v, "reflink")).CombinedOutput(); err != nil {
		t.Fatalf("cp --reflink: %v: %s", err, out)
	}
	must(t, exec.Command("sync", "-f", v).Run())

	got, err := p.Usage(ctx, "v")
	must(t, err)
	out, err := exec.Command("btrfs", "filesystem", "du", "-s", "--raw", v).Output()
	must(t, err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	fields := strings.Fields(lines[len(lines)-1])
	want, err := strconv.ParseInt(fields[1], 10, 64)
	must(t, err)
	if got != want {
		t.Errorf("Usage = %d, btrfs filesystem du says %d exclusive", got, want)
	}
	// Only a/alone counts: the template's file is shared with the
	// template, a/b/own with its reflinked copy.
	if got < 256<<10 || got >= 1<<20 {
		t.Errorf("Usage = %d, want a/alone's %d bytes and nothing shared", got, 256<<10)
	}
}
