package sandbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/warmpool"
)

// The warm pools (package warmpool) over a whole Manager: they need the
// env's fakes, so their tests that make, claim and delete members live
// here; internal/warmpool tests the pools' own rules over a fake core.

// poolTest is an env whose Manager has warm pools, as the daemon's has.
type poolTest struct {
	*env
	// pools are the current Manager's (a restart makes new ones).
	pools *warmpool.Pools
}

// newPoolTest makes a poolTest; pc configures the pools (their DataDir is
// the Manager's).
func newPoolTest(t *testing.T, pc warmpool.Config) *poolTest {
	t.Helper()
	e := &poolTest{}
	e.env = newEnv(t, func(c *sandbox.Config) {
		pc.DataDir, pc.Org = c.DataDir, c.Org
		c.Pools = func(m *sandbox.Manager) sandbox.Pools {
			e.pools = warmpool.New(sandbox.NewPoolCore(m), pc, testLogger())
			return e.pools
		}
	})
	return e
}

// poolEnv is a poolTest whose host memory the test sets, with its pools
// running until stop.
func poolEnv(t *testing.T) (e *poolTest, avail *atomic.Int64, stop func()) {
	t.Helper()
	avail = new(atomic.Int64)
	avail.Store(64 << 30)
	e = newPoolTest(t, warmpool.Config{
		ReserveMiB:   1024,
		MemAvailable: func() (int64, error) { return avail.Load(), nil },
	})
	return e, avail, runPools(t, e)
}

// runPools loads e's pools and runs them until the test ends or the
// returned stop is called, which checks that Run returns, with no error,
// once its ctx has ended.
func runPools(t *testing.T, e *poolTest) (stop func()) {
	t.Helper()
	if err := e.pools.Load(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	ran := make(chan error, 1)
	ps := e.pools
	go func() { ran <- ps.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-ran:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the pools' Run still running 30 s after its ctx ended")
		}
	})
	t.Cleanup(stop)
	return stop
}

// waitReady waits until the checkpoint's pool has want members ready (or,
// for want 0, none), and returns it.
func waitReady(t *testing.T, e *poolTest, sb, cp string, want int) *api.Pool {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		p, err := e.pools.CheckpointPool(e.ctx, sb, cp)
		if err != nil {
			t.Fatal(err)
		}
		if p.Ready == want && p.Starting == 0 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool of %s/%s: %+v, want %d ready", sb, cp, p, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPoolMemory: a pool fills only while the host has memory to spare
// above the reserve, and gives members up when the host runs short.
func TestPoolMemory(t *testing.T) {
	e, avail, _ := poolEnv(t)
	e.create(api.CreateSandbox{Name: "src"})
	cp := e.checkpoint("src", true)

	avail.Store(512 << 20) // below the reserve
	if _, err := e.pools.SetCheckpointPool(e.ctx, "src", cp.ID, 2); err != nil {
		t.Fatal(err)
	}
	// The filler says why it holds back once it has looked: wait for it.
	var p *api.Pool
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if p, err = e.pools.CheckpointPool(e.ctx, "src", cp.ID); err != nil {
			t.Fatal(err)
		}
		if p.Held != "" || time.Now().After(deadline) {
			break
		}
	}
	if !strings.Contains(p.Held, "host memory is short") || p.Ready != 0 || p.Starting != 0 {
		t.Errorf("a pool on a host short of memory: %+v, want it held, with no member", p)
	}
	avail.Store(64 << 30)
	p = waitReady(t, e, "src", cp.ID, 2)
	if p.Held != "" {
		t.Errorf("a full pool says it is held: %q", p.Held)
	}
	if n := len(e.rt.IDs()); n != 3 {
		t.Errorf("%d containers, want the source and 2 members", n)
	}
	avail.Store(256 << 20)
	waitReady(t, e, "src", cp.ID, 0)
	if n := len(e.rt.IDs()); n != 1 {
		t.Errorf("%d containers after the host ran short, want the source alone", n)
	}
}

