package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// BenchmarkScale is how many idle sandboxes one host holds. It runs only
// when LOAM_SCALE_RUNNING is set (it takes minutes and most of the host):
// it creates that many sandboxes of LOAM_SCALE_TEMPLATE (base by default)
// one after another, logging the create time of every 25th, and reports
// the create time of the last one and the host memory (PSS of every host
// process naming a sandbox) per sandbox; then it puts every one to sleep
// and reports the sleep images' disk per sandbox and the host memory left.
// With LOAM_SCALE_SLEEPING above that, it goes on creating sandboxes and
// putting each to sleep until that many are asleep, and times waking the
// last.
func BenchmarkScale(b *testing.B) {
	n, _ := strconv.Atoi(os.Getenv("LOAM_SCALE_RUNNING"))
	if n <= 0 {
		b.Skip("set LOAM_SCALE_RUNNING to the number of sandboxes to run")
	}
	tpl := os.Getenv("LOAM_SCALE_TEMPLATE")
	if tpl == "" {
		tpl = "base"
	}
	for i := 0; i < b.N; i++ {
		// A /16: the harness's /24 holds 64 sandboxes.
		d := harness.StartDaemonB(b, "--default-template", tpl, "--disk-size-gib", "64", "--subnet", "10.74.0.0/16")
		ctx := context.Background()
		ids := make([]string, 0, n)
		var last time.Duration
		for j := range n {
			start := time.Now()
			sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: fmt.Sprintf("s%04d", j)})
			if err != nil {
				b.Fatalf("sandbox %d of %d: %v", j+1, n, err)
			}
			if _, _, code, err := d.C.Output(ctx, sb.ID, "true"); err != nil || code != 0 {
				b.Fatalf("sandbox %d of %d does not answer: %d %v", j+1, n, code, err)
			}
			last = time.Since(start)
			ids = append(ids, sb.ID)
			if (j+1)%25 == 0 {
				b.Logf("%d running; the last create answered in %v", j+1, last)
			}
		}
		time.Sleep(5 * time.Second) // let the boots settle
		var pss int
		for _, id := range ids {
			pss += sandboxPSS(b, id)
		}
		b.ReportMetric(float64(n), "running")
		b.ReportMetric(float64(last.Microseconds())/1000, "last-create-ms")
		b.ReportMetric(float64(pss)/1024/float64(n), "pss-MiB/sandbox")
		b.ReportMetric(float64(pss)/1024/1024, "pss-GiB-total")

		start := time.Now()
		for _, id := range ids {
			if _, err := d.C.Sleep(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(time.Since(start).Milliseconds())/float64(n), "sleep-ms/sandbox")
		var disk int64
		left := 0
		for _, id := range ids {
			disk += dirSize(filepath.Join(d.DataDir, "sandboxes", id, "sleep"))
			left += sleepingPSS(id)
		}
		b.ReportMetric(float64(disk)/(1<<20)/float64(n), "sleep-image-MiB/sandbox")
		b.ReportMetric(float64(left)/1024, "asleep-pss-MiB-total")

		// More, each put to sleep once it answers, up to LOAM_SCALE_SLEEPING
		// asleep; then one of them is woken.
		total, _ := strconv.Atoi(os.Getenv("LOAM_SCALE_SLEEPING"))
		for j := n; j < total; j++ {
			sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: fmt.Sprintf("s%04d", j)})
			if err != nil {
				b.Fatalf("sandbox %d of %d: %v", j+1, total, err)
			}
			if _, _, code, err := d.C.Output(ctx, sb.ID, "true"); err != nil || code != 0 {
				b.Fatalf("sandbox %d of %d does not answer: %d %v", j+1, total, code, err)
			}
			if _, err := d.C.Sleep(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			ids = append(ids, sb.ID)
			if (j+1)%100 == 0 {
				b.Logf("%d asleep", j+1)
			}
		}
		if total > n {
			start := time.Now()
			if _, _, code, err := d.C.Output(ctx, ids[len(ids)-1], "true"); err != nil || code != 0 {
				b.Fatalf("waking the last one: %d %v", code, err)
			}
			b.ReportMetric(float64(len(ids)), "asleep")
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "wake-last-ms")
			disk = 0
			for _, id := range ids {
				disk += dirSize(filepath.Join(d.DataDir, "sandboxes", id, "sleep"))
			}
			b.ReportMetric(float64(disk)/(1<<30), "sleep-images-GiB-total")
		}
		for _, id := range ids {
			if err := d.C.DeleteSandbox(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	}
}
