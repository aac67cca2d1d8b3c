package template

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/store"
)

// fakeBuiltins knows one built-in template, "tiny", imported from src.
type fakeBuiltins struct {
	pool disk.Pool
	src  string
}

func (f fakeBuiltins) List(ctx context.Context) []api.Template {
	ready, _ := f.pool.HasTemplate(ctx, "tiny")
	return []api.Template{{Name: "tiny", Default: true, Ready: ready, Kind: api.TemplateBuiltin}}
}

func (f fakeBuiltins) Ensure(ctx context.Context, name string) error {
	if name != "tiny" {
		return disk.ErrNotFound
	}
	if ok, err := f.pool.HasTemplate(ctx, name); err != nil || ok {
		return err
	}
	return f.pool.ImportTemplate(ctx, name, f.src)
}

func (f fakeBuiltins) Has(name string) bool { return name == "tiny" }

// fakeCore holds the checkpoints of srcs, by "sandbox/checkpoint".
type fakeCore struct {
	mu   sync.Mutex
	srcs map[string]*checkpoint.Source
	held int // checkpoints held now
	// room is the bytes of templates an org may still add (absent:
	// unlimited); admitted what each admission asked for, and holding
	// the admissions not released.
	room     map[string]int64
	admitted []int64
	holding  int
}

func (c *fakeCore) Heavy(ctx context.Context, what string) (func(), error) { return func() {}, nil }

func (c *fakeCore) HoldCheckpoint(ctx context.Context, from *api.ForkSource) (*checkpoint.Source, func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if from == nil {
		return nil, nil, api.Errorf(api.CodeInvalid, "from: give both sandbox and checkpoint")
	}
	src, ok := c.srcs[from.Sandbox+"/"+from.Checkpoint]
	if !ok {
		return nil, nil, api.Errorf(api.CodeNotFound, "checkpoint %q not found", from.Checkpoint)
	}
	c.held++
	return src, func() { c.mu.Lock(); c.held--; c.mu.Unlock() }, nil
}

func (c *fakeCore) AdmitTemplate(ctx context.Context, org string, bytes int64) (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.admitted = append(c.admitted, bytes)
	if room, ok := c.room[org]; ok && bytes > room {
		return nil, api.Errorf(api.CodeLimit, "org %s would use %d bytes more, %d left", org, bytes, room)
	}
	c.holding++
	return func() { c.mu.Lock(); c.holding--; c.mu.Unlock() }, nil
}

func (c *fakeCore) CheckResources(r api.Resources) error {
	if r.CPUs > 64 {
		return api.Errorf(api.CodeInvalid, "resources.cpus: %g; at most 64", r.CPUs)
	}
	return nil
}

// fakePools records the template pools set and dropped.
type fakePools struct {
	mu      sync.Mutex
	set     map[string]int
	dropped []string
}

// SetTemplatePool records the size of the caller's org's pool, ORG/NAME.
func (p *fakePools) SetTemplatePool(ctx context.Context, name string, size int) (*api.Pool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.set[auth.OrgOr(ctx, "default")+"/"+name] = size
	return &api.Pool{Size: size}, nil
}

func (p *fakePools) DropTemplatePools(ctx context.Context, org, name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropped = append(p.dropped, org+"/"+name)
}

// fakeSandboxes are the sandboxes the catalog counts as uses.
type fakeSandboxes struct {
	mu  sync.Mutex
	sbs []*store.Sandbox
}

func (f *fakeSandboxes) ListSandboxes(ctx context.Context, filter store.Filter) ([]*store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*store.Sandbox
	for _, sb := range f.sbs {
		if filter.Org == "" || sb.Org == filter.Org {
			out = append(out, sb)
		}
	}
	return out, nil
}

func (f *fakeSandboxes) add(sb *store.Sandbox) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sbs = append(f.sbs, sb)
}

type fakeImages []api.Image

func (f fakeImages) List(ctx context.Context) ([]api.Image, error) { return f, nil }

type env struct {
	pool    *disk.Copy
	store   *Store
	core    *fakeCore
	pools   *fakePools
	sbs     *fakeSandboxes
	cat     *Catalog
	dataDir string
}

