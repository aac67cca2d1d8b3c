package disk_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/testenv"
)

// BenchmarkPool times each pool's operations on a real template: busybox,
// or with LOAM_TEST_BASE=1 the Debian one (from the shared cache).
func BenchmarkPool(b *testing.B) {
	testenv.Root(b)
	name := "busybox"
	cacheDir := b.TempDir()
	if os.Getenv("LOAM_TEST_BASE") == "1" {
		name, cacheDir = disk.DefaultTemplate, templateCache()
	}
	tpl, err := disk.FindTemplate(name, disk.TemplateOptions{})
	must(b, err)
	var cache disk.Cache
	src, err := cache.EnsureBuilt(b.Context(), cacheDir, tpl)
	must(b, err)

	pools := []struct {
		name string
		new  func(b *testing.B) disk.Pool
	}{
		// Room for b.N imports of the Debian template; the image is sparse.
		{disk.KindBtrfs, func(b *testing.B) disk.Pool { return newBtrfsSized(b, 16<<30) }},
		{disk.KindCopy, func(b *testing.B) disk.Pool { return newCopy(b) }},
	}
	for _, pc := range pools {
		b.Run(pc.name, func(b *testing.B) {
			b.Run("ImportTemplate", func(b *testing.B) {
				p := pc.new(b)
				for i := 0; b.Loop(); i++ {
					must(b, p.ImportTemplate(b.Context(), fmt.Sprint("t", i), src))
				}
			})
			b.Run("CreateVolume", func(b *testing.B) {
				p := pc.new(b)
				must(b, p.ImportTemplate(b.Context(), name, src))
				for i := 0; b.Loop(); i++ {
					_, err := p.CreateVolume(b.Context(), fmt.Sprint("v", i), name)
					must(b, err)
				}
			})
			b.Run("Snapshot", func(b *testing.B) {
				p := pc.new(b)
				must(b, p.ImportTemplate(b.Context(), name, src))
				v, err := p.CreateVolume(b.Context(), "v", name)
				must(b, err)
				for i := 0; b.Loop(); i++ {
					// A little new data each time, as a running sandbox writes.
					must(b, os.WriteFile(filepath.Join(v, "counter"), []byte(fmt.Sprint(i)), 0o644))
					must(b, p.Snapshot(b.Context(), "v", fmt.Sprint("s", i)))
				}
			})
			b.Run("CloneSnapshot", func(b *testing.B) {
				p := pc.new(b)
				must(b, p.ImportTemplate(b.Context(), name, src))
				_, err := p.CreateVolume(b.Context(), "v", name)
				must(b, err)
				must(b, p.Snapshot(b.Context(), "v", "s"))
				for i := 0; b.Loop(); i++ {
					_, err := p.CloneSnapshot(b.Context(), "s", fmt.Sprint("c", i))
					must(b, err)
				}
			})
			b.Run("DeleteVolume", func(b *testing.B) {
				p := pc.new(b)
				must(b, p.ImportTemplate(b.Context(), name, src))
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					_, err := p.CreateVolume(b.Context(), "v", name)
					must(b, err)
					b.StartTimer()
					must(b, p.DeleteVolume(b.Context(), "v"))
				}
			})
			b.Run("DeleteSnapshot", func(b *testing.B) {
				p := pc.new(b)
				must(b, p.ImportTemplate(b.Context(), name, src))
				v, err := p.CreateVolume(b.Context(), "v", name)
				must(b, err)
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					must(b, os.WriteFile(filepath.Join(v, "counter"), []byte(fmt.Sprint(i)), 0o644))
					must(b, p.Snapshot(b.Context(), "v", "s"))
					b.StartTimer()
					must(b, p.DeleteSnapshot(b.Context(), "s"))
				}
			})
			b.Run("Usage", func(b *testing.B) {
				p := pc.new(b)
				must(b, p.ImportTemplate(b.Context(), name, src))
				_, err := p.CreateVolume(b.Context(), "v", name)
				must(b, err)
				for b.Loop() {
					_, err := p.Usage(b.Context(), "v")
					must(b, err)
				}
			})
		})
	}
}

// BenchmarkQuotas times what a sandbox's life does to its disk with 300
// other volumes of one template on the filesystem, each with 1 MiB of its
// own: create (snapshot of the template, plus setting the limit where
// quotas are on), snapshot for a checkpoint, and delete; under btrfs simple
// quotas (what the pool uses), classic qgroups, and no quotas.
func BenchmarkQuotas(b *testing.B) {
	requireBtrfs(b)
	const volumes = 300
	tpl, err := disk.FindTemplate("busybox", disk.TemplateOptions{})
	must(b, err)
	var cache disk.Cache
	src, err := cache.EnsureBuilt(b.Context(), b.TempDir(), tpl)
	must(b, err)
	for _, mode := range []struct{ name, quota string }{
		{"none", disk.QuotaNone}, {"squota", disk.QuotaSimple}, {"qgroup", disk.QuotaClassic},
	} {
		b.Run(mode.name, func(b *testing.B) {
			ctx := b.Context()
			p := newBtrfsQuotas(b, 8<<30, mode.quota)
			if p.Quotas() != mode.quota {
				b.Fatalf("quota mode %q, want %q", p.Quotas(), mode.quota)
			}
			must(b, p.ImportTemplate(ctx, "t", src))
			// newVolume is a sandbox's create: the volume, then its limit.
			newVolume := func(id string) string {
				v, err := p.CreateVolume(ctx, id, "t")
				must(b, err)
				if mode.quota != "" {
					must(b, p.SetLimit(ctx, id, 256*mib, disk.Base{Template: "t"}))
				}
				return v
			}
			for i := range volumes {
				must(b, fill(filepath.Join(newVolume(fmt.Sprint("n", i)), "data"), 1))
			}
			b.Run("CreateVolume", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					newVolume(fmt.Sprint("c", i))
					b.StopTimer()
					must(b, p.DeleteVolume(ctx, fmt.Sprint("c", i)))
					b.StartTimer()
				}
			})
			b.Run("Snapshot", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					v := p.VolumePath(fmt.Sprint("n", i%volumes))
					must(b, os.WriteFile(filepath.Join(v, "counter"), []byte(fmt.Sprint(i)), 0o644))
					b.StartTimer()
					must(b, p.Snapshot(ctx, fmt.Sprint("n", i%volumes), fmt.Sprint("s", i)))
					b.StopTimer()
					must(b, p.DeleteSnapshot(ctx, fmt.Sprint("s", i)))
					b.StartTimer()
				}
			})
			b.Run("DeleteVolume", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					must(b, fill(filepath.Join(newVolume(fmt.Sprint("d", i)), "data"), 1))
					b.StartTimer()
					must(b, p.DeleteVolume(ctx, fmt.Sprint("d", i)))
				}
			})
		})
	}
}
