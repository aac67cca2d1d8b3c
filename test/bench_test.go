package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// The benchmarks report what the issues ask to measure; they never pass or
// fail on a time. Run them with
//
//	go test ./test -run '^$' -bench . -benchtime 5x
//
// (root, runsc). Sizes of touched memory are set by LOAM_BENCH_MIB
// (default "64,512,2048").

// BenchmarkCreate: time to create a sandbox from a cached template, and
// time for `loam run NAME -- true` through the Go client and the CLI.
func BenchmarkCreate(b *testing.B) {
	d := harness.StartDaemonB(b)
	ctx := context.Background()
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "warm"}); err != nil {
		b.Fatal(err)
	}
	for _, tpl := range []string{"busybox", "base"} {
		b.Run("create-"+tpl, func(b *testing.B) { benchCreate(b, d, tpl) })
	}
	b.Run("exec-true", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if code, err := d.C.Exec(ctx, "warm", client.ExecOptions{Cmd: []string{"true"}}); err != nil || code != 0 {
				b.Fatal(code, err)
			}
		}
	})
	b.Run("cli-run-true", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, errOut, code := d.CLI("", "run", "warm", "--", "true"); code != 0 {
				b.Fatal(errOut)
			}
		}
	})
	b.Run("idle-memory", func(b *testing.B) {
		// Host memory (PSS of every host process of the sandbox) of an idle
		// sandbox; one sample per iteration.
		sb, err := d.C.GetSandbox(ctx, "warm")
		if err != nil {
			b.Fatal(err)
		}
		var kib int
		for i := 0; i < b.N; i++ {
			time.Sleep(200 * time.Millisecond)
			kib = sandboxPSS(b, sb.ID)
		}
		b.ReportMetric(float64(kib)/1024, "host-MiB")
	})
}

// BenchmarkExecRoundTrip: `true` through the Go client, one exec after
// another, as `loam bench` times it; p50-ms is the median (the issue's
// target is the median, and a mean is pulled up by the few slow ones a
// shared host gives).
func BenchmarkExecRoundTrip(b *testing.B) {
	d := harness.StartDaemonB(b)
	ctx := context.Background()
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "warm"}); err != nil {
		b.Fatal(err)
	}
	var took []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, _, code, err := d.C.Output(ctx, "warm", "true"); err != nil || code != 0 {
			b.Fatal(code, err)
		}
		took = append(took, time.Since(start))
	}
	b.ReportMetric(median(took), "p50-ms")
}

// BenchmarkDiskCheckpoint: a disk-only checkpoint of a running sandbox
// through the API (a sync through its agent, then a snapshot; no pause).
func BenchmarkDiskCheckpoint(b *testing.B) {
	d := harness.StartDaemonB(b, "--checkpoint-limit", "1000")
	ctx := context.Background()
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "warm"}); err != nil {
		b.Fatal(err)
	}
	memory := false
	var took []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := d.C.CreateCheckpoint(ctx, "warm", api.CreateCheckpoint{Memory: &memory}); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	b.ReportMetric(median(took), "p50-ms")
}

