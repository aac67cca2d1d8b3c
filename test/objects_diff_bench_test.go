package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/objects"
	"loam.dev/loam/internal/objects/s3test"
	"loam.dev/loam/internal/store/postgres/pgtest"
)

// BenchmarkCheckpointDiff: what the object store holds of a checkpoint of
// a sandbox that changed 1%, 10% and 100% of its disk since its template
// (new files of random bytes, that share of the bytes the template's
// files hold): its archive, a diff against the template, beside the
// archive the same disk would be whole (as stored before diffs, measured
// of the disk the diff makes applied to the stored template), and the
// template, stored once for every checkpoint of it. Disk-only
// checkpoints: a memory image is stored whole either way. The template
// is the one the tests' daemons use (busybox, in CI); LOAM_BENCH_TEMPLATE
// names another.
func BenchmarkCheckpointDiff(b *testing.B) {
	tpl := os.Getenv("LOAM_BENCH_TEMPLATE")
	bucket := s3test.NewBucket(b, "diffbench/")
	store, err := objects.Open(b.Context(), bucket)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	a := startNode(b, pgtest.NewDatabase(b), "a", "", "--objects", bucket)
	ctx := context.Background()
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "tpl", Template: tpl}); err != nil {
		b.Fatal(err)
	}
	// The template's bytes: its files, as a fresh sandbox of it has them.
	out, errOut, code := runAs(a.Daemon, "root", "tpl", "sh", "-c", "du -sbx / | cut -f1")
	if code != 0 {
		b.Fatalf("du: %s", errOut)
	}
	used, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("template %q: %d bytes in its files", tpl, used)
	no := false
	for _, pct := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("%dpct", pct), func(b *testing.B) {
			for i := range b.N {
				name := fmt.Sprintf("diff%d-%d", pct, i)
				sb, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: name, Template: tpl})
				if err != nil {
					b.Fatal(err)
				}
				// In files of at most 1 MiB, as a disk's files are.
				write := fmt.Sprintf("n=%d; i=0; while [ $n -gt 0 ]; do c=$(( n < 1048576 ? n : 1048576 )); head -c $c /dev/urandom > /home/loam/f$i; n=$(( n - c )); i=$(( i + 1 )); done",
					used*int64(pct)/100)
				a.RunB(b, name, "sh", "-c", write)
				cp, err := a.C.CreateCheckpoint(ctx, name, api.CreateCheckpoint{Memory: &no, Wait: api.WaitStored})
				if err != nil {
					b.Fatal(err)
				}
				m := storedManifest(b, bucket, sb.ID, cp.ID)
				diff, base := m.Files["checkpoint.tar.zst"].Size, m.Files["base.tar.zst"].Size
				if base == 0 {
					b.Fatalf("%s's checkpoint is stored whole, not as a diff: %+v", name, m.Files)
				}
				unpacked, _ := unpackStored(b, store, m)
				var whole countingWriter
				if err := checkpoint.WriteArchive(ctx, &whole, checkpoint.Manifest{}, filepath.Join(unpacked, checkpoint.DiskEntry), ""); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(diff)/1024, "KiB-diff")
				b.ReportMetric(float64(whole)/1024, "KiB-whole")
				b.ReportMetric(float64(base)/1024, "KiB-template")
				b.ReportMetric(100*float64(diff)/float64(whole), "%-of-whole")
				b.Logf("changed %d%% (%d bytes) of %d: stored diff %d bytes, whole %d, template %d (once)",
					pct, used*int64(pct)/100, used, diff, int64(whole), base)
				if err := a.C.DeleteSandbox(ctx, name); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// countingWriter counts what is written to it.
type countingWriter int64

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}
