package crash

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	// The kill must come while the checkpoint writes its image (.tmp-*).
	// A look that misses it (the host busy) finds the checkpoint done
	// instead: take another. Each try spends an id.
	tries := 0
	for {
		tries++
		taken := make(chan struct{})
		go func() {
			defer close(taken)
			d.C.CreateCheckpoint(context.Background(), "crashy", api.CreateCheckpoint{Comment: "never"})
		}()
		if harness.Seen(filepath.Join(cpDir, ".tmp-*"), taken) {
			break
		}
		if tries == 5 {
			t.Fatal("the checkpoint's image was never seen being written (5 tries)")
		}
		t.Logf("the checkpoint ended before it was seen writing its image (try %d); again", tries)
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
	if want := fmt.Sprintf("v%d", tries+1); len(cps) < tries && cp.ID != want {
		// The id of the checkpoint the crash cut short was spent: ids
		// are never reused.
		t.Errorf("new checkpoint is %s, want %s", cp.ID, want)
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
	cpDir := filepath.Join(d.DataDir, "checkpoints", sb.ID)
	// The delete must come while the checkpoint runs (its image being
	// written); one that ended before a look saw it is taken again.
	var done chan error
	tries := 0
	for {
		tries++
		done = make(chan error, 1)
		taken := make(chan struct{})
		go func() {
			_, err := d.C.CreateCheckpoint(context.Background(), "busy", api.CreateCheckpoint{})
			done <- err
			close(taken)
		}()
		if harness.Seen(filepath.Join(cpDir, ".tmp-*"), taken) {
			break
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if tries == 5 {
			t.Fatal("the checkpoint's image was never seen being written (5 tries)")
		}
		t.Logf("the checkpoint ended before it was seen writing its image (try %d); again", tries)
	}
	status, body := d.Curl("DELETE", "/v1/sandboxes/busy", "")
	if status != 409 || !strings.Contains(body, `"code":"conflict"`) || !strings.Contains(body, "in progress") {
		t.Errorf("delete during a checkpoint: %d %s", status, body)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if cps, err := d.C.ListCheckpoints(ctx, "busy"); err != nil || len(cps) != tries {
		t.Fatalf("%d checkpoints taken: %v %+v", tries, err, cps)
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
