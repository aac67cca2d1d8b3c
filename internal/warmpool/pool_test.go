package warmpool

// The pools' own rules over a fake core: the pools file, filling one member
// at a time within the host's memory, claims and give-backs, forgetting a
// source. The tests over a whole Manager (members that are real sandboxes
// of the fake runtime, a restart, a member's death) are in
// internal/sandbox/pool_test.go and death_test.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeCore makes members that are records only, and remembers what it
// was asked.
type fakeCore struct {
	mu        sync.Mutex
	next      int
	live      map[string]string // member id -> its pool, made and not deleted
	deleted   []string
	making    int // MakePoolMember calls running
	maxMaking int
	// gone are the sources whose members cannot be made (not found).
	gone map[sandbox.PoolSource]bool
	// fail, when set, is the error of every MakePoolMember.
	fail error
	// claim answers ClaimPoolMember; nil hands the member over.
	claim func(member, want *store.Sandbox) (*api.Sandbox, bool, error)
}

func newFakeCore() *fakeCore {
	return &fakeCore{live: map[string]string{}, gone: map[sandbox.PoolSource]bool{}}
}

func (c *fakeCore) PoolCheckpoint(ctx context.Context, ref, cpRef string) (sandbox.PoolSource, func(), error) {
	from := sandbox.PoolSource{Sandbox: "sb-" + ref, Checkpoint: cpRef}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone[from] {
		return sandbox.PoolSource{}, nil, api.Errorf(api.CodeNotFound, "checkpoint %q not found", cpRef)
	}
	return from, func() {}, nil
}

// PoolTemplate names the caller's org's pool of name (the daemon's org,
// default, for a call without a principal), as the core does.
func (c *fakeCore) PoolTemplate(ctx context.Context, name string) (sandbox.PoolSource, error) {
	if name == "nope" {
		return sandbox.PoolSource{}, api.Errorf(api.CodeNotFound, "template %q not found", name)
	}
	return sandbox.PoolSource{Org: auth.OrgOr(ctx, "default"), Template: name}, nil
}

func (c *fakeCore) MakePoolMember(ctx context.Context, from sandbox.PoolSource, pool string) (*store.Sandbox, error) {
	c.mu.Lock()
	c.making++
	c.maxMaking = max(c.maxMaking, c.making)
	gone, fail := c.gone[from], c.fail
	c.mu.Unlock()
	// A member takes a moment to make: long enough for a second filler,
	// if the pools ran two at once, to be seen making one too.
	time.Sleep(5 * time.Millisecond)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.making--
	if gone {
		return nil, api.Errorf(api.CodeNotFound, "sandbox %q not found", from.Sandbox)
	}
	if fail != nil {
		return nil, fail
	}
	c.next++
	sb := &store.Sandbox{}
	sb.ID, sb.Pool = fmt.Sprintf("sb-member%d", c.next), pool
	c.live[sb.ID] = pool
	return sb, nil
}

func (c *fakeCore) DeletePoolMember(ctx context.Context, member *store.Sandbox) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.live, member.ID)
	c.deleted = append(c.deleted, member.ID)
}

func (c *fakeCore) ClaimPoolMember(ctx context.Context, pool string, member, want *store.Sandbox, services []api.Service) (*api.Sandbox, bool, error) {
	c.mu.Lock()
	claim := c.claim
	c.mu.Unlock()
	if claim != nil {
		return claim(member, want)
	}
	c.mu.Lock()
	delete(c.live, member.ID)
	c.mu.Unlock()
	v := want.Sandbox
	v.ID = member.ID
	return &v, true, nil
}

func (c *fakeCore) ContainerMemory(id string) int64 { return 100 << 20 }

func (c *fakeCore) MemoryImageBytes(from sandbox.PoolSource) int64 { return 0 }

// members is how many members the core holds made and not deleted.
func (c *fakeCore) members() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.live)
}

func (c *fakeCore) wasDeleted(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.deleted, id)
}

// fixture is pools over a fake core, in a data dir of their own, whose
// host memory the test sets.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	dir   string
	core  *fakeCore
	avail atomic.Int64
	ps    *Pools
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, ctx: t.Context(), dir: t.TempDir(), core: newFakeCore()}
	f.avail.Store(64 << 30)
	f.ps = f.newPools()
	return f
}

func (f *fixture) newPools() *Pools {
	return New(f.core, Config{
		DataDir: f.dir, ReserveMiB: 1024, Org: "default",
		MemAvailable: func() (int64, error) { return f.avail.Load(), nil },
	}, slog.New(slog.DiscardHandler))
}

