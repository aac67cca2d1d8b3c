package disk_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/testenv"
)

func requireBtrfs(t testing.TB) {
	t.Helper()
	testenv.Root(t)
	for _, tool := range []string{"btrfs", "mkfs.btrfs", "losetup"} {
		testenv.Tool(t, tool) // from btrfs-progs and util-linux
	}
}

// newBtrfs makes a btrfs pool on a small loop image in a temporary
// directory, unmounted and detached when the test ends, also on failure.
func newBtrfs(t testing.TB) *disk.Btrfs {
	t.Helper()
	return newBtrfsSized(t, 1<<30)
}

// newBtrfsSized is newBtrfs with an image of size bytes (sparse).
func newBtrfsSized(t testing.TB, size int64) *disk.Btrfs {
	t.Helper()
	return newBtrfsQuotas(t, size, disk.QuotaClassic)
}

// newBtrfsQuotas is newBtrfsSized with quotas of mode turned on (see
// disk.NewBtrfsWithQuotas).
func newBtrfsQuotas(t testing.TB, size int64, mode string) *disk.Btrfs {
	t.Helper()
	requireBtrfs(t)
	p, err := disk.NewBtrfsWithQuotas(context.Background(), t.TempDir(), size, mode)
	if err != nil {
		t.Fatal(err)
	}
	// Registered after TempDir's removal, so it runs before it: removing
	// a mounted pool's directory would delete through the mount.
	t.Cleanup(func() {
		if err := p.Destroy(context.Background()); err != nil {
			t.Errorf("destroying pool: %v", err)
		}
	})
	return p
}

func newCopy(t testing.TB) *disk.Copy {
	t.Helper()
	p, err := disk.NewCopy(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// loopDevicesOf lists the loop devices backed by file, as losetup sees them.
func loopDevicesOf(t testing.TB, file string) []string {
	t.Helper()
	out, err := exec.Command("losetup", "-j", file).Output()
	if err != nil {
		t.Fatalf("losetup -j %s: %v", file, err)
	}
	var devs []string
	for line := range strings.Lines(string(out)) {
		if dev, _, ok := strings.Cut(line, ":"); ok {
			devs = append(devs, dev)
		}
	}
	return devs
}

// isMountPoint reports whether path is mounted on, from /proc/self/mountinfo.
func isMountPoint(t testing.TB, path string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}
