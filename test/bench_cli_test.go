package test

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/bench"
	"loam.dev/loam/test/harness"
)

// TestBenchCLI runs `loam bench` with its smallest settings against a real
// daemon and real raw runsc, and checks that the JSON is sane: every row
// asked for, for both drivers, with positive values and a ratio. Times are
// never pass or fail. That a wrong memory answer fails the run is
// internal/bench's TestRunFailsOnChecksumMismatch and TestVerify.
func TestBenchCLI(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t, "--checkpoint-limit", "100")
	plot := filepath.Join(t.TempDir(), "bench.svg")
	cmd := exec.Command(harness.LoamBin, "bench", "--sizes", "16", "--reps", "1", "--ops", "create,exec,checkpoint,fork",
		"--templates", "busybox", "--runsc", harness.Runsc(), "--template-cache", harness.TemplateCache(),
		"--data-dir", d.DataDir, "--json", "--plot", plot)
	// The raw driver's state goes under TMPDIR: it must be empty after.
	tmp := t.TempDir()
	cmd.Env = append(os.Environ(), "LOAM_API_URL="+d.URL, "LOAM_TOKEN="+d.Token, "TMPDIR="+tmp)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("loam bench: %v\n%s", err, stderr.String())
	}
	var res bench.Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("loam bench --json: %v\n%s", err, out)
	}
	rows := map[string]bench.Row{}
	for _, r := range res.Rows {
		rows[r.Op] = r
	}
	for _, op := range []string{"create/busybox", "exec", "checkpoint", "checkpoint-pause", "checkpoint-image", "fork", "fork-pss", "fork-rss", "fork-disk"} {
		r, ok := rows[op]
		if !ok {
			t.Errorf("no row %s in %s", op, out)
			continue
		}
		if r.Raw == nil || r.Ratio == nil || math.IsNaN(*r.Ratio) || *r.Ratio <= 0 {
			t.Errorf("%s: no raw runsc value or ratio: %+v", op, r)
			continue
		}
		for _, s := range []bench.Summary{r.Loam, *r.Raw} {
			if s.N == 0 || s.Min <= 0 || s.Min > s.Median || s.Median > s.Max {
				t.Errorf("%s: insane summary %+v", op, s)
			}
		}
	}
	if r := rows["exec"]; r.Loam.N != 10 || r.Raw.N != 10 {
		t.Errorf("exec: %d and %d samples, want 10 each", r.Loam.N, r.Raw.N)
	}
	// 16 MiB of incompressible memory cannot make a smaller image, and a
	// sandbox holding it uses more host memory than that.
	for _, op := range []string{"checkpoint-image", "fork-pss"} {
		if r := rows[op]; r.Loam.Median < 16 || r.Raw.Median < 16 {
			t.Errorf("%s: loam %g MiB, raw %g MiB; want at least 16", op, r.Loam.Median, r.Raw.Median)
		}
	}
	if b, err := os.ReadFile(plot); err != nil || !strings.Contains(string(b), "<svg") {
		t.Errorf("plot: %v, %.100s", err, b)
	}
	// Nothing left: no sandbox in the daemon, no raw container.
	if sbs, err := d.C.ListSandboxes(t.Context(), client.ListOptions{}); err != nil || len(sbs) != 0 {
		t.Errorf("sandboxes left: %v %v", sbs, err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("raw runsc's directory left: %v", left)
	}
}

// TestBenchChecker runs the bench's workload and memory check in a real
// sandbox: the check passes on the memory the workload wrote and fails,
// saying so, once one byte of it changed. A fast wrong answer fails a run.
func TestBenchChecker(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := t.Context()
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "chk"}); err != nil {
		t.Fatal(err)
	}
	loam := "/.loam/loam"
	if _, err := d.C.CreateSession(ctx, "chk", api.ExecRequest{Cmd: []string{loam, "bench", "workload", "--mib", "4"}, Detachable: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, _, code, err := d.C.Output(ctx, "chk", "test", "-e", "/dev/shm/ready"); err == nil && code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the workload did not get ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.Run("chk", loam, "bench", "check")
	// A byte that differs from the one there (the workload's bytes are
	// random: an "x" written over an "x", 1 time in 256, changed nothing).
	d.Run("chk", "sh", "-c", `b=$(dd if=/dev/shm/blob bs=1 skip=1000 count=1 2>/dev/null); c=x; [ "$b" = x ] && c=y; printf $c | dd of=/dev/shm/blob bs=1 seek=1000 conv=notrunc 2>/dev/null`)
	_, errOut, code, err := d.C.Output(ctx, "chk", loam, "bench", "check")
	if err != nil || code == 0 || !strings.Contains(string(errOut), "checksum mismatch") {
		t.Fatalf("check of changed memory: code %d, err %v, stderr %q", code, err, errOut)
	}
}
