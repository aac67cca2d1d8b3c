package crash

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// TestPowerLoss cuts the power under a daemon right after the API
// acknowledged a memory checkpoint, and checks that the checkpoint is
// there after the reboot: its record listed, its files whole, and a
// restore to it works; so are a sandbox, a checkpoint template and a pool
// size acknowledged before it.
//
// The daemon's data dir is a btrfs filesystem on a loop device the test
// makes, with the kernel's periodic writeback off for the test (the
// vm.dirty_* sysctls, put back after) and a long commit interval, so what
// the daemon did not fsync stays in the page cache and never reaches the
// device. The cut: the daemon and its sandboxes are killed, and the loop
// device's backing file is copied as it is, which is what reached the
// device. The copy is mounted and a daemon started on it.
func TestPowerLoss(t *testing.T) {
	// Not parallel: it turns the kernel's periodic writeback off machine-wide (vm.dirty_*), and a sync by any other test would flush what it means to lose.
	ctx := harness.Ctx(t)
	work, err := os.MkdirTemp("", "loam-e2e-power-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	holdDirtyPages(t)

	img, mnt := filepath.Join(work, "disk.img"), filepath.Join(work, "mnt")
	must(t, "truncate", "-s", "4G", img)
	dev := strings.TrimSpace(must(t, "losetup", "--find", "--show", img))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	must(t, "mkfs.btrfs", "-q", dev)
	mountLoop(t, dev, mnt)

	d := &harness.Daemon{T: t, DataDir: filepath.Join(mnt, "data"), Subnet: harness.NextSubnet()}
	t.Cleanup(d.Destroy) // also on failure: the API, containers, netns, firewall
	// No pool ever makes a member: it would write and sync after the ack.
	flags := []string{"--disk-size-gib", "2", "--pool-reserve-mib", "100000000"}
	d.Start(flags...)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "durable"})
	if err != nil {
		t.Fatal(err)
	}
	// A checkpoint template and a pool, acknowledged before the last
	// checkpoint, are there after the cut too.
	first, err := d.C.CreateCheckpoint(ctx, "durable", api.CreateCheckpoint{Memory: new(bool)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateTemplate(ctx, "kept", "durable", first.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.SetCheckpointPool(ctx, "durable", first.ID, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "late"}); err != nil {
		t.Fatal(err)
	}
	d.Run("durable", "sh", "-c", "echo acked > /home/loam/f")
	cp, err := d.C.CreateCheckpoint(ctx, "durable", api.CreateCheckpoint{Name: "acked"})
	if err != nil {
		t.Fatal(err)
	}
	cpDir := filepath.Join("checkpoints", sb.ID, cp.ID)
	want := treeSums(t, filepath.Join(d.DataDir, cpDir))

	// A file nobody syncs: the cut must lose it, or the test shows nothing.
	if err := os.WriteFile(filepath.Join(mnt, "unsynced"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	// The cut: nothing of the daemon's writes anything any more, and what
	// reached the device is copied.
	d.Kill()
	pids := killUnder(t, mnt)
	saved := filepath.Join(work, "after.img")
	must(t, "cp", "--sparse=always", img, saved)
	waitReaped(t, pids)

	// The old machine is gone: its containers, mounts and device. Its
	// filesystem must be unmounted for good before the copy, which has
	// the same id, is mounted.
	d.Destroy()
	unmountOnce(t, mnt)
	must(t, "losetup", "-d", dev)

	// The machine boots again: the same data dir, on what the device held.
	dev2 := strings.TrimSpace(must(t, "losetup", "--find", "--show", saved))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev2).Run() })
	mountLoop(t, dev2, mnt)
	if _, err := os.Stat(filepath.Join(mnt, "unsynced")); err == nil {
		t.Fatal("the cut kept a file nobody synced (did something sync the whole machine?): it shows nothing")
	}
	d2 := &harness.Daemon{T: t, DataDir: filepath.Join(mnt, "data"), Subnet: d.Subnet}
	t.Cleanup(d2.Destroy)
	d2.Start(flags...)

	cps, err := d2.C.ListCheckpoints(ctx, "durable")
	if err != nil {
		t.Fatal(err)
	}
	if len(cps) != 2 || cps[1].ID != cp.ID {
		t.Fatalf("after the power loss the checkpoints are %+v, want %s, which the API acknowledged", cps, cp.ID)
	}
	got := treeSums(t, filepath.Join(d2.DataDir, cpDir))
	for name, sum := range want {
		if got[name] != sum {
			t.Errorf("checkpoint file %s: sha256 %q after the power loss, %q before", name, got[name], sum)
		}
	}
	if late, err := d2.C.GetSandbox(ctx, "late"); err != nil || late.State != api.StateRunning {
		t.Errorf("after the power loss the sandbox created before is %+v (%v), want it running again", late, err)
	}
	tpls, err := d2.C.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(tpls, func(tp api.Template) bool { return tp.Name == "kept" && tp.Ready }) {
		t.Errorf("after the power loss the templates are %+v, want kept", tpls)
	}
	if p, err := d2.C.CheckpointPool(ctx, "durable", first.ID); err != nil || p.Size != 1 {
		t.Errorf("after the power loss the pool is %+v (%v), want size 1", p, err)
	}
	if _, err := d2.C.RestoreCheckpoint(ctx, "durable", cp.ID); err != nil {
		t.Fatal(err)
	}
	if out := d2.Run("durable", "cat", "/home/loam/f"); out != "acked\n" {
		t.Errorf("after the restore: %q", out)
	}
}

