package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// BenchmarkTemplate measures, for a memory template of a sandbox holding N
// MiB of touched, incompressible memory (LOAM_BENCH_MIB, default "64,512"):
// the time from a create of a sandbox of the template until it answers an
// exec, beside a fork of the same checkpoint; and the throughput of an
// export and of an import of the template (MiB of its content, disk and
// memory image, per second, through the Go client and a file).
//
//	go test ./test -run '^$' -bench Template -benchtime 5x
func BenchmarkTemplate(b *testing.B) {
	forBenchSizes(b, "64,512", benchTemplate)
}

func benchTemplate(b *testing.B, mib int) {
	d := harness.StartDaemonB(b)
	ctx := context.Background()
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src", Resources: &api.Resources{MemoryMiB: mib + 1024}}); err != nil {
		b.Fatal(err)
	}
	d.RunB(b, "src", "sh", "-c", fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/blob bs=1M count=%d 2>/dev/null", mib))
	cp, err := d.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{})
	if err != nil {
		b.Fatal(err)
	}
	tpl, err := d.C.CreateTemplate(ctx, "warm", "src", cp.ID)
	if err != nil {
		b.Fatal(err)
	}
	contentMiB := float64(tpl.SizeBytes) / (1 << 20)
	archive := filepath.Join(b.TempDir(), "warm.tar.zst")

	var creates, forks, exports, imports []time.Duration
	var archiveBytes int64
	for i := 0; i < b.N; i++ {
		start := time.Now()
		sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Template: "warm"})
		if err == nil {
			_, err = d.C.Exec(ctx, sb.ID, client.ExecOptions{Cmd: []string{"true"}})
		}
		if err != nil {
			b.Fatal(err)
		}
		creates = append(creates, time.Since(start))
		if err := d.C.DeleteSandbox(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}

		start = time.Now()
		f, err := d.C.Fork(ctx, "src", cp.ID, "")
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

		out, err := os.Create(archive)
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		archiveBytes, err = d.C.ExportTemplate(ctx, "warm", out)
		if err == nil {
			err = out.Sync()
		}
		exports = append(exports, time.Since(start))
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			b.Fatal(err)
		}

		in, err := os.Open(archive)
		if err != nil {
			b.Fatal(err)
		}
		name := fmt.Sprintf("copy-%d", i)
		start = time.Now()
		_, err = d.C.ImportTemplate(ctx, name, in)
		imports = append(imports, time.Since(start))
		in.Close()
		if err != nil {
			b.Fatal(err)
		}
		if err := d.C.DeleteTemplate(ctx, name); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(median(creates), "template-to-exec-ms")
	b.ReportMetric(median(forks), "fork-to-exec-ms")
	b.ReportMetric(contentMiB, "content-MiB")
	b.ReportMetric(float64(archiveBytes)/(1<<20), "archive-MiB")
	b.ReportMetric(contentMiB/(median(exports)/1000), "export-MiB/s")
	b.ReportMetric(contentMiB/(median(imports)/1000), "import-MiB/s")
}