// newEnv makes a catalog over a copy pool with the built-in "tiny" and two
// checkpoints of sandbox "box": v1 (disk only, with a secret file) and m1
// (memory).
func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := t.Context()
	pool, err := disk.NewCopy(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	src := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(src, "run", "secrets"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "hello.txt"), []byte("hello\n"), 0o644))
	b := fakeBuiltins{pool: pool, src: src}
	must(t, b.Ensure(ctx, "tiny"))
	// The checkpoints' disks: a volume of tiny with a secret file, frozen.
	root, err := pool.CreateVolume(ctx, "sb-1", "tiny")
	must(t, err)
	must(t, os.WriteFile(filepath.Join(root, "run", "secrets", "db"), []byte("s3cret"), 0o600))
	must(t, pool.Snapshot(ctx, "sb-1", "sb-1.v1"))
	must(t, pool.Snapshot(ctx, "sb-1", "sb-1.m1"))
	mem := t.TempDir()
	must(t, os.WriteFile(filepath.Join(mem, "pages.img"), bytes.Repeat([]byte{7}, 3000), 0o600))
	res := api.Resources{CPUs: 1, MemoryMiB: 256, DiskMiB: 1024}
	core := &fakeCore{srcs: map[string]*checkpoint.Source{
		"box/v1": {Sandbox: "box", SecretFiles: map[string]string{"/run/secrets/db": "db"},
			Checkpoint: &store.Checkpoint{Checkpoint: api.Checkpoint{ID: "v1"}, Template: "tiny", Resources: res},
			Snapshot:   "sb-1.v1"},
		"box/m1": {Sandbox: "box", Checkpoint: &store.Checkpoint{Checkpoint: api.Checkpoint{ID: "m1", Memory: true}, Template: "tiny", Resources: res},
			Snapshot: "sb-1.m1", MemDir: mem, AgentToken: "held-token"},
	}}
	e := &env{pool: pool, core: core, pools: &fakePools{set: map[string]int{}}, sbs: &fakeSandboxes{}, dataDir: t.TempDir()}
	log := slog.New(slog.DiscardHandler)
	e.store = NewStore(e.dataDir, "default", b, pool, log)
	e.cat = New(Config{Store: e.store, Core: core, Pools: e.pools, Sandboxes: e.sbs, Log: log,
		Images: fakeImages{{ID: "im-1", Ref: "alpine:3", State: api.ImageReady, Size: 10, CreatedAt: time.Unix(1, 0)}}})
	return e
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, what string, err error, code api.Code, msg string) {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != code || !strings.Contains(ae.Message, msg) {
		t.Fatalf("%s: %v, want %s containing %q", what, err, code, msg)
	}
}

