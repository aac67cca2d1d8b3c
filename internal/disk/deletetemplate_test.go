package disk_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/testenv"
)

// templateDeleter is a pool that can delete templates.
type templateDeleter interface {
	disk.Pool
	DeleteTemplate(ctx context.Context, name string) error
}

// TestDeleteTemplate: a template can be deleted while volumes made from it
// live on, whole; deleting it again is no error.
func TestDeleteTemplate(t *testing.T) {
	testenv.Root(t)
	pools := map[string]func(testing.TB) templateDeleter{
		"copy": func(t testing.TB) templateDeleter {
			return newCopy(t)
		},
		"btrfs": func(t testing.TB) templateDeleter {
			return newBtrfs(t)
		},
	}
	for kind, newPool := range pools {
		t.Run(kind, func(t *testing.T) {
			ctx := t.Context()
			p := newPool(t)
			src := t.TempDir()
			if err := os.WriteFile(filepath.Join(src, "f"), []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := p.ImportTemplate(ctx, "img", src); err != nil {
				t.Fatal(err)
			}
			root, err := p.CreateVolume(ctx, "v1", "img")
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if err := p.DeleteTemplate(ctx, "img"); err != nil {
					t.Fatalf("DeleteTemplate: %v", err)
				}
			}
			if ok, err := p.HasTemplate(ctx, "img"); ok || err != nil {
				t.Errorf("HasTemplate after delete: %v, %v", ok, err)
			}
			if got, err := os.ReadFile(filepath.Join(root, "f")); err != nil || string(got) != "data" {
				t.Errorf("the volume after its template's delete: %q, %v", got, err)
			}
			if err := p.DeleteVolume(ctx, "v1"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
