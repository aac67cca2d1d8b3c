package crash

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// TestCrashMidCheckpoint kills the daemon while it writes a memory
// checkpoint: after the next start no half checkpoint is visible, no data
// of one is left, and the sandbox runs on and can be checkpointed again.
func TestCrashMidCheckpoint(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "crashy", Resources: &api.Resources{MemoryMiB: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("crashy", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/blob bs=1M count=384 2>/dev/null; echo before > /home/loam/f")
	cpDir := filepath.Join(d.DataDir, "checkpoints", sb.ID)
	go d.C.CreateCheckpoint(context.Background(), "crashy", api.CreateCheckpoint{Comment: "never"})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m, _ := filepath.Glob(filepath.Join(cpDir, ".tmp-*")); len(m) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the checkpoint never started")
		}
		time.Sleep(2 * time.Millisecond)
	}
	// runsc may still be writing the image it was asked for: it finishes
	// or fails, as it would after a real crash, before the next start.
	d.KillSettled()
	d.Start()

	cps, err := d.C.ListCheckpoints(ctx, "crashy")
	if err != nil {
		t.Fatal(err)
	}
	for _, cp := range cps {
		if _, err := os.Stat(filepath.Join(cpDir, cp.ID, "mem")); err != nil {
			t.Errorf("checkpoint %s is listed but its memory image is missing: %v", cp.ID, err)
		}
	}
	entries, _ := os.ReadDir(cpDir)
	for _, e := range entries {
		found := false
		for _, cp := range cps {
			found = found || cp.ID == e.Name()
		}
		if !found {
			t.Errorf("left behind in %s: %s", cpDir, e.Name())
		}
	}
	snaps, _ := os.ReadDir(filepath.Join(d.DataDir, "disk", "mnt", "snapshots"))
	if len(snaps) != len(cps) {
		t.Errorf("%d snapshots for %d checkpoints", len(snaps), len(cps))
	}

	got, err := d.C.GetSandbox(ctx, "crashy")
	if err != nil || got.State != api.StateRunning {
		t.Fatalf("after the crash: %v %+v", err, got)
	}
	if out := d.Run("crashy", "cat", "/home/loam/f"); out != "before\n" {
		t.Fatalf("file: %q", out)
	}
	cp, err := d.C.CreateCheckpoint(ctx, "crashy", api.CreateCheckpoint{Comment: "after"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cps) == 0 && cp.ID != "v2" {
		// v1 was spent by the checkpoint the crash cut short: ids are never reused.
		t.Errorf("new checkpoint is %s, want v2", cp.ID)
	}
	d.Run("crashy", "sh", "-c", "echo after > /home/loam/f")
	if _, err := d.C.RestoreCheckpoint(ctx, "crashy", cp.ID); err != nil {
		t.Fatal(err)
	}
	if out := d.Run("crashy", "cat", "/home/loam/f"); !strings.HasPrefix(out, "before") {
		t.Fatalf("after restore: %q", out)
	}
}

// TestBusy: an operation on a sandbox while another runs on it is refused
// with a conflict, and nothing is lost.
func TestBusy(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "busy", Resources: &api.Resources{MemoryMiB: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("busy", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/blob bs=1M count=256 2>/dev/null")
	done := make(chan error, 1)
	go func() {
		_, err := d.C.CreateCheckpoint(context.Background(), "busy", api.CreateCheckpoint{})
		done <- err
	}()
	cpDir := filepath.Join(d.DataDir, "checkpoints", sb.ID)
	for {
		if m, _ := filepath.Glob(filepath.Join(cpDir, ".tmp-*")); len(m) > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	status, body := d.Curl("DELETE", "/v1/sandboxes/busy", "")
	if status != 409 || !strings.Contains(body, `"code":"conflict"`) || !strings.Contains(body, "in progress") {
		t.Errorf("delete during a checkpoint: %d %s", status, body)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if cps, err := d.C.ListCheckpoints(ctx, "busy"); err != nil || len(cps) != 1 {
		t.Fatalf("%v %+v", err, cps)
	}
	if err := d.C.DeleteSandbox(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
}

// TestLostCheckpointData: a checkpoint whose data was lost while the
// daemon was down is no longer listed after it starts.
func TestLostCheckpointData(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "lossy"})
	if err != nil {
		t.Fatal(err)
	}
	f := false
	for _, req := range []api.CreateCheckpoint{{Memory: &f}, {}} {
		if _, err := d.C.CreateCheckpoint(ctx, "lossy", req); err != nil {
			t.Fatal(err)
		}
	}
	d.Stop()
	if err := os.RemoveAll(filepath.Join(d.DataDir, "checkpoints", sb.ID, "v2", "mem")); err != nil {
		t.Fatal(err)
	}
	d.Start()
	cps, err := d.C.ListCheckpoints(ctx, "lossy")
	if err != nil || len(cps) != 1 || cps[0].ID != "v1" {
		t.Fatalf("after losing v2's memory: %v %+v", err, cps)
	}
	if _, err := os.Stat(filepath.Join(d.DataDir, "checkpoints", sb.ID, "v2")); !os.IsNotExist(err) {
		t.Errorf("v2's directory is still there: %v", err)
	}
	if _, err := d.C.RestoreCheckpoint(ctx, "lossy", "v1"); err != nil {
		t.Fatal(err)
	}
}