// TestCatalogCreateDelete: a template of a checkpoint copies its disk
// without the source's secret files, is listed after the built-ins and
// before the images, refuses names taken or bad, and is deleted only when
// no sandbox uses it, leaving no snapshot.
func TestCatalogCreateDelete(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	tpl, err := e.cat.Create(ctx, api.CreateTemplate{Name: "cold", From: &api.ForkSource{Sandbox: "box", Checkpoint: "v1"}, Pool: 2})
	must(t, err)
	if tpl.Kind != api.TemplateCheckpoint || tpl.Memory || tpl.From != "box/v1" || !tpl.Ready {
		t.Fatalf("made %+v", tpl)
	}
	if e.core.held != 0 {
		t.Fatalf("%d checkpoints still held", e.core.held)
	}
	if e.pools.set["default/cold"] != 2 {
		t.Fatalf("pools set: %v", e.pools.set)
	}
	man, err := e.store.Kept("default", "cold")
	must(t, err)
	if man == nil || !strings.HasPrefix(man.Snapshot, snapPrefix+"cold.") || man.Template != "tiny" {
		t.Fatalf("manifest %+v", man)
	}
	snap := e.pool.SnapshotPath(man.Snapshot)
	if _, err := os.Stat(filepath.Join(snap, "hello.txt")); err != nil {
		t.Fatalf("the template's disk lacks the checkpoint's files: %v", err)
	}
	if _, err := os.Stat(filepath.Join(snap, "run", "secrets", "db")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the template kept the source's secret file: %v", err)
	}

	for _, bad := range []struct {
		req  api.CreateTemplate
		code api.Code
		msg  string
	}{
		{api.CreateTemplate{Name: "cold", From: &api.ForkSource{Sandbox: "box", Checkpoint: "v1"}}, api.CodeConflict, `template "cold" exists`},
		{api.CreateTemplate{Name: "tiny", From: &api.ForkSource{Sandbox: "box", Checkpoint: "v1"}}, api.CodeConflict, "(a built-in)"},
		{api.CreateTemplate{Name: "Bad/Name", From: &api.ForkSource{Sandbox: "box", Checkpoint: "v1"}}, api.CodeInvalid, "a template name is"},
		{api.CreateTemplate{Name: "x", From: &api.ForkSource{Sandbox: "box", Checkpoint: "v1"}, Pool: -1}, api.CodeInvalid, "size"},
		{api.CreateTemplate{Name: "x", From: &api.ForkSource{Sandbox: "box", Checkpoint: "nope"}}, api.CodeNotFound, "nope"},
	} {
		_, err := e.cat.Create(ctx, bad.req)
		wantCode(t, bad.req.Name, err, bad.code, bad.msg)
	}

	e.sbs.add(&store.Sandbox{Sandbox: api.Sandbox{Name: "w1", Template: "cold"}})
	e.sbs.add(&store.Sandbox{Sandbox: api.Sandbox{Name: "member", Template: "cold"}, Pool: "template:cold"})
	e.sbs.add(&store.Sandbox{Sandbox: api.Sandbox{Name: "a1", Image: "alpine:3"}})
	list := e.cat.List(ctx)
	var got []string
	for _, t := range list {
		got = append(got, t.Kind+":"+t.Name)
	}
	if want := []string{"builtin:tiny", "checkpoint:cold", "image:alpine:3"}; !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	if list[1].Uses != 1 || list[2].Uses != 1 || list[2].State != api.TemplateReady {
		t.Fatalf("uses and states: %+v", list)
	}

	wantCode(t, "delete used", e.cat.Delete(ctx, "cold"), api.CodeConflict, "used by sandbox w1")
	wantCode(t, "delete built-in", e.cat.Delete(ctx, "tiny"), api.CodeForbidden, "built in")
	e.sbs.sbs = nil
	must(t, e.cat.Delete(ctx, "cold"))
	if !slices.Equal(e.pools.dropped, []string{"default/cold"}) {
		t.Fatalf("pools dropped: %v", e.pools.dropped)
	}
	if snaps, _ := e.pool.Snapshots(ctx); slices.ContainsFunc(snaps, func(s string) bool { return strings.HasPrefix(s, snapPrefix) }) {
		t.Fatalf("a deleted template left its snapshot: %v", snaps)
	}
	if entries, _ := os.ReadDir(e.store.dir()); len(entries) != 0 {
		t.Fatalf("a deleted template left %v", entries)
	}
	wantCode(t, "delete again", e.cat.Delete(ctx, "cold"), api.CodeNotFound, `"cold" not found`)
}