// TestPoolClaim: a fork takes a member, which becomes the fork (its id is
// the member's); members are not sandboxes of the API; a name in use gives
// the member back; deleting the source drains the pool; a restart deletes
// the members the last Manager left.
func TestPoolClaim(t *testing.T) {
	e, _, stop := poolEnv(t)
	e.create(api.CreateSandbox{Name: "src"})
	cp := e.checkpoint("src", true)
	if _, err := e.pools.SetCheckpointPool(e.ctx, "src", cp.ID, 1); err != nil {
		t.Fatal(err)
	}
	waitReady(t, e, "src", cp.ID, 1)
	members := e.rt.IDs()
	if list, err := e.m.List(e.ctx, nil); err != nil || len(list) != 1 {
		t.Errorf("List with a member: %d sandboxes, %v; want src alone", len(list), err)
	}
	for _, id := range members {
		if id != e.record("src").ID {
			if _, err := e.m.Get(e.ctx, id); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("Get of a member: %v, want not found", err)
			}
		}
	}
	from := &api.ForkSource{Sandbox: "src", Checkpoint: cp.ID}
	if _, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "src", From: from}); !errors.Is(err, api.ErrConflict) {
		t.Errorf("a fork named src: %v, want conflict", err)
	}
	waitReady(t, e, "src", cp.ID, 1)
	f, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "f", Labels: map[string]string{"k": "v"}, From: from})
	if err != nil {
		t.Fatal(err)
	}
	took := false
	for _, id := range members {
		took = took || id == f.ID
	}
	if !took || f.Name != "f" || f.Labels["k"] != "v" || f.State != api.StateRunning {
		t.Errorf("the fork %+v; want a member (%v) named f", f, members)
	}
	if r := e.record(f.ID); r.Pool != "" || r.Name != "f" {
		t.Errorf("the fork's record: pool %q, name %q", r.Pool, r.Name)
	}
	waitReady(t, e, "src", cp.ID, 1)

	// A restart: the members are deleted (by Run as it ends, or by
	// Recover after a crash: the stored member below), the pool made again.
	stop()
	crashed := *e.record(f.ID)
	crashed.ID, crashed.Name, crashed.NetIndex, crashed.Pool = "sb-crashedmember", "sb-crashedmember", 150, "checkpoint:x/v1"
	if err := e.st.CreateSandbox(e.ctx, &crashed); err != nil {
		t.Fatal(err)
	}
	if err := e.restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.GetSandbox(e.ctx, "", crashed.ID); err == nil {
		t.Errorf("a member the last daemon left is still stored after Recover")
	}
	runPools(t, e)
	waitReady(t, e, "src", cp.ID, 1)
	if n := len(e.rt.IDs()); n != 3 {
		t.Errorf("%d containers after a restart, want src, f and one member", n)
	}

	// Deleting the source drains its pool.
	if err := e.m.Delete(e.ctx, "src"); err != nil {
		t.Fatal(err)
	}
	if ids := e.rt.IDs(); len(ids) != 1 || ids[0] != f.ID {
		t.Errorf("containers after the source was deleted: %v, want the fork alone", ids)
	}
}

