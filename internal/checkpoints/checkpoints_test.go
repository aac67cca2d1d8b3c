package checkpoints

// The capability's own rules over a fake core: what a fork refuses before
// it touches anything, the limits and states a checkpoint is refused in,
// who may delete which checkpoint, and a disk-only checkpoint taken whole
// (data durable and published before its record). The tests over a whole
// Manager (memory checkpoints, restores, forks of real sandboxes of the
// fake runtime, crashes and recovery) are in internal/sandbox.

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

	"go.uber.org/goleak"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeCore answers from a real store, holds operations and locks as
// counters, and remembers what it was asked. The Core it embeds is nil: a
// call of any method it does not define fails the test with a panic.
type fakeCore struct {
	Core
	st store.Store

	mu       sync.Mutex
	ops      []sandbox.Op // operations begun
	running  int          // operations not ended
	locked   int          // LockSource held now
	heavy    int          // Heavy slots held now
	removed  []string     // RemoveCheckpoint, by id
	lockedAt []int        // locked, at each RemoveCheckpoint
}

// AdmitCheckpoint and AdmitStart admit everything: quotas are the
// core's, tested there.
func (c *fakeCore) AdmitCheckpoint(context.Context, *store.Sandbox, bool) (func(), error) {
	return func() {}, nil
}

func (c *fakeCore) AdmitStart(context.Context, *store.Sandbox) (func(), error) { return func() {}, nil }

func (c *fakeCore) Lookup(ctx context.Context, ref string) (*store.Sandbox, error) {
	sb, err := c.st.GetSandbox(ctx, "", ref)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.Errorf(api.CodeNotFound, "sandbox %q not found", ref)
	}
	return sb, err
}

func (c *fakeCore) Claim(ctx context.Context, ref string, op sandbox.Op) (*store.Sandbox, func(), error) {
	sb, err := c.Lookup(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops = append(c.ops, op)
	c.running++
	var once sync.Once
	return sb, func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.running--
		})
	}, nil
}

func (c *fakeCore) Heavy(context.Context, string) (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.heavy++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.heavy--
	}, nil
}

func (c *fakeCore) FindCheckpoint(ctx context.Context, sb *store.Sandbox, ref string) (*store.Checkpoint, error) {
	cp, err := c.st.GetCheckpoint(ctx, sb.ID, ref)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.Errorf(api.CodeNotFound, "checkpoint %q of sandbox %s not found", ref, sb.Name)
	}
	return cp, err
}

func (c *fakeCore) LockSource(string) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.locked++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.locked--
	}
}

func (c *fakeCore) RemoveCheckpoint(ctx context.Context, sb *store.Sandbox, cp *store.Checkpoint) error {
	c.mu.Lock()
	c.removed = append(c.removed, cp.ID)
	c.lockedAt = append(c.lockedAt, c.locked)
	c.mu.Unlock()
	return c.st.DeleteCheckpoint(ctx, sb.ID, cp.ID)
}

func (c *fakeCore) CheckpointNeed(*store.Sandbox, bool) int64 { return 0 }

func (c *fakeCore) SpaceError(err error, _ *store.Sandbox, _ string) error { return err }

// SyncFiles has nothing to sync: the fake's sandboxes never run.
func (c *fakeCore) SyncFiles(ctx context.Context, sb *store.Sandbox, op sandbox.Op) error {
	if sb.State == api.StateRunning {
		return errors.New("fake core: no agent to sync")
	}
	return nil
}

// idle reports an error unless every operation, lock and slot taken was
// given back.
func (c *fakeCore) idle() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running != 0 || c.locked != 0 || c.heavy != 0 {
		return errors.New("fake core: operations, locks or heavy slots left held")
	}
	return nil
}

// fixture is a Service over a fakeCore, a real store and a copy pool, with
// one stopped sandbox "box" (id sb-1) that has a disk.
type fixture struct {
	ctx   context.Context
	core  *fakeCore
	st    store.Store
	disks *disk.Copy
	dir   string
	s     *Service
	sb    *store.Sandbox
}