// TestCatalogAdmitted: a template is admitted to its org's quota by what
// it will hold, before anything is made: refused, it leaves no snapshot
// and no template; admitted, it asked for exactly the bytes its manifest
// then counts, for a create and an import alike, and lets go after.
func TestCatalogAdmitted(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	from := &api.ForkSource{Sandbox: "box", Checkpoint: "m1"}
	e.core.room = map[string]int64{"default": 100}
	snapsBefore, _ := e.pool.Snapshots(ctx)
	_, err := e.cat.Create(ctx, api.CreateTemplate{Name: "warm", From: from})
	wantCode(t, "create over quota", err, api.CodeLimit, "org default would use")
	if after, _ := e.pool.Snapshots(ctx); !slices.Equal(after, snapsBefore) {
		t.Fatalf("a refused template changed the snapshots: %v, then %v", snapsBefore, after)
	}
	if man, err := e.store.Kept("default", "warm"); err != nil || man != nil {
		t.Fatalf("a refused template was kept: %+v, %v", man, err)
	}

	delete(e.core.room, "default")
	_, err = e.cat.Create(ctx, api.CreateTemplate{Name: "warm", From: from})
	must(t, err)
	man, err := e.store.Kept("default", "warm")
	must(t, err)
	if got := e.core.admitted[len(e.core.admitted)-1]; got != man.SizeBytes || got < 3000 {
		t.Fatalf("admitted %d bytes for a template of %d (its memory image alone is 3000)", got, man.SizeBytes)
	}
	var buf bytes.Buffer
	must(t, e.cat.Export(ctx, "warm", &buf))

	e.core.room = map[string]int64{"default": man.SizeBytes - 1}
	_, err = e.cat.Import(ctx, "moved", bytes.NewReader(buf.Bytes()))
	wantCode(t, "import over quota", err, api.CodeLimit, "org default would use")
	if man, err := e.store.Kept("default", "moved"); err != nil || man != nil {
		t.Fatalf("a refused import was kept: %+v, %v", man, err)
	}
	e.core.room["default"] = man.SizeBytes
	_, err = e.cat.Import(ctx, "moved", bytes.NewReader(buf.Bytes()))
	must(t, err)
	moved, err := e.store.Kept("default", "moved")
	must(t, err)
	if got := e.core.admitted[len(e.core.admitted)-1]; got != moved.SizeBytes {
		t.Fatalf("import admitted %d bytes for a template of %d", got, moved.SizeBytes)
	}
	if e.core.holding != 0 {
		t.Fatalf("%d admissions still held", e.core.holding)
	}
}

// TestCatalogExportImport: a memory template goes out as one archive and
// comes back under another name whole, token and memory image included;
// an export in progress holds off a delete; an archive whose manifest
// asks for resources no sandbox may have is refused and leaves nothing.
func TestCatalogExportImport(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	_, err := e.cat.Create(ctx, api.CreateTemplate{Name: "warm", From: &api.ForkSource{Sandbox: "box", Checkpoint: "m1"}})
	must(t, err)
	var buf bytes.Buffer
	must(t, e.cat.Export(ctx, "warm", &buf))
	wantCode(t, "export built-in", e.cat.Export(ctx, "tiny", &bytes.Buffer{}), api.CodeInvalid, "built in")
	wantCode(t, "export missing", e.cat.Export(ctx, "nope", &bytes.Buffer{}), api.CodeNotFound, "not found")

	// A delete while an export streams is refused.
	_, done, err := e.store.exportStart("default", "warm")
	must(t, err)
	wantCode(t, "delete while exporting", e.cat.Delete(ctx, "warm"), api.CodeConflict, "being exported")
	done()

	tpl, err := e.cat.Import(ctx, "moved", bytes.NewReader(buf.Bytes()))
	must(t, err)
	if !tpl.Memory || tpl.From != "box/m1" {
		t.Fatalf("imported %+v", tpl)
	}
	man, err := e.store.Kept("default", "moved")
	must(t, err)
	if man.AgentToken != "held-token" {
		t.Fatalf("imported token %q", man.AgentToken)
	}
	if b, err := os.ReadFile(filepath.Join(e.store.MemDir("default", "moved"), "pages.img")); err != nil || len(b) != 3000 {
		t.Fatalf("imported memory image: %d bytes, %v", len(b), err)
	}
	_, err = e.cat.Import(ctx, "moved", bytes.NewReader(buf.Bytes()))
	wantCode(t, "import again", err, api.CodeConflict, `"moved" exists`)

	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "hello.txt"), []byte("hello\n"), 0o644))
	var huge bytes.Buffer
	must(t, checkpoint.WriteArchive(ctx, &huge, checkpoint.Manifest{Name: "x", Resources: api.Resources{CPUs: 1000}, CreatedAt: time.Unix(1, 0)}, src, ""))
	snapsBefore, _ := e.pool.Snapshots(ctx)
	_, err = e.cat.Import(ctx, "huge", bytes.NewReader(huge.Bytes()))
	wantCode(t, "import huge", err, api.CodeInvalid, "template archive refused: manifest: resources.cpus")
	if after, _ := e.pool.Snapshots(ctx); !slices.Equal(after, snapsBefore) {
		t.Fatalf("a refused import changed the snapshots: %v, then %v", snapsBefore, after)
	}
	entries, _ := os.ReadDir(e.store.dir())
	for _, d := range entries {
		if d.Name() != "warm" && d.Name() != "moved" {
			t.Fatalf("a refused import left %s", d.Name())
		}
	}
}