// run runs the pools until the test ends or stop is called, which checks
// that Run returns nil once its ctx has ended.
func (f *fixture) run() (stop func()) {
	ctx, cancel := context.WithCancel(f.ctx)
	ran := make(chan error, 1)
	ps := f.ps
	go func() { ran <- ps.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-ran:
			if err != nil {
				f.t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			f.t.Error("Run still running 30 s after its ctx ended")
		}
	})
	f.t.Cleanup(stop)
	return stop
}

// members lists the ids of pool key's ready members, oldest first.
func (ps *Pools) members(key string) []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var ids []string
	if p := ps.all[key]; p != nil {
		for _, sb := range p.ready {
			ids = append(ids, sb.ID)
		}
	}
	return ids
}

// eventually waits until cond holds, failing the test if it does not
// within 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after 10s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (f *fixture) pool(ref, cp string) *api.Pool {
	f.t.Helper()
	p, err := f.ps.CheckpointPool(f.ctx, ref, cp)
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *fixture) waitReady(ref, cp string, want int) {
	f.t.Helper()
	eventually(f.t, fmt.Sprintf("%d ready in the pool of %s/%s", want, ref, cp), func() bool {
		p := f.pool(ref, cp)
		return p.Ready == want && p.Starting == 0
	})
}

// TestPoolsFile: the sizes are kept in pools.json, in the format the last
// daemons wrote (sorted by pool, tab-indented, empty fields left out), read
// back by Load; a size of 0 removes a pool; a file that is not JSON is an
// error that names it.
func TestPoolsFile(t *testing.T) {
	f := newFixture(t)
	if _, err := f.ps.SetTemplatePool(f.ctx, "busybox", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ps.SetCheckpointPool(f.ctx, "src", "v1", 3); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ps.SetCheckpointPool(f.ctx, "old", "v2", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ps.SetCheckpointPool(f.ctx, "old", "v2", 0); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(f.dir, "pools.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := `[
	{
		"sandbox": "sb-src",
		"checkpoint": "v1",
		"size": 3
	},
	{
		"org": "default",
		"template": "busybox",
		"size": 2
	}
]`
	if string(b) != want {
		t.Errorf("pools.json:\n%s\nwant:\n%s", b, want)
	}

	// A template pool kept before pools were each org's names no org:
	// it is the daemon's.
	old := filepath.Join(t.TempDir(), "pools.json")
	if err := os.WriteFile(old, []byte(`[{"template": "base", "size": 1}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	before := New(f.core, Config{DataDir: filepath.Dir(old), Org: "default"}, slog.New(slog.DiscardHandler))
	if err := before.Load(); err != nil {
		t.Fatal(err)
	}
	if p, err := before.TemplatePool(f.ctx, "base"); err != nil || p.Size != 1 {
		t.Errorf("an old pool of the daemon's after Load: %+v, %v; want size 1", p, err)
	}
	if p, err := before.TemplatePool(auth.WithPrincipal(f.ctx, auth.Principal{Org: "docs"}), "base"); err != nil || p.Size != 0 {
		t.Errorf("another org's pool of the same template after Load: %+v, %v; want none", p, err)
	}

	again := f.newPools()
	if err := again.Load(); err != nil {
		t.Fatal(err)
	}
	if p, err := again.CheckpointPool(f.ctx, "src", "v1"); err != nil || p.Size != 3 || p.Ready != 0 ||
		p.From == nil || p.From.Sandbox != "sb-src" || p.From.Checkpoint != "v1" {
		t.Errorf("the checkpoint's pool after Load: %+v, %v; want size 3, none ready", p, err)
	}
	if p, err := again.TemplatePool(f.ctx, "busybox"); err != nil || p.Size != 2 || p.Template != "busybox" {
		t.Errorf("the template's pool after Load: %+v, %v; want size 2", p, err)
	}
	if p, err := again.CheckpointPool(f.ctx, "old", "v2"); err != nil || p.Size != 0 {
		t.Errorf("a drained pool after Load: %+v, %v; want size 0", p, err)
	}

	if err := os.WriteFile(filepath.Join(f.dir, "pools.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.newPools().Load(); err == nil || !strings.HasPrefix(err.Error(), "reading pools: pools.json: ") {
		t.Errorf("Load of a broken file: %v, want an error naming pools.json", err)
	}
	if err := New(f.core, Config{DataDir: t.TempDir()}, slog.New(slog.DiscardHandler)).Load(); err != nil {
		t.Errorf("Load without a file: %v, want no pools and no error", err)
	}
}

// TestPoolsSize: a size out of range is the user's mistake, with the
// API's message; a template the core does not know has no pool.
func TestPoolsSize(t *testing.T) {
	f := newFixture(t)
	for _, size := range []int{-1, api.MaxPoolSize + 1} {
		_, err := f.ps.SetCheckpointPool(f.ctx, "src", "v1", size)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeInvalid ||
			ae.Message != fmt.Sprintf("size: %d; a pool keeps 0 to %d sandboxes", size, api.MaxPoolSize) {
			t.Errorf("a pool of %d: %v, want invalid, with the API's message", size, err)
		}
		if _, err := f.ps.SetTemplatePool(f.ctx, "busybox", size); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("a template pool of %d: %v, want invalid", size, err)
		}
	}
	if _, err := f.ps.SetTemplatePool(f.ctx, "nope", 1); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a pool of an unknown template: %v, want not found", err)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "pools.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pools.json after refused sets: %v, want none written", err)
	}
}

// TestPoolsFill: Run fills every pool to its size, making one member at a
// time across pools, follows a smaller size by deleting the extra, holds
// back while the host is short of memory, and gives members up when it
// runs short; when its ctx ends it deletes the members and keeps the sizes.
func TestPoolsFill(t *testing.T) {
	f := newFixture(t)
	stop := f.run()
	if _, err := f.ps.SetCheckpointPool(f.ctx, "a", "v1", 3); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ps.SetCheckpointPool(f.ctx, "b", "v1", 2); err != nil {
		t.Fatal(err)
	}
	f.waitReady("a", "v1", 3)
	f.waitReady("b", "v1", 2)
	if n := f.core.members(); n != 5 {
		t.Errorf("%d members made, want 5", n)
	}
	f.core.mu.Lock()
	most := f.core.maxMaking
	f.core.mu.Unlock()
	if most != 1 {
		t.Errorf("%d members made at once, want 1 at a time", most)
	}
	if p := f.pool("a", "v1"); p.MemoryBytes != 3*100<<20 || p.Held != "" {
		t.Errorf("a full pool: %+v, want 300 MiB held by its members, not held back", p)
	}

	if _, err := f.ps.SetCheckpointPool(f.ctx, "a", "v1", 1); err != nil {
		t.Fatal(err)
	}
	if p := f.pool("a", "v1"); p.Ready != 1 || f.core.members() != 3 {
		t.Errorf("a pool set from 3 to 1: %+v, %d members in all; want 1 ready, 3 in all", p, f.core.members())
	}

	// Short of memory: b's members go (the pool holding the most first),
	// and no pool fills again until the host has memory to spare.
	f.avail.Store(512 << 20)
	eventually(t, "every member deleted on a host short of memory", func() bool { return f.core.members() == 0 })
	if p := f.pool("b", "v1"); !strings.HasPrefix(p.Held, "host memory is short: 512 MiB available") {
		t.Errorf("a pool emptied for memory: %+v, want it held saying why", p)
	}
	f.avail.Store(64 << 30)
	f.waitReady("a", "v1", 1)
	f.waitReady("b", "v1", 2)

	stop()
	if n := f.core.members(); n != 0 {
		t.Errorf("%d members left once Run ended, want none", n)
	}
	again := f.newPools()
	if err := again.Load(); err != nil {
		t.Fatal(err)
	}
	if p, _ := again.CheckpointPool(f.ctx, "b", "v1"); p.Size != 2 {
		t.Errorf("b's size after Run ended: %d, want 2 kept", p.Size)
	}
	if err := f.ps.Run(f.ctx); err == nil {
		t.Error("a second Run of the same pools: no error")
	}
}

// TestPoolsClaim: a claim takes the oldest member and counts it; a
// conflict puts it back first in line; a member the core found no good is
// the core's (neither kept nor deleted again); a claim on an empty pool
// says so, and the pool is filled again after a claim.
func TestPoolsClaim(t *testing.T) {
	f := newFixture(t)
	f.run()
	from := sandbox.PoolSource{Sandbox: "sb-src", Checkpoint: "v1"}
	want := func(name string) *store.Sandbox {
		sb := &store.Sandbox{}
		sb.Name = name
		return sb
	}
	if v, ok, err := f.ps.Claim(f.ctx, from, want("f0"), nil); v != nil || ok || err != nil {
		t.Errorf("a claim with no pool: %v, %v, %v; want nothing", v, ok, err)
	}
	if _, err := f.ps.SetCheckpointPool(f.ctx, "src", "v1", 2); err != nil {
		t.Fatal(err)
	}
	f.waitReady("src", "v1", 2)
	first := f.ps.members("checkpoint:sb-src/v1")[0]

	conflict := api.Errorf(api.CodeConflict, "name %q is in use", "taken")
	f.core.mu.Lock()
	f.core.claim = func(member, want *store.Sandbox) (*api.Sandbox, bool, error) { return nil, false, conflict }
	f.core.mu.Unlock()
	if v, ok, err := f.ps.Claim(f.ctx, from, want("taken"), nil); v != nil || !ok || !errors.Is(err, conflict) {
		t.Errorf("a claim refused with a conflict: %v, %v, %v; want the conflict", v, ok, err)
	}
	if got := f.ps.members("checkpoint:sb-src/v1"); len(got) != 2 || got[0] != first {
		t.Errorf("members after a conflict: %v, want %s back first of 2", got, first)
	}

	f.core.mu.Lock()
	f.core.claim = func(member, want *store.Sandbox) (*api.Sandbox, bool, error) { return nil, false, nil }
	f.core.mu.Unlock()
	if v, ok, err := f.ps.Claim(f.ctx, from, want("bad"), nil); v != nil || ok || err != nil {
		t.Errorf("a claim of a member that is no good: %v, %v, %v; want the slow way", v, ok, err)
	}
	if got := f.ps.members("checkpoint:sb-src/v1"); slices.Contains(got, first) || f.core.wasDeleted(first) {
		t.Errorf("a member that was no good: still in the pool (%v) or deleted by the pool too", got)
	}

	f.core.mu.Lock()
	f.core.claim = nil
	f.core.mu.Unlock()
	f.waitReady("src", "v1", 2)
	next := f.ps.members("checkpoint:sb-src/v1")[0]
	v, ok, err := f.ps.Claim(f.ctx, from, want("f"), nil)
	if err != nil || !ok || v.ID != next || v.Name != "f" {
		t.Fatalf("a claim: %+v, %v, %v; want %s named f", v, ok, err, next)
	}
	f.waitReady("src", "v1", 2)
	if p := f.pool("src", "v1"); p.Claimed != 1 {
		t.Errorf("claimed %d, want 1 (a conflict or a bad member is no claim)", p.Claimed)
	}
}

// TestPoolsForget: deleting a sandbox drains the pools of its checkpoints
// (not a template's), deleting a checkpoint its own, deleting a template
// its own; what is forgotten is forgotten in pools.json too. A pool whose
// source turns out gone when a member is made is dropped the same way.
func TestPoolsForget(t *testing.T) {
	f := newFixture(t)
	f.run()
	for _, c := range [][2]string{{"a", "v1"}, {"a", "v2"}, {"b", "v1"}} {
		if _, err := f.ps.SetCheckpointPool(f.ctx, c[0], c[1], 1); err != nil {
			t.Fatal(err)
		}
		f.waitReady(c[0], c[1], 1)
	}
	if _, err := f.ps.SetTemplatePool(f.ctx, "busybox", 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the template's pool filled", func() bool {
		p, err := f.ps.TemplatePool(f.ctx, "busybox")
		return err == nil && p.Ready == 1
	})

	f.ps.Forget(f.ctx, sandbox.PoolSource{Sandbox: "sb-b", Checkpoint: "v1"})
	if p := f.pool("b", "v1"); p.Size != 0 || p.Ready != 0 {
		t.Errorf("a forgotten checkpoint's pool: %+v, want none", p)
	}
	f.ps.Forget(f.ctx, sandbox.PoolSource{Sandbox: "sb-a"})
	if pa1, pa2 := f.pool("a", "v1"), f.pool("a", "v2"); pa1.Size != 0 || pa2.Size != 0 {
		t.Errorf("the pools of a forgotten sandbox: %+v, %+v; want none", pa1, pa2)
	}
	if p, _ := f.ps.TemplatePool(f.ctx, "busybox"); p.Size != 1 {
		t.Errorf("a template's pool after a sandbox was forgotten: %+v, want it kept", p)
	}
	if n := f.core.members(); n != 1 {
		t.Errorf("%d members after the forgets, want the template's alone", n)
	}
	f.ps.Forget(f.ctx, sandbox.PoolSource{Org: "default", Template: "busybox"})
	if n := f.core.members(); n != 0 {
		t.Errorf("%d members after the template was forgotten, want none", n)
	}
	b, err := os.ReadFile(filepath.Join(f.dir, "pools.json"))
	if err != nil || string(b) != "[]" {
		t.Errorf("pools.json after every pool was forgotten: %q, %v; want []", b, err)
	}

	// A source found gone by the filler: the pool is dropped, and says so
	// no more (its sizes are no longer kept).
	f.core.mu.Lock()
	f.core.gone[sandbox.PoolSource{Org: "default", Template: "gone"}] = true
	f.core.mu.Unlock()
	if _, err := f.ps.SetTemplatePool(f.ctx, "gone", 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pool of a gone template dropped", func() bool {
		p, err := f.ps.TemplatePool(f.ctx, "gone")
		return err == nil && p.Size == 0
	})

	// A failure that is not a missing source holds the pool, saying why.
	f.core.mu.Lock()
	f.core.fail = errors.New("disk full")
	f.core.mu.Unlock()
	if _, err := f.ps.SetTemplatePool(f.ctx, "busybox", 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a failing pool held", func() bool {
		p, err := f.ps.TemplatePool(f.ctx, "busybox")
		return err == nil && p.Held == "making a member failed: disk full" && p.Size == 1
	})
}

