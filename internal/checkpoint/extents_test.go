package checkpoint

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"loam.dev/loam/internal/disk"
)

// TestDiffSharedExtents: on btrfs, a file of a snapshot that shares its
// extents with its template's is the same without reading it, and one
// written in place (same size, mtime set back) is not: the diff holds
// the second and not the first, and an inline (small) file is compared
// by its bytes.
func TestDiffSharedExtents(t *testing.T) {
	for _, tool := range []string{"mkfs.btrfs", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil || os.Geteuid() != 0 {
			t.Skipf("needs root and %s", tool)
		}
	}
	ctx := t.Context()
	p, err := disk.NewBtrfs(ctx, t.TempDir(), 1<<30)
	if err != nil {
		t.Skipf("no btrfs pool here: %v", err)
	}
	t.Cleanup(func() { p.Destroy(context.Background()) })
	src := t.TempDir()
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	must(t, os.WriteFile(filepath.Join(src, "same"), big, 0o644))
	must(t, os.WriteFile(filepath.Join(src, "changed"), big, 0o644))
	must(t, os.WriteFile(filepath.Join(src, "small"), []byte("inline"), 0o644))
	must(t, p.ImportTemplate(ctx, "t", src))
	vol, err := p.CreateVolume(ctx, "v", "t")
	must(t, err)
	st, err := os.Stat(filepath.Join(vol, "changed"))
	must(t, err)
	f, err := os.OpenFile(filepath.Join(vol, "changed"), os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteAt([]byte("CHANGED"), 500000)
	must(t, err)
	must(t, f.Close())
	must(t, os.Chtimes(filepath.Join(vol, "changed"), st.ModTime(), st.ModTime()))
	must(t, p.Snapshot(ctx, "v", "s"))
	must(t, p.SyncSnapshot(ctx, "s"))
	snap, tpl := p.SnapshotPath("s"), p.TemplatePath("t")

	opened := func(path string) int {
		f, err := os.Open(path)
		must(t, err)
		t.Cleanup(func() { f.Close() })
		return int(f.Fd())
	}
	if !sameExtents(opened(filepath.Join(snap, "same")), opened(filepath.Join(tpl, "same"))) {
		t.Error("an unchanged file of the snapshot does not share its template's extents")
	}
	if sameExtents(opened(filepath.Join(snap, "changed")), opened(filepath.Join(tpl, "changed"))) {
		t.Error("a file written in place shares its template's extents")
	}
	if sameExtents(opened(filepath.Join(snap, "small")), opened(filepath.Join(tpl, "small"))) {
		t.Error("an inline file is taken for the same by its extents")
	}

	digest, err := TreeDigest(ctx, tpl)
	must(t, err)
	b := Base{Name: "t", Digest: digest}
	var diff bytes.Buffer
	must(t, WriteDiff(ctx, &diff, Manifest{}, snap, "", tpl, b))
	if diff.Len() > 64<<10 {
		t.Errorf("the diff is %d bytes: more than the changed file", diff.Len())
	}
	clone := filepath.Join(t.TempDir(), "clone")
	copyTree(t, src, clone)
	_, err = ApplyDiff(ctx, bytes.NewReader(diff.Bytes()), clone, t.TempDir(), b, 0)
	must(t, err)
	for _, name := range []string{"same", "changed", "small"} {
		want, _ := os.ReadFile(filepath.Join(snap, name))
		if got, _ := os.ReadFile(filepath.Join(clone, name)); !bytes.Equal(got, want) {
			t.Errorf("%s applied is not the snapshot's", name)
		}
	}
}

// BenchmarkDiffBtrfs: BenchmarkDiff's 64 MiB template and 1% of new
// files, in a btrfs pool: its snapshot shares the unchanged files'
// extents with the template, so the diff reads neither. Time and bytes
// of the diff and of the whole archive.
func BenchmarkDiffBtrfs(b *testing.B) {
	ctx := b.Context()
	p, err := disk.NewBtrfs(ctx, b.TempDir(), 1<<30)
	if err != nil {
		b.Skipf("no btrfs pool here: %v", err)
	}
	b.Cleanup(func() { p.Destroy(context.Background()) })
	src := b.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 512 {
		dir := filepath.Join(src, fmt.Sprintf("usr/lib/d%02d", i%32))
		must(b, os.MkdirAll(dir, 0o755))
		must(b, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", i)), benchFile(r, 128<<10), 0o644))
	}
	must(b, p.ImportTemplate(ctx, "t", src))
	vol, err := p.CreateVolume(ctx, "v", "t")
	must(b, err)
	must(b, os.MkdirAll(filepath.Join(vol, "home"), 0o755))
	for i := range 5 {
		must(b, os.WriteFile(filepath.Join(vol, fmt.Sprintf("home/f%d", i)), benchFile(r, 128<<10), 0o644))
	}
	must(b, p.Snapshot(ctx, "v", "s"))
	must(b, p.SyncSnapshot(ctx, "s"))
	digest, err := TreeDigest(ctx, p.TemplatePath("t"))
	must(b, err)
	for range b.N {
		var diff, whole countingWriter
		t0 := time.Now()
		must(b, WriteDiff(ctx, &diff, Manifest{}, p.SnapshotPath("s"), "", p.TemplatePath("t"), Base{Name: "t", Digest: digest}))
		td := time.Since(t0)
		t0 = time.Now()
		must(b, WriteArchive(ctx, &whole, Manifest{}, p.SnapshotPath("s"), ""))
		tw := time.Since(t0)
		b.ReportMetric(float64(diff)/1024, "KiB-diff")
		b.ReportMetric(float64(whole)/1024, "KiB-whole")
		b.ReportMetric(float64(td.Microseconds())/1000, "ms-diff")
		b.ReportMetric(float64(tw.Microseconds())/1000, "ms-whole")
	}
}