// TestStoreSweepAndUse: the sweep at start-up removes a template's
// unfinished data and tells recovery which template snapshots are held;
// Use finds only published templates, and holds off a delete until it is
// released.
func TestStoreSweepAndUse(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	_, err := e.cat.Create(ctx, api.CreateTemplate{Name: "cold", From: &api.ForkSource{Sandbox: "box", Checkpoint: "v1"}})
	must(t, err)
	must(t, os.MkdirAll(filepath.Join(e.store.dir(), ".tmp-half-123"), 0o700))
	must(t, e.pool.Snapshot(ctx, "sb-1", snapPrefix+"half.abc"))
	owned, err := e.store.Sweep()
	must(t, err)
	if _, err := os.Stat(filepath.Join(e.store.dir(), ".tmp-half-123")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the sweep left unfinished data: %v", err)
	}
	man, err := e.store.Kept("default", "cold")
	must(t, err)
	for _, c := range []struct {
		snap           string
		template, held bool
	}{{man.Snapshot, true, true}, {snapPrefix + "half.abc", true, false}, {"sb-1.v1", false, false}} {
		if tpl, held := owned(c.snap); tpl != c.template || held != c.held {
			t.Errorf("owned(%s) = %v, %v; want %v, %v", c.snap, tpl, held, c.template, c.held)
		}
	}

	if man, release, err := e.store.Use("default", "nope"); man != nil || release != nil || err != nil {
		t.Fatalf("Use(nope) = %v, %v", man, err)
	}
	man, release, err := e.store.Use("default", "cold")
	must(t, err)
	if man == nil {
		t.Fatal("Use(cold) found nothing")
	}
	deleted := make(chan error, 1)
	go func() { deleted <- e.cat.Delete(context.Background(), "cold") }()
	// Wait until the delete waits for the store's lock (a writer waiting
	// keeps new readers out), which the use holds.
	for e.store.mu.TryRLock() {
		e.store.mu.RUnlock()
		runtime.Gosched()
	}
	select {
	case err := <-deleted:
		t.Fatalf("a delete ended while a use held the template: %v", err)
	default:
	}
	release()
	must(t, <-deleted)
}

