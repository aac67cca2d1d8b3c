package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// BenchmarkWake times a wake as a client sees it: from sleeping to the
// first exec answered (the exec wakes the sandbox), at 64 MiB and 512 MiB
// of incompressible memory (LOAM_BENCH_MIB overrides). It also reports the
// sleep call, a memory checkpoint taken asleep, the sleep image's size, and
// the host memory of the sleeping sandbox (the PSS of every host process
// naming it: none is left).
func BenchmarkWake(b *testing.B) {
	forBenchSizes(b, "64,512", benchWake)
}

func benchWake(b *testing.B, mib int) {
	d := harness.StartDaemonB(b, "--checkpoint-limit", "1000")
	ctx := context.Background()
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "nap", Public: true, Resources: &api.Resources{MemoryMiB: mib + 1024}})
	if err != nil {
		b.Fatal(err)
	}
	d.RunB(b, "nap", "sh", "-c", fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/blob bs=1M count=%d 2>/dev/null", mib))
	// A web server for the wake through the URL (busybox's httpd runs in
	// the background by itself).
	d.RunB(b, "nap", "sh", "-c", "mkdir -p /home/loam/www && echo up > /home/loam/www/index.html && httpd -p 8080 -h /home/loam/www")
	web := urlClient(d)
	awakePSS := sandboxPSS(b, sb.ID)
	var sleeps, wakes, urlWakes, cps []time.Duration
	var size int64
	var asleepKiB, procs int
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := d.C.Sleep(ctx, "nap"); err != nil {
			b.Fatal(err)
		}
		sleeps = append(sleeps, time.Since(start))
		size = dirSize(filepath.Join(d.DataDir, "sandboxes", sb.ID, "sleep"))
		procs = runscProcesses(sb.ID)
		asleepKiB = sleepingPSS(sb.ID)
		// A memory checkpoint of the sleeping sandbox reuses its image.
		start = time.Now()
		if _, err := d.C.CreateCheckpoint(ctx, "nap", api.CreateCheckpoint{}); err != nil {
			b.Fatal(err)
		}
		cps = append(cps, time.Since(start))

		start = time.Now()
		if _, err := d.C.Exec(ctx, "nap", client.ExecOptions{Cmd: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		wakes = append(wakes, time.Since(start))

		// Asleep again: this time the URL wakes it.
		if _, err := d.C.Sleep(ctx, "nap"); err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		code, body, _, err := fetch(ctx, web, "GET", sb.URL+"/index.html", nil, "")
		if err != nil || code != 200 || body != "up\n" {
			b.Fatalf("GET through the URL of a sleeping sandbox: %d %q %v", code, body, err)
		}
		urlWakes = append(urlWakes, time.Since(start))
	}
	b.ReportMetric(median(wakes), "wake-to-exec-ms")
	b.ReportMetric(median(urlWakes), "wake-to-http-ms")
	b.ReportMetric(median(sleeps), "sleep-call-ms")
	b.ReportMetric(median(cps), "asleep-mem-checkpoint-ms")
	b.ReportMetric(float64(size)/(1<<20), "image-MiB")
	b.ReportMetric(float64(awakePSS)/1024, "awake-host-MiB")
	b.ReportMetric(float64(asleepKiB)/1024, "asleep-host-MiB")
	b.ReportMetric(float64(procs), "asleep-procs")
}

// sleepingPSS is sandboxPSS without its failure when no process is left.
func sleepingPSS(id string) int {
	if runscProcesses(id) == 0 {
		return 0
	}
	total := 0
	for _, pid := range pids(id) {
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
