package checkpoints

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/store"
)

// templateTree makes a template's tree: a big file of seeded bytes (the
// same on every node given the same seed), and a few small ones.
func templateTree(t *testing.T, seed uint64) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"bin", "etc", "home/loam"} {
		must(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	big := make([]byte, 512<<10)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range big {
		big[i] = byte(r.Uint32())
	}
	must(t, os.WriteFile(filepath.Join(dir, "bin/big"), big, 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "etc/hostname"), []byte("loam\n"), 0o644))
	must(t, os.Symlink("big", filepath.Join(dir, "bin/sh")))
	return dir
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestUploadDiff: a checkpoint of a sandbox made from a template this
// node has is stored as a diff, small beside the template, with the
// template stored once beside it; it fetches right on a node with the
// same template, on one whose template of that name differs (by a file's
// mtime), and on one with none (which make the stored base a template of
// their own, once, and delete once no fetched checkpoint uses it).
func TestUploadDiff(t *testing.T) {
	ctx := t.Context()
	st, recs := sharedStore(t)
	a := newNode(t, st, recs, "build-1")
	same := newNode(t, st, recs, "build-1")
	other := newNode(t, st, recs, "build-1")
	none := newNode(t, st, recs, "build-1")
	// same imports the same tree as a; other's holds the same bytes
	// (built again, elsewhere) with other mtimes, another base for a
	// memory image.
	tree := templateTree(t, 1)
	must(t, a.disks.ImportTemplate(ctx, "busybox", tree))
	must(t, same.disks.ImportTemplate(ctx, "busybox", tree))
	again := templateTree(t, 1)
	old := time.Now().Add(-time.Hour)
	must(t, os.Chtimes(filepath.Join(again, "bin/big"), old, old))
	must(t, other.disks.ImportTemplate(ctx, "busybox", again))

	// The sandbox: its template, changed a little.
	root, err := a.disks.CreateVolume(ctx, "sb-d", "busybox")
	must(t, err)
	must(t, os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("sandbox\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "home/loam/notes"), []byte("new"), 0o600))
	must(t, os.Remove(filepath.Join(root, "etc/passwd")))
	take := func(id string) *store.Checkpoint {
		must(t, a.disks.Snapshot(ctx, "sb-d", checkpoint.Snapshot("sb-d", id)))
		must(t, os.MkdirAll(filepath.Join(checkpoint.Dir(a.dataDir, "sb-d", id), checkpoint.MemDir), 0o700))
		must(t, os.WriteFile(filepath.Join(checkpoint.Dir(a.dataDir, "sb-d", id), checkpoint.MemDir, "checkpoint.img"), []byte("pages"), 0o600))
		cp := &store.Checkpoint{Checkpoint: api.Checkpoint{ID: id, Sandbox: "sb-d", Memory: true}, SandboxName: "d", Template: "busybox"}
		recs.put(cp)
		a.Queue(&store.Sandbox{Sandbox: api.Sandbox{ID: "sb-d"}}, cp)
		waitStored(t, a.Uploader, "sb-d", id)
		return cp
	}
	cp := take("v1")
	m, err := st.GetManifest(ctx, ManifestName("sb-d", "v1"))
	must(t, err)
	var meta StoredMeta
	must(t, json.Unmarshal(m.Meta, &meta))
	if meta.Base == nil || meta.Base.Name != "busybox" || !strings.HasPrefix(meta.Base.Digest, "sha256:") {
		t.Fatalf("the stored checkpoint's base: %+v", meta.Base)
	}
	if n, base := m.Files[archiveFile].Size, m.Files[baseFile].Size; n > 16<<10 || base < 512<<10 {
		t.Errorf("stored %d bytes of diff and %d of template; want a small diff beside the whole template", n, base)
	}
	want, err := checkpoint.TreeDigest(ctx, a.disks.SnapshotPath("sb-d.v1"))
	must(t, err)

	src := &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-d", Name: "d", Node: "a"}}
	stored := "stored-" + strings.TrimPrefix(meta.Base.Digest, "sha256:")
	for name, n := range map[string]*node{"same template": same, "other template": other, "no template": none} {
		must(t, n.Fetch(ctx, src, cp))
		if got, err := checkpoint.TreeDigest(ctx, n.disks.SnapshotPath("sb-d.v1")); err != nil || got != want {
			t.Errorf("%s: the fetched disk is %s (%v), want %s", name, got, err, want)
		}
		if b, _ := os.ReadFile(filepath.Join(n.disks.SnapshotPath("sb-d.v1"), "etc/hostname")); string(b) != "sandbox\n" {
			t.Errorf("%s: etc/hostname %q", name, b)
		}
		if img, _ := os.ReadFile(filepath.Join(checkpoint.Dir(n.dataDir, "sb-d", "v1"), checkpoint.MemDir, "checkpoint.img")); string(img) != "pages" {
			t.Errorf("%s: the memory image %q", name, img)
		}
		if vols, _ := n.disks.Volumes(ctx); len(vols) != 0 {
			t.Errorf("%s: volumes left: %v", name, vols)
		}
		has, _ := n.disks.HasTemplate(ctx, stored)
		if has != (n != same) {
			t.Errorf("%s: has the stored base as a template: %v", name, has)
		}
	}

	// A second checkpoint names the same base blob, stored once.
	take("v2")
	m2, err := st.GetManifest(ctx, ManifestName("sb-d", "v2"))
	must(t, err)
	if m2.Files[baseFile] != m.Files[baseFile] {
		t.Errorf("the second checkpoint's base %v, the first's %v", m2.Files[baseFile], m.Files[baseFile])
	}
	cp2, _ := recs.GetCheckpoint(ctx, "sb-d", "v2")
	must(t, none.Fetch(ctx, src, cp2))

	// The sweep keeps a stored base while a fetched checkpoint made from
	// it is here, and deletes it once none is.
	must(t, none.Sweep(ctx, time.Hour))
	if has, _ := none.disks.HasTemplate(ctx, stored); !has {
		t.Error("the sweep deleted a stored base fetched checkpoints use")
	}
	recs.mu.Lock()
	delete(recs.cps, "sb-d/v1")
	delete(recs.cps, "sb-d/v2")
	recs.mu.Unlock()
	must(t, none.Sweep(ctx, time.Hour))
	if has, _ := none.disks.HasTemplate(ctx, stored); has {
		t.Error("the sweep kept a stored base no fetched checkpoint uses")
	}
	must(t, same.Sweep(ctx, time.Hour))
	if has, _ := same.disks.HasTemplate(ctx, "busybox"); !has {
		t.Error("the sweep deleted a template of the node's own")
	}

	// A template made again under its name has its own digest.
	must(t, a.disks.DeleteTemplate(ctx, "busybox"))
	must(t, a.disks.ImportTemplate(ctx, "busybox", templateTree(t, 3)))
	rec, err := a.digest(ctx, "busybox")
	must(t, err)
	if rec.Digest == meta.Base.Digest {
		t.Error("a template made again kept the digest of the one before")
	}
}