// TestPoolsOrgs: each org keeps its own pool of a template, built-ins
// included: its members are made for its pool alone, claimed by its creates
// alone, and a forgotten org's pools go while another's stay.
func TestPoolsOrgs(t *testing.T) {
	f := newFixture(t)
	f.run()
	docs := auth.WithPrincipal(f.ctx, auth.Principal{Org: "docs"})
	ops := auth.WithPrincipal(f.ctx, auth.Principal{Org: "ops"})
	if _, err := f.ps.SetTemplatePool(docs, "busybox", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ps.SetTemplatePool(ops, "busybox", 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both orgs' pools filled", func() bool {
		d, _ := f.ps.TemplatePool(docs, "busybox")
		o, _ := f.ps.TemplatePool(ops, "busybox")
		return d.Ready == 2 && o.Ready == 1
	})
	if p, _ := f.ps.TemplatePool(f.ctx, "busybox"); p.Size != 0 {
		t.Errorf("the daemon's org's pool of busybox: %+v, want none (the others are theirs)", p)
	}
	opsMember := f.ps.members("template:ops/busybox")
	want := &store.Sandbox{}
	want.Name = "w"
	v, ok, err := f.ps.Claim(docs, sandbox.PoolSource{Org: "docs", Template: "busybox"}, want, nil)
	if err != nil || !ok || slices.Contains(opsMember, v.ID) {
		t.Fatalf("docs' claim: %+v, %v, %v; want one of docs' members (ops' are %v)", v, ok, err, opsMember)
	}
	if v, ok, err := f.ps.Claim(f.ctx, sandbox.PoolSource{Org: "default", Template: "busybox"}, want, nil); ok || v != nil || err != nil {
		t.Errorf("a claim in an org without a pool: %+v, %v, %v; want the slow way", v, ok, err)
	}
	f.ps.Forget(f.ctx, sandbox.PoolSource{Org: "docs"})
	if p, _ := f.ps.TemplatePool(docs, "busybox"); p.Size != 0 || p.Ready != 0 {
		t.Errorf("a forgotten org's pool: %+v, want none", p)
	}
	if got := f.ps.members("template:ops/busybox"); !slices.Equal(got, opsMember) {
		t.Errorf("ops' members after docs was forgotten: %v, want %v", got, opsMember)
	}
	eventually(t, "docs' members deleted", func() bool { return f.core.members() == 1 })
}

// TestPoolsLost: a member whose sandbox died leaves its pool, is deleted,
// and another is made.
func TestPoolsLost(t *testing.T) {
	f := newFixture(t)
	f.run()
	if _, err := f.ps.SetCheckpointPool(f.ctx, "src", "v1", 1); err != nil {
		t.Fatal(err)
	}
	f.waitReady("src", "v1", 1)
	dead := f.ps.members("checkpoint:sb-src/v1")[0]
	sb := &store.Sandbox{}
	sb.ID = dead
	f.ps.Lost(f.ctx, sb)
	if !f.core.wasDeleted(dead) {
		t.Errorf("the dead member %s was not deleted", dead)
	}
	f.waitReady("src", "v1", 1)
	if got := f.ps.members("checkpoint:sb-src/v1"); slices.Contains(got, dead) {
		t.Errorf("the dead member is still in the pool: %v", got)
	}
}