func newFixture(t *testing.T, limits checkpoint.Limits) *fixture {
	t.Helper()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "loam.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	disks, err := disk.NewCopy(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { disks.Close() })
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "hello"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := disks.ImportTemplate(ctx, "tiny", tree); err != nil {
		t.Fatal(err)
	}
	if _, err := disks.CreateVolume(ctx, "sb-1", "tiny"); err != nil {
		t.Fatal(err)
	}
	sb := &store.Sandbox{Sandbox: api.Sandbox{
		ID: "sb-1", Name: "box", State: api.StateStopped, Template: "tiny",
		Resources: api.Resources{CPUs: 1, MemoryMiB: 512, DiskMiB: 1024}, CreatedAt: store.Now(),
	}}
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	core := &fakeCore{st: st}
	dir := t.TempDir()
	f := &fixture{ctx: ctx, core: core, st: st, disks: disks, dir: dir, sb: sb,
		s: New(core, Config{DataDir: dir, Limits: limits}, st, nil, disks, slog.New(slog.DiscardHandler))}
	t.Cleanup(func() {
		if err := core.idle(); err != nil {
			t.Error(err)
		}
	})
	return f
}

func TestForkRefusesWhatItTakesFromTheCheckpoint(t *testing.T) {
	from := &api.ForkSource{Sandbox: "box", Checkpoint: "v1"}
	for _, tt := range []struct {
		name string
		req  api.CreateSandbox
		want string
	}{
		{"template", api.CreateSandbox{From: from, Template: "python"}, errForkSettings.Error()},
		{"image", api.CreateSandbox{From: from, Image: "alpine"}, errForkSettings.Error()},
		{"cpus", api.CreateSandbox{From: from, Resources: &api.Resources{CPUs: 2, DiskMiB: 100}}, errForkSettings.Error()},
		{"memory", api.CreateSandbox{From: from, Resources: &api.Resources{MemoryMiB: 256, DiskMiB: 100}}, errForkSettings.Error()},
		{"resources without a disk", api.CreateSandbox{From: from, Resources: &api.Resources{}}, errForkSettings.Error()},
		{"services", api.CreateSandbox{From: from, Services: []api.Service{{Name: "web"}}}, "services: a fork takes its services"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// A core that answers nothing: the refusal comes first.
			s := New(&fakeCore{}, Config{DataDir: t.TempDir()}, nil, nil, nil, slog.New(slog.DiscardHandler))
			_, err := s.Fork(t.Context(), tt.req)
			if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Fork = %v, want invalid: %q", err, tt.want)
			}
		})
	}
}

func TestPickName(t *testing.T) {
	cps := []*store.Checkpoint{{Checkpoint: api.Checkpoint{ID: "v1", Name: "taken"}}}
	if _, err := pickName(cps, "taken"); !errors.Is(err, api.ErrConflict) {
		t.Errorf("pickName(taken) = %v, want a conflict", err)
	}
	if n, err := pickName(cps, "free"); err != nil || n != "free" {
		t.Errorf("pickName(free) = %q, %v", n, err)
	}
	n, err := pickName(cps, "")
	if err != nil || n == "taken" || checkpoint.CheckName(n) != nil {
		t.Errorf("pickName() = %q, %v: want a new valid name", n, err)
	}
}

func TestCreateCheckpointRefusals(t *testing.T) {
	f := newFixture(t, checkpoint.Limits{Owner: 1})
	// A memory checkpoint needs the sandbox running (or asleep).
	_, err := f.s.CreateCheckpoint(f.ctx, "box", api.CreateCheckpoint{})
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), `take a disk-only one with "memory":false`) {
		t.Fatalf("memory checkpoint of a stopped sandbox: %v, want a conflict saying how", err)
	}
	if _, err := f.s.CreateCheckpoint(f.ctx, "box", api.CreateCheckpoint{Name: "v7", Memory: ptr(false)}); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("a name that looks like an id: %v, want invalid", err)
	}
	if _, err := f.s.CreateCheckpoint(f.ctx, "nobox", api.CreateCheckpoint{Memory: ptr(false)}); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("checkpoint of no sandbox: %v, want not found", err)
	}
	if _, err := f.s.CreateCheckpoint(f.ctx, "box", api.CreateCheckpoint{Memory: ptr(false)}); err != nil {
		t.Fatal(err)
	}
	// The owner's share is full; the sandbox's own is not counted in it,
	// and a refused checkpoint spends no id.
	_, err = f.s.CreateCheckpoint(f.ctx, "box", api.CreateCheckpoint{Memory: ptr(false)})
	if !errors.Is(err, api.ErrLimit) {
		t.Fatalf("checkpoint beyond the limit: %v, want limit", err)
	}
	if sb, _ := f.st.GetSandbox(f.ctx, "", "sb-1"); sb.CheckpointSeq != 1 {
		t.Errorf("CheckpointSeq = %d after a refusal, want 1", sb.CheckpointSeq)
	}
}

