package test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// diskLimit is the disk limit of the sandboxes below, in MiB (the least a
// sandbox may have), and chunk what each writes at a time, just under it.
const (
	diskLimit = 256
	chunk     = 240
)

// TestDiskLimitCheckpointLoop is issue 20's way past a disk limit: a
// sandbox writes 240 MiB under a 256 MiB limit, checkpoints its disk from
// inside, restores to it, deletes it, and again. Under btrfs simple quotas
// each restored disk started at nothing used, and 4 rounds held 961 MiB.
// The limit must hold (ENOSPC), the reported use must be what du counts
// inside, and the pool must grow by no more than the limit once the
// checkpoints are gone.
func TestDiskLimitCheckpointLoop(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	mnt := filepath.Join(d.DataDir, "disk", "mnt")
	before := poolUsed(t, mnt)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "loop", Resources: &api.Resources{DiskMiB: diskLimit}}); err != nil {
		t.Fatal(err)
	}
	for round := 1; round <= 4; round++ {
		errb, code := fillDisk(t, d, "loop", "data"+strconv.Itoa(round), chunk)
		if full := code != 0; full != (round > 1) || (full && !strings.Contains(errb, "No space left on device")) {
			t.Errorf("round %d: dd of %d MiB: code %d, %q; want it whole in round 1 only, then No space left on device", round, chunk, code, errb)
		}
		cp := strings.TrimSpace(d.Run("loop", "loam", "checkpoint", "create", "--disk-only"))
		// A file deleted after the checkpoint (a full disk takes no new
		// one) is back once the restore is done.
		d.Run("loop", "rm", "/home/loam/data1")
		// The restore stops the sandbox, and the exec stream with it: run
		// it from a process of its own, and wait for the disk to be back.
		d.Run("loop", "sh", "-c", "setsid loam checkpoint restore -y "+cp+" </dev/null >/dev/null 2>&1 &")
		waitFor(t, func() bool {
			_, _, code, err := d.C.Output(ctx, "loop", "test", "-e", "/home/loam/data1")
			return err == nil && code == 0
		})
		d.Run("loop", "loam", "checkpoint", "rm", "-y", cp)
	}
	if errb, code := fillDisk(t, d, "loop", "more", 8); code == 0 || !strings.Contains(errb, "No space left on device") {
		t.Errorf("dd of 8 MiB more after the loop: code %d, %q; want No space left on device", code, errb)
	}
	used, du := useAndDu(t, d, "loop")
	t.Logf("after 4 rounds: %d bytes held against the %d MiB limit (du inside: %d)", used, diskLimit, du)
	if used < (diskLimit-8)<<20 || used > diskLimit<<20 {
		t.Errorf("reported use %d, want about the limit %d MiB", used, diskLimit)
	}
	if diff := used - du; diff < -4<<20 || diff > 4<<20 {
		t.Errorf("reported use %d, du inside %d: more than 4 MiB apart", used, du)
	}
	// With every checkpoint gone, what is left of the sandbox is its disk.
	cps, err := d.C.ListCheckpoints(ctx, "loop")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the pool grew by %d bytes with the %d checkpoints the restores kept", poolUsed(t, mnt)-before, len(cps))
	for _, cp := range cps {
		if err := d.C.DeleteCheckpoint(ctx, "loop", cp.ID); err != nil {
			t.Fatal(err)
		}
	}
	grown := poolUsed(t, mnt) - before
	t.Logf("the pool grew by %d bytes once its %d checkpoints were deleted", grown, len(cps))
	if grown > (diskLimit+32)<<20 {
		t.Errorf("the pool grew by %d bytes, more than the %d MiB limit", grown, diskLimit)
	}
}