// benchCreate creates (and, untimed, deletes) sandboxes of a template that
// is built and imported already.
func benchCreate(b *testing.B, d *harness.Daemon, tpl string) {
	ctx := context.Background()
	// The first sandbox of a template imports it into the pool: not timed.
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "warm-" + tpl, Template: tpl}); err != nil && !errors.Is(err, api.ErrConflict) {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Template: tpl})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := d.C.DeleteSandbox(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkCheckpoint measures, for a sandbox holding N MiB of touched
// memory: the pause of a memory checkpoint, its size on disk, a restore in
// place, the time until a fork answers an exec, and host memory of 4 forks.
func BenchmarkCheckpoint(b *testing.B) {
	forBenchSizes(b, "64,512,2048", benchCheckpoint)
}

var pausedRE = regexp.MustCompile(`msg="memory checkpoint" sandbox=(sb-\w+) checkpoint=(\S+) paused_ms=(\d+)`)
var restoredRE = regexp.MustCompile(`msg=restored sandbox=(sb-\w+) checkpoint=(\S+) ms=(\d+)`)

func benchCheckpoint(b *testing.B, mib int) {
	d := harness.StartDaemonB(b, "--checkpoint-limit", "1000")
	ctx := context.Background()
	src, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src", Resources: &api.Resources{MemoryMiB: mib + 1024}})
	if err != nil {
		b.Fatal(err)
	}
	// Incompressible memory: random bytes in /dev/shm, a memory-backed tmpfs.
	d.RunB(b, "src", "sh", "-c", fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/blob bs=1M count=%d 2>/dev/null", mib))
	var pauses, checkpoints, restores, restoreCalls, forks []time.Duration
	var size int64
	for i := 0; i < b.N; i++ {
		start := time.Now()
		cp, err := d.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{})
		if err != nil {
			b.Fatal(err)
		}
		checkpoints = append(checkpoints, time.Since(start))
		pauses = append(pauses, logged(b, d, pausedRE, cp.ID))
		size = dirSize(filepath.Join(d.DataDir, "checkpoints", src.ID, cp.ID))

		start = time.Now()
		if _, err := d.C.RestoreCheckpoint(ctx, "src", cp.ID); err != nil {
			b.Fatal(err)
		}
		restoreCalls = append(restoreCalls, time.Since(start))
		restores = append(restores, logged(b, d, restoredRE, cp.ID))

		start = time.Now()
		f, err := d.C.Fork(ctx, "src", cp.ID, fmt.Sprintf("fork-%d", i))
		if err == nil {
			_, err = d.C.Exec(ctx, f.ID, client.ExecOptions{Cmd: []string{"true"}})
		}
		if err != nil {
			b.Fatal(err)
		}
		forks = append(forks, time.Since(start))
		if err := d.C.DeleteSandbox(ctx, f.ID); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(median(pauses), "pause-ms")
	// The whole call as a client sees it: pause, image, the new agent
	// token, syncing, and the record.
	b.ReportMetric(median(checkpoints), "checkpoint-call-ms")
	b.ReportMetric(float64(size)/(1<<20), "image-MiB")
	b.ReportMetric(median(restores), "restore-ms")
	// The whole call: the automatic checkpoint first, then the restore.
	b.ReportMetric(median(restoreCalls), "restore-call-ms")
	b.ReportMetric(median(forks), "fork-to-exec-ms")

	// Host memory of 4 forks of one checkpoint.
	cp, err := d.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{})
	if err != nil {
		b.Fatal(err)
	}
	var total int
	for i := range 4 {
		f, err := d.C.Fork(ctx, "src", cp.ID, fmt.Sprintf("four-%d", i))
		if err != nil {
			b.Fatal(err)
		}
		d.RunB(b, f.ID, "true")
		defer d.C.DeleteSandbox(ctx, f.ID)
	}
	time.Sleep(time.Second)
	sbs, _ := d.C.ListSandboxes(ctx, client.ListOptions{})
	for _, sb := range sbs {
		if strings.HasPrefix(sb.Name, "four-") {
			total += sandboxPSS(b, sb.ID)
		}
	}
	b.ReportMetric(float64(total)/1024, "4forks-host-MiB")
}

// logged finds the duration the daemon logged for a checkpoint.
func logged(b *testing.B, d *harness.Daemon, re *regexp.Regexp, cp string) time.Duration {
	for range 50 {
		for _, m := range re.FindAllStringSubmatch(d.Log.String(), -1) {
			if m[2] == cp {
				ms, _ := strconv.Atoi(m[3])
				return time.Duration(ms) * time.Millisecond
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Fatalf("no log line for %s", cp)
	return 0
}

func median(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return float64(s[len(s)/2].Microseconds()) / 1000
}

func dirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// sandboxPSS sums the proportional set size, in KiB, of every host process
// whose command line names the sandbox (runsc's sandbox and gofer).
func sandboxPSS(b *testing.B, id string) int {
	out, err := exec.Command("pgrep", "-f", id).Output()
	if err != nil {
		b.Fatalf("no processes for %s: %v", id, err)
	}
	total := 0
	for _, pid := range strings.Fields(string(out)) {
		raw, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "Pss:" {
				kib, _ := strconv.Atoi(f[1])
				total += kib
			}
		}
	}
	return total
}

// forBenchSizes runs bench as a sub-benchmark "mem=NMiB" for each size of
// touched memory in LOAM_BENCH_MIB (comma-separated MiB), or in def when it
// is unset.
func forBenchSizes(b *testing.B, def string, bench func(b *testing.B, mib int)) {
	sizes := os.Getenv("LOAM_BENCH_MIB")
	if sizes == "" {
		sizes = def
	}
	for _, s := range strings.Split(sizes, ",") {
		mib, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("mem=%dMiB", mib), func(b *testing.B) { bench(b, mib) })
	}
}

// BenchmarkAuthenticatedCall: what a call costs with the admin token and
// with an API key (a sha256 and a store lookup, the scope check, and for
// an exec its audit record written with an fsync), a get and an exec of
// `true`, the two credentials interleaved on one daemon; p50-ms and
// p99-ms per sub-benchmark.
func BenchmarkAuthenticatedCall(b *testing.B) {
	d := harness.StartDaemonB(b)
	ctx := context.Background()
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "warm"}); err != nil {
		b.Fatal(err)
	}
	key, err := d.C.CreateKey(ctx, api.CreateKey{Name: "bench", Scope: api.ScopeWrite})
	if err != nil {
		b.Fatal(err)
	}
	creds := []struct {
		name string
		c    *client.Client
	}{{"admin", d.C}, {"key", client.New(d.URL, key.Secret)}}
	calls := []struct {
		name string
		call func(c *client.Client) error
	}{
		{"get", func(c *client.Client) error { _, err := c.GetSandbox(ctx, "warm"); return err }},
		{"exec", func(c *client.Client) error { _, _, _, err := c.Output(ctx, "warm", "true"); return err }},
	}
	for _, call := range calls {
		for _, cred := range creds {
			b.Run(call.name+"/"+cred.name, func(b *testing.B) {
				var took []time.Duration
				for i := 0; i < b.N; i++ {
					start := time.Now()
					if err := call.call(cred.c); err != nil {
						b.Fatal(err)
					}
					took = append(took, time.Since(start))
				}
				slices.Sort(took)
				b.ReportMetric(median(took), "p50-ms")
				b.ReportMetric(float64(took[len(took)*99/100])/1e6, "p99-ms")
			})
		}
	}
}