// TestDiskOnlyCheckpoint takes a disk-only checkpoint whole: its snapshot
// and directory are in place, under the names the core reads them by,
// and its record says what it is; deleting it removes its record.
func TestDiskOnlyCheckpoint(t *testing.T) {
	f := newFixture(t, checkpoint.Limits{})
	cp, err := f.s.CreateCheckpoint(f.ctx, "box", api.CreateCheckpoint{Name: "first", Comment: "a test", Memory: ptr(false)})
	if err != nil {
		t.Fatal(err)
	}
	if cp.ID != "v1" || cp.Name != "first" || cp.Memory || cp.Auto || cp.Inside || cp.Sandbox != "sb-1" {
		t.Errorf("checkpoint = %+v", cp)
	}
	snaps, err := f.disks.Snapshots(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(snaps, checkpoint.Snapshot("sb-1", "v1")) {
		t.Errorf("snapshots = %v, want %s", snaps, checkpoint.Snapshot("sb-1", "v1"))
	}
	if b, err := os.ReadFile(filepath.Join(f.disks.SnapshotPath(checkpoint.Snapshot("sb-1", "v1")), "hello")); err != nil || string(b) != "hello\n" {
		t.Errorf("the snapshot's file: %q, %v", b, err)
	}
	if fi, err := os.Stat(checkpoint.Dir(f.dir, "sb-1", "v1")); err != nil || !fi.IsDir() {
		t.Errorf("checkpoint dir: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(checkpoint.SandboxDir(f.dir, "sb-1"), ".tmp-*"))
	if len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	list, err := f.s.ListCheckpoints(f.ctx, "box")
	if err != nil || len(list) != 1 || list[0].ID != "v1" {
		t.Fatalf("ListCheckpoints = %v, %v", list, err)
	}
	if got, err := f.s.GetCheckpoint(f.ctx, "box", "first"); err != nil || got.ID != "v1" {
		t.Fatalf("GetCheckpoint by name = %v, %v", got, err)
	}
	if err := f.s.DeleteCheckpoint(f.ctx, "box", "v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.GetCheckpoint(f.ctx, "box", "v1"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("GetCheckpoint after delete: %v, want not found", err)
	}
}

// TestDeleteFromInside: a sandbox deletes only the checkpoints it took
// itself, never its owner's nor an automatic one, and every delete runs
// as the sandbox's operation with its checkpoints locked against forks.
func TestDeleteFromInside(t *testing.T) {
	f := newFixture(t, checkpoint.Limits{})
	inside := checkpoint.WithCaller(f.ctx, checkpoint.Inside)
	owners, err := f.s.CreateCheckpoint(f.ctx, "box", api.CreateCheckpoint{Memory: ptr(false)})
	if err != nil {
		t.Fatal(err)
	}
	mine, err := f.s.CreateCheckpoint(inside, "box", api.CreateCheckpoint{Memory: ptr(false)})
	if err != nil {
		t.Fatal(err)
	}
	if !mine.Inside {
		t.Errorf("a checkpoint taken from inside has Inside false")
	}
	if err := f.s.DeleteCheckpoint(inside, "box", owners.ID); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("deleting the owner's checkpoint from inside: %v, want forbidden", err)
	}
	if err := f.s.DeleteCheckpoint(inside, "box", mine.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.s.DeleteCheckpoint(f.ctx, "box", owners.ID); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.core.removed, []string{mine.ID, owners.ID}) || !slices.Equal(f.core.lockedAt, []int{1, 1}) {
		t.Errorf("removed %v with the lock held %v times, want [%s %s] each under the lock", f.core.removed, f.core.lockedAt, mine.ID, owners.ID)
	}
	want := []sandbox.Op{sandbox.OpCheckpoint, sandbox.OpCheckpoint, sandbox.OpCheckpointDelete, sandbox.OpCheckpointDelete, sandbox.OpCheckpointDelete}
	if !slices.Equal(f.core.ops, want) {
		t.Errorf("operations = %v, want %v", f.core.ops, want)
	}
}

func ptr[T any](v T) *T { return &v }

// forkCore is a fakeCore whose source is sandbox box's checkpoint v1, and
// whose warm pool hands over every fork (pooled, as asked).
type forkCore struct {
	*fakeCore
	src    *store.Sandbox
	cp     *store.Checkpoint
	pooled *store.Sandbox // what ClaimPooled was asked for
}

func (c *forkCore) SourceCheckpoint(_ context.Context, from *api.ForkSource) (*store.Sandbox, *store.Checkpoint, func(), error) {
	if from.Sandbox != c.src.Name || from.Checkpoint != c.cp.ID {
		return nil, nil, nil, api.Errorf(api.CodeNotFound, "no checkpoint %+v", from)
	}
	unlock := c.LockSource(c.src.ID) // a read lock in the core: counted alike
	return c.src, c.cp, unlock, nil
}

func (c *forkCore) NewRecord(_ context.Context, req api.CreateSandbox) (*store.Sandbox, error) {
	sb := &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-2", Name: req.Name, From: req.From,
		Resources: api.Resources{CPUs: 1, MemoryMiB: 512, DiskMiB: 4096}}}
	if req.Resources != nil && req.Resources.DiskMiB != 0 {
		sb.Resources.DiskMiB = req.Resources.DiskMiB
	}
	sb.Secrets = orNil(req.Secrets)
	if req.Network != nil {
		sb.Network = *req.Network
	}
	return sb, nil
}