// TestCatalogOrgs: checkpoint templates are each org's: the same name in
// two orgs is two templates, each listed, used, exported and deleted in
// its own org alone (another org's is not found, as one that does not
// exist); an org's uses are its own; an org's templates count in its
// usage, and go with it (DropOrg), leaving the others; a restart's Sweep
// keeps every org's snapshots.
func TestCatalogOrgs(t *testing.T) {
	e := newEnv(t)
	as := func(org string) context.Context {
		return auth.WithPrincipal(t.Context(), auth.Principal{Org: org, Key: "key-" + org, Scope: api.ScopeAdmin})
	}
	def, docs := as("default"), as("docs")
	from := &api.ForkSource{Sandbox: "box", Checkpoint: "v1"}
	_, err := e.cat.Create(def, api.CreateTemplate{Name: "cold", From: from})
	must(t, err)
	// Each org keeps its own pools of its templates.
	_, err = e.cat.Create(docs, api.CreateTemplate{Name: "cold", From: from, Pool: 1})
	must(t, err)
	if e.pools.set["docs/cold"] != 1 || e.pools.set["default/cold"] != 0 {
		t.Errorf("pools set: %v, want docs' cold of 1 alone", e.pools.set)
	}
	_, err = e.cat.Create(docs, api.CreateTemplate{Name: "docs-only", From: from})
	must(t, err)
	kept := func(ctx context.Context) []string {
		var names []string
		for _, tpl := range e.cat.List(ctx) {
			if tpl.Kind == api.TemplateCheckpoint {
				names = append(names, tpl.Name)
			}
		}
		return names
	}
	if got := kept(def); !slices.Equal(got, []string{"cold"}) {
		t.Errorf("the default org's templates: %v", got)
	}
	if got := kept(docs); !slices.Equal(got, []string{"cold", "docs-only"}) {
		t.Errorf("docs' templates: %v", got)
	}
	a, err := e.store.Kept("default", "cold")
	must(t, err)
	b, err := e.store.Kept("docs", "cold")
	must(t, err)
	if a == nil || b == nil || a.Snapshot == b.Snapshot || a.Org != "default" || b.Org != "docs" {
		t.Fatalf("cold in two orgs: %+v and %+v", a, b)
	}
	if man, err := e.store.Kept("default", "docs-only"); man != nil || err != nil {
		t.Errorf("docs' template in the default org: %+v, %v", man, err)
	}
	var out bytes.Buffer
	wantCode(t, "exporting docs' template from the default org", e.cat.Export(def, "docs-only", &out), api.CodeNotFound, "not found")
	wantCode(t, "deleting docs' template from the default org", e.cat.Delete(def, "docs-only"), api.CodeNotFound, "not found")

	// A use in docs holds docs' cold, not the default org's.
	e.sbs.add(&store.Sandbox{Sandbox: api.Sandbox{ID: "sb-d", Name: "user", Template: "cold"}, Org: "docs"})
	wantCode(t, "deleting docs' cold in use", e.cat.Delete(docs, "cold"), api.CodeConflict, "used by sandbox user")
	must(t, e.cat.Delete(docs, "docs-only"))
	if !slices.Equal(e.pools.dropped, []string{"docs/docs-only"}) {
		t.Errorf("pools dropped by docs' delete: %v, want docs' alone", e.pools.dropped)
	}
	for _, tpl := range e.cat.List(def) {
		if tpl.Name == "cold" && tpl.Uses != 0 {
			t.Errorf("the default org's cold counts %d uses of docs' sandbox", tpl.Uses)
		}
	}

	n, size, err := e.store.Usage("docs")
	must(t, err)
	if n != 1 || size <= 0 {
		t.Errorf("docs' usage: %d templates, %d bytes; want its cold", n, size)
	}
	owned, err := e.store.Sweep()
	must(t, err)
	for _, snap := range []string{a.Snapshot, b.Snapshot} {
		if tpl, held := owned(snap); !tpl || !held {
			t.Errorf("Sweep: snapshot %s is a template's %v, held %v", snap, tpl, held)
		}
	}
	must(t, e.store.DropOrg(t.Context(), "docs"))
	if got := kept(docs); len(got) != 0 {
		t.Errorf("docs' templates after DropOrg: %v", got)
	}
	if _, err := os.Stat(e.pool.SnapshotPath(b.Snapshot)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("docs' snapshot after DropOrg: %v", err)
	}
	if got := kept(def); !slices.Equal(got, []string{"cold"}) {
		t.Errorf("the default org's templates after docs' went: %v", got)
	}
	if _, err := os.Stat(e.pool.SnapshotPath(a.Snapshot)); err != nil {
		t.Errorf("the default org's snapshot after docs' went: %v", err)
	}
}

// builtOn is a cluster whose nodes have built the templates it names.
type builtOn map[string][]string

func (b builtOn) BuiltOn(name string) []string { return b[name] }

// TestNodeBuiltins: a front end lists a built-in template ready once a
// node built it, pending before, and builds none itself.
func TestNodeBuiltins(t *testing.T) {
	nb := NewNodeBuiltins(builtOn{"busybox": {"a"}}, "busybox", disk.TemplateOptions{})
	states := map[string]api.Template{}
	for _, tp := range nb.List(context.Background()) {
		states[tp.Name] = tp
	}
	for _, tc := range []struct {
		name  string
		ready bool
		state string
	}{
		{"busybox", true, api.TemplateReady},
		{"base", false, api.TemplatePending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp, ok := states[tc.name]
			if !ok || tp.Ready != tc.ready || tp.State != tc.state || tp.Kind != api.TemplateBuiltin {
				t.Errorf("%s: %+v, want ready %v, state %s", tc.name, tp, tc.ready, tc.state)
			}
		})
	}
	if !states["busybox"].Default {
		t.Errorf("busybox is not listed as the default")
	}
	if err := nb.Ensure(context.Background(), "base"); !errors.Is(err, api.ErrUnavailable) {
		t.Errorf("Ensure on a front end: %v, want unavailable", err)
	}
	if !nb.Has("base") || nb.Has("nope") {
		t.Errorf("Has: base %v, nope %v", nb.Has("base"), nb.Has("nope"))
	}
}