// holdDirtyPages turns the kernel's periodic writeback off until the test
// ends, so that data nobody fsynced stays dirty in the page cache.
func holdDirtyPages(t *testing.T) {
	t.Helper()
	for name, value := range map[string]string{
		"/proc/sys/vm/dirty_expire_centisecs":    "360000",
		"/proc/sys/vm/dirty_writeback_centisecs": "0",
	} {
		old, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := os.WriteFile(name, old, 0o644); err != nil {
				t.Errorf("putting back %s: %v", name, err)
			}
		})
		if err := os.WriteFile(name, []byte(value), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// mountLoop mounts btrfs device dev at dir, with a commit interval longer
// than the test, until the test ends.
func mountLoop(t *testing.T, dev, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	must(t, "mount", "-o", "commit=300", dev, dir)
	t.Cleanup(func() {
		harness.UnmountUnder(dir)
		exec.Command("umount", "-l", dir).Run()
	})
}

// unmountOnce unmounts dir, waiting (10 s at most) for the lazy unmounts
// below it to let go.
func unmountOnce(t *testing.T, dir string) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, "umount "+dir, func() error {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
}

// killUnder kills, with SIGKILL, every process whose command line names
// a path under dir (the sandboxes' runsc processes), and waits (30 s at
// most) until none runs. It returns their pids.
func killUnder(t *testing.T, dir string) []int {
	t.Helper()
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), dir+"/") {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && pid != os.Getpid() {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				pids = append(pids, pid)
			}
		}
	}
	waitPids(t, pids, func(pid int) bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return true
		}
		i := strings.LastIndexByte(string(b), ')')
		return i > 0 && strings.HasPrefix(string(b[i:]), ") Z")
	})
	return pids
}

// waitReaped waits (30 s at most) until processes pids are reaped: runsc
// takes a zombie for a live sandbox.
func waitReaped(t *testing.T, pids []int) {
	t.Helper()
	waitPids(t, pids, func(pid int) bool { return syscall.Kill(pid, 0) != nil })
}

func waitPids(t *testing.T, pids []int, done func(pid int) bool) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, "the killed processes gone", func() error {
		for _, pid := range pids {
			if !done(pid) {
				return fmt.Errorf("process %d still there", pid)
			}
		}
		return nil
	})
}

// treeSums is the sha256 of each file under dir, by path relative to dir.
func treeSums(t *testing.T, dir string) map[string]string {
	t.Helper()
	sums := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		sums[rel] = hex.EncodeToString(h.Sum(nil))
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s: %v", dir, err)
	}
	if len(sums) == 0 {
		t.Fatalf("no files in %s", dir)
	}
	return sums
}

// must runs a command and returns its stdout, failing the test if it fails.
func must(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%s %v: %v: %s", name, args, err, stderr)
	}
	return string(out)
}