func (c *forkCore) TakeFromCheckpoint(_ context.Context, sb *store.Sandbox, cp *store.Checkpoint, _ map[string]string) error {
	sb.Template, sb.Image, sb.Resources = cp.Template, cp.Image, cp.Resources
	return nil
}

func (c *forkCore) ClaimPooled(_ context.Context, src *store.Sandbox, cp *store.Checkpoint, want *store.Sandbox) (*api.Sandbox, bool, error) {
	c.pooled = want
	return &want.Sandbox, true, nil
}

// TestForkSeed: a fork takes its template and resources from the
// checkpoint but keeps its own disk limit, and takes its secrets and
// network from the source unless it gives its own.
func TestForkSeed(t *testing.T) {
	f := newFixture(t, checkpoint.Limits{})
	restricted := api.NetworkPolicy{Egress: api.EgressNone}
	src := &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-1", Name: "box", Network: restricted,
		Secrets: map[string]string{"TOKEN": "gh"}}}
	cp := &store.Checkpoint{Checkpoint: api.Checkpoint{ID: "v1", Sandbox: "sb-1", Memory: true},
		Template: "tiny", Resources: api.Resources{CPUs: 2, MemoryMiB: 1024, DiskMiB: 2048}}
	core := &forkCore{fakeCore: f.core, src: src, cp: cp}
	s := New(core, Config{DataDir: f.dir}, f.st, nil, f.disks, slog.New(slog.DiscardHandler))

	from := &api.ForkSource{Sandbox: "box", Checkpoint: "v1"}
	if _, err := s.Fork(f.ctx, api.CreateSandbox{Name: "kid", From: from, Resources: &api.Resources{DiskMiB: 8192}}); err != nil {
		t.Fatal(err)
	}
	got := core.pooled
	if got.Template != "tiny" || got.Resources != (api.Resources{CPUs: 2, MemoryMiB: 1024, DiskMiB: 8192}) {
		t.Errorf("fork's template and resources: %q %+v", got.Template, got.Resources)
	}
	if got.Secrets["TOKEN"] != "gh" || got.Network.Egress != api.EgressNone {
		t.Errorf("fork's secrets %v and network %+v: want the source's", got.Secrets, got.Network)
	}
	if got.From == nil || *got.From != (api.ForkSource{Sandbox: "box", Checkpoint: "v1"}) {
		t.Errorf("fork's From = %+v", got.From)
	}
	// Its own secrets and network replace the source's.
	open := api.NetworkPolicy{Egress: api.EgressAll}
	if _, err := s.Fork(f.ctx, api.CreateSandbox{Name: "kid2", From: from, Secrets: map[string]string{"KEY": "k"}, Network: &open}); err != nil {
		t.Fatal(err)
	}
	if got := core.pooled; got.Secrets["TOKEN"] != "" || got.Secrets["KEY"] != "k" || got.Network.Egress != api.EgressAll {
		t.Errorf("fork with its own: secrets %v, network %+v", got.Secrets, got.Network)
	}
	if _, err := s.Fork(f.ctx, api.CreateSandbox{From: &api.ForkSource{Sandbox: "box", Checkpoint: "v9"}}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("fork of no checkpoint: %v, want not found", err)
	}
}
