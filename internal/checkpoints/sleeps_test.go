package checkpoints

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/objects"
	"loam.dev/loam/internal/sleep"
	"loam.dev/loam/internal/store"
)

// sandboxRecords are sandbox records by id.
type sandboxRecords struct {
	mu  sync.Mutex
	sbs map[string]store.Sandbox
}

func (r *sandboxRecords) GetSandbox(_ context.Context, _, ref string) (*store.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sbs[ref]
	if !ok {
		return nil, store.ErrNotFound
	}
	return &sb, nil
}

func (r *sandboxRecords) put(sb store.Sandbox) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sbs[sb.ID] = sb
}

// sleepNode is a node's uploader that stores sleep images too.
func sleepNode(t *testing.T, st *objects.Store, recs *sandboxRecords, name string) (*Uploader, string) {
	t.Helper()
	dir := t.TempDir()
	disks := newDisks(t, filepath.Join(dir, "pool"))
	u := NewUploader(UploaderConfig{DataDir: dir, Objects: st, Disks: disks,
		Records: &records{cps: map[string]*store.Checkpoint{}}, Node: name, Runsc: "r1",
		Sleeps: sleep.NewImages(dir), Volumes: disks, Sandboxes: recs,
		Retry: 10 * time.Millisecond}, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { u.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return u, dir
}

// asleep puts a sleep image of generation gen and a disk for sandbox id
// on the node with data dir dir.
func asleep(t *testing.T, u *Uploader, dir, id string, gen int, mark string) {
	t.Helper()
	imgs := sleep.NewImages(dir)
	img, err := imgs.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.MkdirAll(img, 0o700))
	must(t, os.WriteFile(filepath.Join(img, "checkpoint.img"), []byte("memory of "+mark), 0o600))
	must(t, imgs.Commit(id, img, gen))
	disk := filepath.Join(u.cfg.Volumes.VolumePath(id), "home")
	must(t, os.MkdirAll(disk, 0o755))
	must(t, os.WriteFile(filepath.Join(disk, "mark"), []byte(mark), 0o644))
}

// TestSleepImages: a sleep image is stored under its generation, and a
// node that fetches it gets its disk and memory as they slept; a record of
// another generation (woken since) fetches nothing; a wake's ForgetSleep
// removes the stored image; one whose sandbox no longer sleeps with it is
// not stored; the sweep removes one the record has left behind.
func TestSleepImages(t *testing.T) {
	st, err := objects.Open(t.Context(), "file://"+t.TempDir())
	must(t, err)
	defer st.Close()
	recs := &sandboxRecords{sbs: map[string]store.Sandbox{}}
	a, aDir := sleepNode(t, st, recs, "a")
	b, bDir := sleepNode(t, st, recs, "b")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	sb := store.Sandbox{Sandbox: api.Sandbox{ID: "sb-1", Name: "nap", State: api.StateSleeping, Node: "a"}, AgentGen: 3}
	recs.put(sb)
	asleep(t, a, aDir, sb.ID, 3, "dreaming")
	a.QueueSleep(sb.ID)
	must(t, a.WaitSleep(ctx, sb.ID))
	if !a.SleepStored(ctx, &sb) {
		t.Fatalf("the sleep image is not stored")
	}
	if _, err := st.GetManifest(ctx, SleepManifestName(sb.ID, 3)); err != nil {
		t.Fatalf("its manifest: %v", err)
	}
	staging := filepath.Join(bDir, "staging")
	must(t, os.Mkdir(staging, 0o700))
	diskDir, memDir, err := b.FetchSleep(ctx, &sb, staging)
	if err != nil {
		t.Fatalf("fetching it on b: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(diskDir, "home", "mark")); err != nil || string(got) != "dreaming" {
		t.Errorf("its disk on b: %q, %v", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(memDir, "checkpoint.img")); err != nil || string(got) != "memory of dreaming" {
		t.Errorf("its memory image on b: %q, %v", got, err)
	}

	// Woken since (the generation moved on): nothing to fetch.
	woken := sb
	woken.AgentGen = 4
	other := filepath.Join(bDir, "other")
	must(t, os.Mkdir(other, 0o700))
	if _, _, err := b.FetchSleep(ctx, &woken, other); !errors.Is(err, api.ErrUnavailable) {
		t.Errorf("fetching the image of a later generation: %v, want unavailable", err)
	}
	if b.SleepStored(ctx, &woken) {
		t.Errorf("stored, said of a generation that has none")
	}

	// The wake drops it.
	a.ForgetSleep(sb.ID)
	deadline := time.Now().Add(10 * time.Second)
	for a.SleepStored(ctx, &sb) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if a.SleepStored(ctx, &sb) {
		t.Errorf("the image is stored still after the wake's ForgetSleep")
	}
	if _, err := os.Stat(filepath.Join(aDir, "sandboxes", sb.ID, "sleep", sleepStoredFile)); err == nil {
		t.Errorf("the mark that it is stored is left")
	}

	// A sandbox that no longer sleeps with its image: not stored.
	running := store.Sandbox{Sandbox: api.Sandbox{ID: "sb-2", Name: "up", State: api.StateRunning, Node: "a"}, AgentGen: 1}
	recs.put(running)
	asleep(t, a, aDir, running.ID, 1, "stale")
	if err := a.WaitSleep(ctx, running.ID); !errors.Is(err, api.ErrConflict) {
		t.Errorf("storing the image of a sandbox that runs: %v, want conflict", err)
	}

	// The sweep removes an image the record has left behind.
	late := store.Sandbox{Sandbox: api.Sandbox{ID: "sb-3", Name: "late", State: api.StateSleeping, Node: "a"}, AgentGen: 5}
	recs.put(late)
	asleep(t, a, aDir, late.ID, 5, "late")
	must(t, a.WaitSleep(ctx, late.ID))
	late.AgentGen = 6
	recs.put(late)
	must(t, a.Sweep(ctx, time.Hour))
	if _, err := st.GetManifest(ctx, SleepManifestName(late.ID, 5)); !errors.Is(err, objects.ErrNotFound) {
		t.Errorf("an image of a generation the record left behind, after the sweep: %v, want gone", err)
	}
}
