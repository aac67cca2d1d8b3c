package test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/checkpoints"
	"loam.dev/loam/internal/objects"
	"loam.dev/loam/internal/objects/s3test"
	"loam.dev/loam/test/harness"
)

// objectsDaemon starts a daemon whose object store is a bucket of its
// own on the test binary's S3 server (versitygw), and returns it with the
// store, opened as the test's.
func objectsDaemon(t *testing.T) (*harness.Daemon, *objects.Store) {
	t.Helper()
	d, st, _ := objectsDaemonOn(t, s3test.Shared(t))
	return d, st
}

// objectsDaemonOn is objectsDaemon on S3 server srv; it returns the
// bucket's URL too (--objects), for a start again.
func objectsDaemonOn(t *testing.T, srv *s3test.Server) (*harness.Daemon, *objects.Store, string) {
	t.Helper()
	url := srv.NewBucket(t, "loam/")
	dir, err := os.MkdirTemp("", "loam-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	d := &harness.Daemon{T: t, DataDir: dir, Subnet: harness.NextSubnet(), Env: srv.Env()}
	t.Cleanup(func() { d.Destroy() })
	d.Start("--objects", url)
	st, err := objects.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return d, st, url
}

// unpackStored fetches the archive of m, a stored checkpoint's manifest,
// from st (its digest checked) and unpacks it into a directory of the
// test's own, which it returns with the archive's manifest. A diff is
// applied to its base, fetched and unpacked too.
func unpackStored(t testing.TB, st *objects.Store, m *objects.Manifest) (string, *checkpoint.Manifest) {
	t.Helper()
	dir := t.TempDir()
	open := func(file string) *os.File {
		blob, ok := m.Files[file]
		if !ok {
			t.Fatalf("the stored checkpoint has no %s: %+v", file, m.Files)
		}
		path := filepath.Join(dir, file)
		if err := st.Fetch(t.Context(), blob, path); err != nil {
			t.Fatalf("fetching a stored archive: %v", err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	unpacked := filepath.Join(dir, "unpacked")
	if err := os.Mkdir(unpacked, 0o700); err != nil {
		t.Fatal(err)
	}
	var meta checkpoints.StoredMeta
	if err := json.Unmarshal(m.Meta, &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Base == nil {
		man, err := checkpoint.ReadArchive(t.Context(), open("checkpoint.tar.zst"), unpacked, 4<<30)
		if err != nil {
			t.Fatalf("the stored archive: %v", err)
		}
		return unpacked, man
	}
	base := filepath.Join(dir, "base")
	if err := os.Mkdir(base, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.ReadArchive(t.Context(), open("base.tar.zst"), base, 4<<30); err != nil {
		t.Fatalf("the stored base: %v", err)
	}
	if d, err := checkpoint.TreeDigest(t.Context(), filepath.Join(base, checkpoint.DiskEntry)); err != nil || d != meta.Base.Digest {
		t.Fatalf("the stored base's digest: %s (%v), want %s", d, err, meta.Base.Digest)
	}
	disk := filepath.Join(unpacked, checkpoint.DiskEntry)
	if err := os.Rename(filepath.Join(base, checkpoint.DiskEntry), disk); err != nil {
		t.Fatal(err)
	}
	man, err := checkpoint.ApplyDiff(t.Context(), open("checkpoint.tar.zst"), disk, unpacked, *meta.Base, 4<<30)
	if err != nil {
		t.Fatalf("the stored diff: %v", err)
	}
	return unpacked, man
}

// TestObjectsCheckpoints: with --objects, every checkpoint is uploaded to
// the object store (a real S3 server) once taken: a create that waits
// answers it stored; GET says local or stored, and waits too; what is in
// the bucket is the checkpoint (a manifest naming its archive, a diff
// against its template, and the template, its meta naming the runsc
// build, the memory and the base, the archive applied to the base
// making its disk, beside its memory image); deleting the checkpoint, then its sandbox,
// deletes their manifests. Without --objects, a wait is refused and the
// checkpoint has no storage.
func TestObjectsCheckpoints(t *testing.T) {
	t.Parallel()
	d, st := objectsDaemon(t)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "up"})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("up", "sh", "-c", "echo kept > /home/loam/mark")

	status, body := d.Curl("POST", "/v1/sandboxes/up/checkpoints", `{"comment":"stored","wait":"stored"}`)
	var v1 api.Checkpoint
	if status != 201 || json.Unmarshal([]byte(body), &v1) != nil || v1.Storage == nil || v1.Storage.State != api.StorageStored {
		t.Fatalf("a checkpoint that waits to be stored: %d %s", status, body)
	}
	// The other way: taken, then waited for through GET.
	no := false
	v2, err := d.C.CreateCheckpoint(ctx, "up", api.CreateCheckpoint{Memory: &no})
	if err != nil {
		t.Fatal(err)
	}
	if v2.Storage == nil || (v2.Storage.State != api.StorageLocal && v2.Storage.State != api.StorageStored) {
		t.Errorf("a checkpoint just taken: storage %+v", v2.Storage)
	}
	// Its answer, against the API's document.
	doc := &walker{t: t, d: d, c: newConformance(t)}
	var got api.Checkpoint
	doc.json(req{route: "GET /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}", path: "/v1/sandboxes/up/checkpoints/v2?wait=stored"}, 200, &got)
	if got.Storage == nil || got.Storage.State != api.StorageStored {
		t.Errorf("GET ?wait=stored: %+v", got)
	}
	if status, body := d.Curl("GET", "/v1/sandboxes/up/checkpoints/v2?wait=forever", ""); status != 400 || !strings.Contains(body, `"invalid"`) {
		t.Errorf("GET ?wait=forever: %d %s, want invalid", status, body)
	}

	// In the bucket: the manifest, and the archive it names.
	m, err := st.GetManifest(ctx, checkpoints.ManifestName(sb.ID, "v1"))
	if err != nil {
		t.Fatal(err)
	}
	var meta checkpoints.StoredMeta
	if err := json.Unmarshal(m.Meta, &meta); err != nil || !meta.Memory || meta.Runsc == "" || meta.Sandbox != sb.ID || meta.Checkpoint != "v1" {
		t.Errorf("v1's manifest's meta: %s (%v)", m.Meta, err)
	}
	_, ok := m.Files["checkpoint.tar.zst"]
	if _, diff := m.Files["base.tar.zst"]; !ok || len(m.Files) != 2 || !diff || meta.Base == nil {
		t.Fatalf("v1's manifest: files %+v, base %+v; want an archive diff against its template, stored beside it", m.Files, meta.Base)
	}
	unpacked, man := unpackStored(t, st, m)
	if !man.Memory {
		t.Errorf("the stored archive of a memory checkpoint: %+v", man)
	}
	if got, err := os.ReadFile(filepath.Join(unpacked, checkpoint.DiskEntry, "home", "loam", "mark")); err != nil || string(got) != "kept\n" {
		t.Errorf("the stored disk's /home/loam/mark: %q, %v", got, err)
	}
	if mem, _ := os.ReadDir(filepath.Join(unpacked, checkpoint.MemEntry)); len(mem) == 0 {
		t.Error("the stored archive has no memory image")
	}

	// Deleted: the checkpoint's manifest; then the sandbox's.
	if err := d.C.DeleteCheckpoint(ctx, "up", "v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetManifest(ctx, checkpoints.ManifestName(sb.ID, "v1")); !errors.Is(err, objects.ErrNotFound) {
		t.Errorf("v1's manifest after its delete: %v, want gone", err)
	}
	if err := d.C.DeleteSandbox(ctx, "up"); err != nil {
		t.Fatal(err)
	}
	if names, err := st.Manifests(ctx, "checkpoints/"+sb.ID+"/"); err != nil || len(names) != 0 {
		t.Errorf("the sandbox's manifests after its delete: %v, %v; want none", names, err)
	}
}

// TestObjectsResume: checkpoints taken while the daemon had no object
// store are uploaded once it has one (the next start), and a daemon
// without one refuses a wait and shows no storage.
func TestObjectsResume(t *testing.T) {
	t.Parallel()
	url := s3test.NewBucket(t, "")
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "later"})
	if err != nil {
		t.Fatal(err)
	}
	no := false
	cp, err := d.C.CreateCheckpoint(ctx, "later", api.CreateCheckpoint{Memory: &no})
	if err != nil {
		t.Fatal(err)
	}
	if cp.Storage != nil {
		t.Errorf("a checkpoint on a daemon without an object store: storage %+v", cp.Storage)
	}
	if _, err := d.C.CreateCheckpoint(ctx, "later", api.CreateCheckpoint{Memory: &no, Wait: api.WaitStored}); harness.APICode(err) != api.CodeInvalid {
		t.Errorf("a wait on a daemon without an object store: %v, want invalid", err)
	}
	d.Stop()
	d.Env = s3test.Shared(t).Env()
	d.Start("--objects", url)
	status, body := d.Curl("GET", "/v1/sandboxes/later/checkpoints/v1?wait=stored", "")
	if status != 200 || !strings.Contains(body, `"storage":{"state":"stored"}`) {
		t.Fatalf("v1, taken before the object store, after a start with one: %d %s", status, body)
	}
	st, err := objects.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.GetManifest(ctx, checkpoints.ManifestName(sb.ID, "v1")); err != nil {
		t.Errorf("v1's manifest: %v", err)
	}
}
