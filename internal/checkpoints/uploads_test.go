package checkpoints

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/objects"
	"loam.dev/loam/internal/store"
)

// dirSnapshots is a disk pool of plain directories (disk.Copy).
type dirSnapshots struct{ *disk.Copy }

func newDisks(t *testing.T, dir string) dirSnapshots {
	t.Helper()
	p, err := disk.NewCopy(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dirSnapshots{p}
}

// records are checkpoint records by sandbox and id.
type records struct {
	mu  sync.Mutex
	cps map[string]*store.Checkpoint
}

func (r *records) GetCheckpoint(_ context.Context, sandboxID, ref string) (*store.Checkpoint, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cp, ok := r.cps[sandboxID+"/"+ref]; ok {
		return cp, nil
	}
	return nil, store.ErrNotFound
}

func (r *records) put(cp *store.Checkpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cps[cp.Sandbox+"/"+cp.ID] = cp
}

// sharedStore is an object store (file://) and checkpoint records that
// the nodes of a test share.
func sharedStore(t *testing.T) (*objects.Store, *records) {
	t.Helper()
	st, err := objects.Open(t.Context(), "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, &records{cps: map[string]*store.Checkpoint{}}
}

// node is one node's uploader over a shared store.
type node struct {
	*Uploader
	dataDir string
	disks   dirSnapshots
}

func newNode(t *testing.T, st *objects.Store, recs *records, runsc string, features ...string) *node {
	t.Helper()
	dir := t.TempDir()
	disks := newDisks(t, filepath.Join(dir, "pool"))
	u := NewUploader(UploaderConfig{DataDir: dir, Objects: st, Disks: disks, Records: recs,
		Node: runsc, Runsc: runsc, HostFeatures: features, CPUFeatures: func() []string { return features },
		Retry: 10 * time.Millisecond}, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { u.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return &node{Uploader: u, dataDir: dir, disks: disks}
}

// take makes checkpoint id of sandbox sb on n: a disk snapshot with a
// file, and, for memory, an image.
func (n *node) take(t *testing.T, recs *records, sb, id string, memory bool) *store.Checkpoint {
	t.Helper()
	disk := filepath.Join(n.disks.SnapshotPath(checkpoint.Snapshot(sb, id)), "home")
	if err := os.MkdirAll(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(disk, "mark"), []byte(sb+" "+id), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := checkpoint.Dir(n.dataDir, sb, id)
	if memory {
		if err := os.MkdirAll(filepath.Join(dir, checkpoint.MemDir), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, checkpoint.MemDir, "checkpoint.img"), []byte(strings.Repeat("m", 10_000)), 0o600); err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cp := &store.Checkpoint{Checkpoint: api.Checkpoint{ID: id, Sandbox: sb, Memory: memory, CreatedAt: time.Now()},
		SandboxName: "name-" + sb, Template: "busybox", Resources: api.Resources{CPUs: 1, MemoryMiB: 512}}
	recs.put(cp)
	return cp
}

func waitStored(t *testing.T, u *Uploader, sb, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := u.Wait(ctx, sb, id); err != nil {
		t.Fatalf("waiting for %s/%s: %v (status %+v)", sb, id, err, u.Status(sb, id))
	}
}

// TestUploadAndFetch: a checkpoint queued on one node is stored (its
// status says so, its manifest is there) and fetched on another, disk
// and memory image in place, once for two fetches; a memory checkpoint of
// another runsc build, or of CPU features the fetching node lacks, is
// refused, and a disk-only one of either is not; Forget deletes the
// manifests, and the sweep removes a fetched copy whose record is gone.
func TestUploadAndFetch(t *testing.T) {
	ctx := t.Context()
	st, recs := sharedStore(t)
	a := newNode(t, st, recs, "build-1", "sse2", "avx2")
	b := newNode(t, st, recs, "build-1", "sse2", "avx2")
	other := newNode(t, st, recs, "build-2", "sse2", "avx2")
	small := newNode(t, st, recs, "build-1", "sse2")

	cp := a.take(t, recs, "sb-1", "v1", true)
	if got := a.Status("sb-1", "v1"); got.State != api.StorageLocal {
		t.Errorf("before its upload: %+v", got)
	}
	a.Queue(&store.Sandbox{Sandbox: api.Sandbox{ID: "sb-1"}}, cp)
	waitStored(t, a.Uploader, "sb-1", "v1")
	if got := a.Status("sb-1", "v1"); got.State != api.StorageStored {
		t.Errorf("once stored: %+v", got)
	}
	if ok, err := b.Stored(ctx, "sb-1", "v1"); !ok || err != nil {
		t.Errorf("Stored from another node: %v, %v", ok, err)
	}
	if _, err := b.Stored(ctx, "sb-1", "v9"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Stored of a checkpoint that is none: %v, want ErrNotFound", err)
	}

	src := &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-1", Name: "name-sb-1", Node: "a"}}
	for range 2 {
		if err := b.Fetch(ctx, src, cp); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(b.disks.SnapshotPath("sb-1.v1"), "home", "mark")); string(got) != "sb-1 v1" {
		t.Errorf("the fetched disk's mark: %q", got)
	}
	if img, _ := os.ReadFile(filepath.Join(checkpoint.Dir(b.dataDir, "sb-1", "v1"), checkpoint.MemDir, "checkpoint.img")); len(img) != 10_000 {
		t.Errorf("the fetched memory image: %d bytes", len(img))
	}
	if got := b.Status("sb-1", "v1"); got.State != api.StorageStored {
		t.Errorf("the fetched copy's status: %+v", got)
	}
	// Resume on b uploads nothing of the fetched copy.
	b.Resume(ctx)
	b.mu.Lock()
	queued := len(b.jobs)
	b.mu.Unlock()
	if queued != 0 {
		t.Errorf("Resume on the fetching node queued %d uploads", queued)
	}

	for _, n := range []*node{other, small} {
		err := n.Fetch(ctx, src, cp)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeConflict {
			t.Errorf("a fetch of a memory checkpoint that would not restore: %v, want conflict", err)
		}
	}
	disk := a.take(t, recs, "sb-1", "v2", false)
	a.Queue(&store.Sandbox{Sandbox: api.Sandbox{ID: "sb-1"}}, disk)
	waitStored(t, a.Uploader, "sb-1", "v2")
	if err := other.Fetch(ctx, src, disk); err != nil {
		t.Errorf("a disk-only checkpoint on another build: %v", err)
	}

	a.Forget(ctx, "sb-1", "")
	if names, err := st.Manifests(ctx, "checkpoints/sb-1/"); err != nil || len(names) != 0 {
		t.Errorf("manifests after Forget: %v, %v", names, err)
	}
	recs.mu.Lock()
	delete(recs.cps, "sb-1/v1")
	recs.mu.Unlock()
	if err := b.Sweep(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.disks.SnapshotPath("sb-1.v1")); !os.IsNotExist(err) {
		t.Errorf("the fetched copy's snapshot after its record went: %v", err)
	}
	if _, err := os.Stat(checkpoint.Dir(b.dataDir, "sb-1", "v1")); !os.IsNotExist(err) {
		t.Errorf("the fetched copy's data after its record went: %v", err)
	}
}

// TestUploadRetried: an upload that fails (the store cannot take its
// blob: a file where its directory must go) says why and is tried again
// until it is stored.
func TestUploadRetried(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, err := objects.Open(ctx, "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs := &records{cps: map[string]*store.Checkpoint{}}
	a := newNode(t, st, recs, "build-1")
	blocker := filepath.Join(dir, "blobs")
	if err := os.WriteFile(blocker, []byte("in the way"), 0o600); err != nil {
		t.Fatal(err)
	}
	cp := a.take(t, recs, "sb-2", "v1", false)
	a.Queue(&store.Sandbox{Sandbox: api.Sandbox{ID: "sb-2"}}, cp)
	deadline := time.Now().Add(10 * time.Second)
	for a.Status("sb-2", "v1").Error == "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := a.Status("sb-2", "v1"); got.Error == "" || got.State != api.StorageLocal {
		t.Fatalf("a failing upload's status: %+v, want local with its error", got)
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	waitStored(t, a.Uploader, "sb-2", "v1")
}

// TestForgetWhileQueued: a checkpoint forgotten before its upload ran is
// not stored, and a wait for it ends saying it was deleted.
func TestForgetWhileQueued(t *testing.T) {
	ctx := t.Context()
	st, recs := sharedStore(t)
	// Not run: what is queued stays queued.
	dir := t.TempDir()
	disks := newDisks(t, filepath.Join(dir, "pool"))
	u := NewUploader(UploaderConfig{DataDir: dir, Objects: st, Disks: disks, Records: recs}, slog.New(slog.DiscardHandler))
	n := &node{Uploader: u, dataDir: dir, disks: disks}
	cp := n.take(t, recs, "sb-3", "v1", false)
	u.Queue(&store.Sandbox{Sandbox: api.Sandbox{ID: "sb-3"}}, cp)
	waited := make(chan error, 1)
	go func() { waited <- u.Wait(ctx, "sb-3", "v1") }()
	time.Sleep(20 * time.Millisecond)
	u.Forget(ctx, "sb-3", "v1")
	var ae *api.Error
	if err := <-waited; !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
		t.Errorf("a wait for a checkpoint forgotten: %v, want not_found", err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	u.Run(runCtx)
	if names, _ := st.Manifests(ctx, ""); slices.Contains(names, ManifestName("sb-3", "v1")) {
		t.Error("a checkpoint forgotten while queued was stored")
	}
}

// TestFetchCorrupt: a stored archive whose bytes are not its digest's is
// refused (unavailable, saying it failed its checksum) and leaves nothing
// on the fetching node: no snapshot, no data, nothing in its cache or its
// staging; with the right bytes back, it fetches.
func TestFetchCorrupt(t *testing.T) {
	ctx := t.Context()
	root := t.TempDir()
	st, err := objects.Open(ctx, "file://"+root)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs := &records{cps: map[string]*store.Checkpoint{}}
	a := newNode(t, st, recs, "build-1")
	b := newNode(t, st, recs, "build-1")
	cache, err := objects.NewCache(filepath.Join(b.dataDir, "objects-cache"), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	b.cfg.Cache = cache
	cp := a.take(t, recs, "sb-4", "v1", true)
	a.Queue(&store.Sandbox{Sandbox: api.Sandbox{ID: "sb-4"}}, cp)
	waitStored(t, a.Uploader, "sb-4", "v1")
	m, err := st.GetManifest(ctx, ManifestName("sb-4", "v1"))
	if err != nil {
		t.Fatal(err)
	}
	blob := filepath.Join(root, "blobs", "sha256", strings.TrimPrefix(m.Files[archiveFile].Digest, "sha256:"))
	good, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	bad := slices.Clone(good)
	bad[len(bad)/2] ^= 0xff
	if err := os.WriteFile(blob, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	src := &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-4", Name: "name-sb-4", Node: "a"}}
	err = b.Fetch(ctx, src, cp)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable || !strings.Contains(ae.Message, "failed its checksum") {
		t.Fatalf("a fetch of a corrupt archive: %v, want unavailable saying it failed its checksum", err)
	}
	if _, err := os.Stat(b.disks.SnapshotPath("sb-4.v1")); !os.IsNotExist(err) {
		t.Errorf("a snapshot of the corrupt archive: %v", err)
	}
	if _, err := os.Stat(checkpoint.Dir(b.dataDir, "sb-4", "v1")); !os.IsNotExist(err) {
		t.Errorf("data of the corrupt archive: %v", err)
	}
	if n := cache.Size(); n != 0 {
		t.Errorf("the cache holds %d bytes after a corrupt fetch", n)
	}
	if left, _ := os.ReadDir(filepath.Join(b.dataDir, "fetch")); len(left) != 0 {
		t.Errorf("staging left after a corrupt fetch: %v", left)
	}
	if err := os.WriteFile(blob, good, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := b.Fetch(ctx, src, cp); err != nil {
		t.Fatalf("a fetch with the right bytes back: %v", err)
	}
}

// TestResumeRemovesLeftovers: the archives of uploads a crash cut short
// are removed when the uploads resume.
func TestResumeRemovesLeftovers(t *testing.T) {
	st, recs := sharedStore(t)
	dir := t.TempDir()
	u := NewUploader(UploaderConfig{DataDir: dir, Objects: st, Disks: newDisks(t, filepath.Join(dir, "pool")), Records: recs}, slog.New(slog.DiscardHandler))
	left := filepath.Join(dir, "uploads", "sb-5.v1.123.tar.zst")
	if err := os.MkdirAll(filepath.Dir(left), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(left, []byte("half an archive"), 0o600); err != nil {
		t.Fatal(err)
	}
	u.Resume(t.Context())
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("a cut-short upload's archive after Resume: %v", err)
	}
}

// TestSweepMovedAway: the sweep leaves the checkpoints taken here of a
// sandbox of this node, record or not (they are its own to remove), and,
// once the sandbox runs on another node (moved), removes those whose
// records are gone and keeps the others.
func TestSweepMovedAway(t *testing.T) {
	ctx := t.Context()
	st, recs := sharedStore(t)
	n := newNode(t, st, recs, "node-a", "sse2")
	sbs := &sandboxRecords{sbs: map[string]store.Sandbox{}}
	sbs.put(store.Sandbox{Sandbox: api.Sandbox{ID: "sb-1", Node: "node-a"}})
	u := NewUploader(UploaderConfig{DataDir: n.dataDir, Objects: st, Disks: n.disks, Records: recs, Node: "node-a", Sandboxes: sbs}, slog.New(slog.DiscardHandler))
	n.take(t, recs, "sb-1", "v1", true)
	n.take(t, recs, "sb-1", "v2", false)
	here := func(id string) bool {
		_, err := os.Stat(n.disks.SnapshotPath(checkpoint.Snapshot("sb-1", id)))
		_, merr := os.Stat(checkpoint.Dir(n.dataDir, "sb-1", id))
		if (err == nil) != (merr == nil) && id == "v1" {
			t.Errorf("%s: its snapshot %v, its data %v: one without the other", id, err, merr)
		}
		return err == nil
	}
	recs.mu.Lock()
	delete(recs.cps, "sb-1/v1")
	recs.mu.Unlock()
	must(t, u.Sweep(ctx, time.Hour))
	if !here("v1") || !here("v2") {
		t.Fatalf("the sweep removed a checkpoint of a sandbox of this node: v1 %v, v2 %v", here("v1"), here("v2"))
	}
	sbs.put(store.Sandbox{Sandbox: api.Sandbox{ID: "sb-1", Node: "node-c"}})
	must(t, u.Sweep(ctx, time.Hour))
	if here("v1") {
		t.Error("v1, whose record is gone, of a sandbox on another node now: still here after the sweep")
	}
	if !here("v2") {
		t.Error("v2, whose record is there, of a sandbox on another node now: removed by the sweep")
	}
}