// TestDiskLimitRestoreFork: the owner's restore of a disk-only checkpoint
// and a fork of it hold the checkpoint's data, and count it: neither
// starts with its whole limit free again. A sandbox made from a template
// kept from the checkpoint is limited too (it had no limit at all), the
// template's data being its base, free as any template's.
func TestDiskLimitRestoreFork(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src", Resources: &api.Resources{DiskMiB: diskLimit}}); err != nil {
		t.Fatal(err)
	}
	if errb, code := fillDisk(t, d, "src", "data", chunk); code != 0 {
		t.Fatalf("dd of %d MiB: code %d, %q", chunk, code, errb)
	}
	memory := false
	cp, err := d.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Memory: &memory})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.RestoreCheckpoint(ctx, "src", cp.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.Fork(ctx, "src", cp.ID, "fork"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateTemplate(ctx, "kept", "src", cp.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "tpl", Template: "kept", Resources: &api.Resources{DiskMiB: diskLimit}}); err != nil {
		t.Fatal(err)
	}
	if errb, code := fillDisk(t, d, "tpl", "more", diskLimit+44); code == 0 || !strings.Contains(errb, "No space left on device") {
		t.Errorf("tpl: dd of %d MiB: code %d, %q; want No space left on device", diskLimit+44, code, errb)
	}
	for _, sb := range []string{"src", "fork"} {
		if errb, code := fillDisk(t, d, sb, "more", 64); code == 0 || !strings.Contains(errb, "No space left on device") {
			t.Errorf("%s: dd of 64 MiB more: code %d, %q; want No space left on device", sb, code, errb)
		}
		used, du := useAndDu(t, d, sb)
		t.Logf("%s: %d bytes held against the %d MiB limit (du inside: %d)", sb, used, diskLimit, du)
		if used < (diskLimit-8)<<20 || used > diskLimit<<20 {
			t.Errorf("%s: reported use %d, want about the limit %d MiB", sb, used, diskLimit)
		}
		if diff := used - du; diff < -4<<20 || diff > 4<<20 {
			t.Errorf("%s: reported use %d, du inside %d: more than 4 MiB apart", sb, used, du)
		}
	}
}

// fillDisk writes mib MiB of zeros to /home/loam/file in sandbox sb with
// dd, which stops at the first error, and returns dd's stderr and exit code.
func fillDisk(t *testing.T, d *harness.Daemon, sb, file string, mib int) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, errb, code, err := d.C.Output(ctx, sb, "dd", "if=/dev/zero", "of=/home/loam/"+file, "bs=1M",
		"count="+strconv.Itoa(mib), "conv=fsync")
	if err != nil {
		t.Fatal(err)
	}
	return string(errb), code
}

// useAndDu is sandbox sb's disk use as the daemon reports it, brought up to
// date by a checkpoint (which commits the filesystem, and is deleted
// again), and what du counts on its disk inside, in bytes.
func useAndDu(t *testing.T, d *harness.Daemon, sb string) (used, du int64) {
	t.Helper()
	ctx := harness.Ctx(t)
	memory := false
	cp, err := d.C.CreateCheckpoint(ctx, sb, api.CreateCheckpoint{Memory: &memory})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.C.DeleteCheckpoint(ctx, sb, cp.ID); err != nil {
		t.Fatal(err)
	}
	s, err := d.C.GetSandbox(ctx, sb)
	if err != nil {
		t.Fatal(err)
	}
	if s.Disk == nil || s.Disk.UsedBytes == nil || !s.Disk.Enforced {
		t.Fatalf("%s: disk %+v, want its use, enforced", sb, derefDisk(s.Disk))
	}
	out, errb, code := runAs(d, "root", sb, "du", "-skx", "/")
	if code != 0 {
		t.Fatalf("du inside %s: code %d, %q", sb, code, errb)
	}
	kib, err := strconv.ParseInt(strings.Fields(out)[0], 10, 64)
	if err != nil {
		t.Fatalf("du inside %s: %q", sb, out)
	}
	return *s.Disk.UsedBytes, kib << 10
}

// poolUsed is the space used in the disk pool mounted at mnt, once the
// filesystem has committed and finished deleting what was deleted.
func poolUsed(t *testing.T, mnt string) int64 {
	t.Helper()
	if out, err := exec.Command("btrfs", "subvolume", "sync", mnt).CombinedOutput(); err != nil {
		t.Fatalf("btrfs subvolume sync: %v: %s", err, out)
	}
	if out, err := exec.Command("btrfs", "filesystem", "sync", mnt).CombinedOutput(); err != nil {
		t.Fatalf("btrfs filesystem sync: %v: %s", err, out)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}
