package checkpoint

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// benchFile is size bytes like a root filesystem's files: half random,
// half a repeated text (so about 2:1 compressible).
func benchFile(r *rand.Rand, size int) []byte {
	b := make([]byte, size)
	for i := 0; i < size/2; i++ {
		b[i] = byte(r.Uint32())
	}
	text := []byte("the quick brown fox jumps over the lazy dog; ")
	for i := size / 2; i < size; i++ {
		b[i] = text[i%len(text)]
	}
	return b
}

// BenchmarkDiff: the archive of a disk that changed 1%, 10% and 100% of
// a 64 MiB template (new files of that share of its bytes, 128 KiB
// each, in a directory of their own, and as many of the template's
// files overwritten in place for the "-overwrite" cases), written as a
// diff against the template and whole: bytes and time of each.
func BenchmarkDiff(b *testing.B) {
	const files, size = 512, 128 << 10
	base := b.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range files {
		dir := filepath.Join(base, fmt.Sprintf("usr/lib/d%02d", i%32))
		must(b, os.MkdirAll(dir, 0o755))
		must(b, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", i)), benchFile(r, size), 0o644))
	}
	digest, err := TreeDigest(b.Context(), base)
	must(b, err)
	for _, overwrite := range []bool{false, true} {
		for _, pct := range []int{1, 10, 100} {
			name := fmt.Sprintf("%dpct", pct)
			if overwrite {
				name += "-overwrite"
			}
			b.Run(name, func(b *testing.B) {
				disk := filepath.Join(b.TempDir(), "disk")
				copyTree(b, base, disk)
				n := files * pct / 100
				for i := range n {
					p := filepath.Join(disk, fmt.Sprintf("home/f%03d", i))
					if overwrite {
						p = filepath.Join(disk, fmt.Sprintf("usr/lib/d%02d/f%03d", i%32, i))
					}
					must(b, os.MkdirAll(filepath.Dir(p), 0o755))
					must(b, os.WriteFile(p, benchFile(r, size), 0o644))
				}
				for range b.N {
					var diff, whole countingWriter
					t0 := time.Now()
					must(b, WriteDiff(b.Context(), &diff, Manifest{}, disk, "", base, Base{Name: "t", Digest: digest}))
					td := time.Since(t0)
					t0 = time.Now()
					must(b, WriteArchive(b.Context(), &whole, Manifest{}, disk, ""))
					tw := time.Since(t0)
					b.ReportMetric(float64(diff)/1024, "KiB-diff")
					b.ReportMetric(float64(whole)/1024, "KiB-whole")
					b.ReportMetric(100*float64(diff)/float64(whole), "%-of-whole")
					b.ReportMetric(float64(td.Milliseconds()), "ms-diff")
					b.ReportMetric(float64(tw.Milliseconds()), "ms-whole")
				}
			})
		}
	}
}

// countingWriter counts what is written to it.
type countingWriter int64

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}