// TestPoolOrgQuota: a pool of an org's checkpoint keeps members of that
// org: they count against its pool_members quota (which stops the pool
// short of its size), not the daemon's, and a fork in the org claims one.
func TestPoolOrgQuota(t *testing.T) {
	e, _, _ := poolEnv(t)
	orgs := sandbox.NewOrgs(e.m)
	if _, err := orgs.Create(e.ctx, "docs"); err != nil {
		t.Fatal(err)
	}
	if _, err := orgs.SetQuota(e.ctx, "docs", api.Quota{PoolMembers: ptr(1)}); err != nil {
		t.Fatal(err)
	}
	docs := auth.WithPrincipal(e.ctx, auth.Principal{Org: "docs", Key: "key-docs", Scope: api.ScopeAdmin})
	if _, err := e.m.Create(docs, api.CreateSandbox{Name: "src"}); err != nil {
		t.Fatal(err)
	}
	cp, err := e.cps.CreateCheckpoint(docs, "src", api.CreateCheckpoint{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pools.SetCheckpointPool(docs, "src", cp.ID, 2); err != nil {
		t.Fatal(err)
	}
	// One member, then held by the quota (the pool says so).
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		p, err := e.pools.CheckpointPool(docs, "src", cp.ID)
		if err != nil {
			t.Fatal(err)
		}
		// A second member may be tried (starting), but is refused before
		// it is stored: docs never holds two.
		o, err := orgs.Get(e.ctx, "docs")
		if err != nil {
			t.Fatal(err)
		}
		if p.Ready > 1 || o.Use.PoolMembers > 1 {
			t.Fatalf("the pool past docs' quota of one member: %+v, docs uses %d", p, o.Use.PoolMembers)
		}
		if p.Ready == 1 && strings.Contains(p.Held, "quota") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool of docs' checkpoint: %+v, want one member, held by the quota", p)
		}
	}
	for org, want := range map[string]int{"docs": 1, e.cfg.Org: 0} {
		o, err := orgs.Get(e.ctx, org)
		if err != nil {
			t.Fatal(err)
		}
		if o.Use.PoolMembers != want {
			t.Errorf("org %s uses %d pool members, want %d", org, o.Use.PoolMembers, want)
		}
	}
	members := e.rt.IDs()
	f, err := e.m.Create(docs, api.CreateSandbox{Name: "f", From: &api.ForkSource{Sandbox: "src", Checkpoint: cp.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(members, f.ID) || e.record(f.ID).Org != "docs" {
		t.Errorf("the fork %s (org %s) is not docs' member of %v", f.ID, e.record(f.ID).Org, members)
	}
}

// TestTemplatePoolOrgs: each org keeps its own warm pool of a template, a
// built-in's too: its members are its (counted in its pool_members, and
// not in another's), a create in it claims its own member alone, and
// deleting the org with everything in it deletes its members and leaves
// another org's pool filled.
func TestTemplatePoolOrgs(t *testing.T) {
	e, _, _ := poolEnv(t)
	orgs := sandbox.NewOrgs(e.m)
	ctxs := map[string]context.Context{}
	for _, org := range []string{"docs", "ops"} {
		if _, err := orgs.Create(e.ctx, org); err != nil {
			t.Fatal(err)
		}
		ctxs[org] = auth.WithPrincipal(e.ctx, auth.Principal{Org: org, Key: "key-" + org, Scope: api.ScopeAdmin})
	}
	sizes := map[string]int{"docs": 1, "ops": 2}
	for org, size := range sizes {
		if p, err := e.pools.SetTemplatePool(ctxs[org], tinyTemplate, size); err != nil || p.Size != size || p.Template != tinyTemplate {
			t.Fatalf("%s's pool of %s: %+v, %v", org, tinyTemplate, p, err)
		}
	}
	ready := func(ctx context.Context) *api.Pool {
		t.Helper()
		p, err := e.pools.TemplatePool(ctx, tinyTemplate)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if d, o := ready(ctxs["docs"]), ready(ctxs["ops"]); d.Ready == 1 && o.Ready == 2 && d.Starting+o.Starting == 0 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the orgs' pools: docs %+v, ops %+v; want 1 and 2 ready", d, o)
		}
	}
	if p := ready(e.ctx); p.Size != 0 || p.Ready != 0 {
		t.Errorf("the daemon's org's pool of %s: %+v, want none (the others' are theirs)", tinyTemplate, p)
	}
	members := map[string][]string{}
	for _, id := range e.rt.IDs() {
		if sb := e.record(id); sb.Pool != "" {
			members[sb.Org] = append(members[sb.Org], id)
		}
	}
	for _, org := range []string{"docs", "ops", e.cfg.Org} {
		o, err := orgs.Get(e.ctx, org)
		if err != nil {
			t.Fatal(err)
		}
		if o.Use.PoolMembers != sizes[org] || len(members[org]) != sizes[org] {
			t.Errorf("org %s: %d pool members counted, %d made; want %d", org, o.Use.PoolMembers, len(members[org]), sizes[org])
		}
	}
	w, err := e.m.Create(ctxs["ops"], api.CreateSandbox{Name: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(members["ops"], w.ID) || e.record(w.ID).Org != "ops" {
		t.Errorf("ops' create %s is not one of its members %v", w.ID, members["ops"])
	}
	if p := ready(ctxs["docs"]); p.Claimed != 0 || p.Ready != 1 {
		t.Errorf("docs' pool after ops' create: %+v, want its member still there", p)
	}

	operator := auth.WithPrincipal(e.ctx, auth.Principal{Org: e.cfg.Org, Key: api.AdminKeyID, Scope: api.ScopeAdmin, Operator: true})
	if err := orgs.Delete(operator, "docs", false); err != nil {
		t.Fatalf("deleting docs, which has only its pool's member: %v", err)
	}
	for _, id := range members["docs"] {
		if _, err := e.st.GetSandbox(e.ctx, "", id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("docs' member %s after docs went: %v, want it deleted", id, err)
		}
		if slices.Contains(e.rt.IDs(), id) {
			t.Errorf("docs' member %s still runs", id)
		}
	}
	if p := ready(ctxs["docs"]); p.Size != 0 {
		t.Errorf("the deleted org's pool: %+v, want none", p)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if p := ready(ctxs["ops"]); p.Ready == 2 && p.Claimed == 1 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("ops' pool after docs went: %+v, want 2 ready again, 1 claimed", p)
		}
	}
}
