package sandbox_test

// The rest of the test set-up: a fake network that gives each sandbox its
// own loopback address, a one-template catalogue over the real copy pool,
// the real store with a hook, and env, a Manager over them and the fake
// runtime (package runtime/fake).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/checkpoints"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/guest"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/runtime/fake"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/sleep"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/sqlite"
	"loam.dev/loam/internal/template"
	"loam.dev/loam/internal/warmpool"
)

func testLogger() *slog.Logger {
	if os.Getenv("LOAM_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// fakeNetnsDir prefixes the namespaces of fakeNetworks; what follows is the
// loopback address that stands for the namespace's eth0.
const fakeNetnsDir = fake.NetnsDir

// fakeNetworks gives slot i the address 127.A.B.(i+2), with A and B fixed
// per test, and records which namespaces exist. Linux routes all of 127/8
// to lo, so each sandbox's agent has an address of its own.
type fakeNetworks struct {
	a, b byte

	mu       sync.Mutex
	live     map[string]network.Endpoint // by name
	prepared map[string]int              // how many times each was prepared
	policies map[string]network.Policy   // by name
}

var _ sandbox.Networks = (*fakeNetworks)(nil)

func (n *fakeNetworks) Endpoint(id string, index int) (network.Endpoint, error) {
	if id == "" || index < 0 || index > n.MaxIndex() {
		return network.Endpoint{}, fmt.Errorf("fake network: no endpoint for %q at %d", id, index)
	}
	ip := netip.AddrFrom4([4]byte{127, n.a, n.b, byte(index + 2)})
	return network.Endpoint{
		Name:      "loam-" + id,
		Netns:     fakeNetnsDir + "/" + ip.String(),
		HostVeth:  "lm" + strings.TrimPrefix(id, "sb-"),
		HostIP:    netip.AddrFrom4([4]byte{127, n.a, n.b, 1}),
		SandboxIP: ip,
		Bits:      30,
	}, nil
}

func (n *fakeNetworks) MaxIndex() int { return 200 }

func (n *fakeNetworks) Create(ctx context.Context, ep network.Endpoint) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.live[ep.Name] = ep
	return nil
}

func (n *fakeNetworks) Prepare(ctx context.Context, ep network.Endpoint) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.live[ep.Name]; !ok {
		return fmt.Errorf("fake network: preparing %s: no such namespace", ep.Name)
	}
	n.prepared[ep.Name]++
	return nil
}

func (n *fakeNetworks) Delete(ctx context.Context, ep network.Endpoint) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.live, ep.Name)
	return nil
}

func (n *fakeNetworks) SetPolicy(ctx context.Context, ep network.Endpoint, p network.Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.policies == nil {
		n.policies = map[string]network.Policy{}
	}
	n.policies[ep.Name] = p
	return nil
}

func (n *fakeNetworks) RemovePolicy(ctx context.Context, ep network.Endpoint) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.policies, ep.Name)
	return nil
}

// policy is the policy the firewall holds for sandbox id, if any.
func (n *fakeNetworks) PrunePolicies(ctx context.Context, keep []network.Endpoint) error {
	return nil
}

func (n *fakeNetworks) policy(id string) (network.Policy, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.policies["loam-"+id]
	return p, ok
}

func (n *fakeNetworks) count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.live)
}

func (n *fakeNetworks) exists(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.live["loam-"+id]
	return ok
}

// fakeTemplates knows one template, "tiny", imported into the pool from a
// small tree on the first Ensure.
type fakeTemplates struct {
	pool disk.Pool
	src  string

	mu   sync.Mutex
	fail error // the next Ensure fails with it
}

var _ template.Builder = (*fakeTemplates)(nil)

const tinyTemplate = "tiny"

// failNext makes the next Ensure fail with err.
func (f *fakeTemplates) failNext(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

func (f *fakeTemplates) List(ctx context.Context) []api.Template {
	ready, _ := f.pool.HasTemplate(ctx, tinyTemplate)
	return []api.Template{{Name: tinyTemplate, Description: "a few files", Default: true, Ready: ready}}
}

func (f *fakeTemplates) Has(name string) bool { return name == tinyTemplate }

func (f *fakeTemplates) Ensure(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail; err != nil {
		f.fail = nil
		return err
	}
	if name != tinyTemplate {
		return fmt.Errorf("template %s: %w", name, disk.ErrNotFound)
	}
	if ok, err := f.pool.HasTemplate(ctx, name); err != nil || ok {
		return err
	}
	return f.pool.ImportTemplate(ctx, name, f.src)
}

// makeTinyTree writes the tree of the tiny template: an etc like a real
// root's (resolv.conf a symlink, as in Debian's), and one file.
func makeTinyTree(t testing.TB) string {
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "etc", "hostname"), []byte("builder\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "etc", "hosts"), []byte("127.0.0.1 localhost builder\n"), 0o644))
	must(t, os.Symlink("../run/systemd/resolve/stub-resolv.conf", filepath.Join(dir, "etc", "resolv.conf")))
	must(t, os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("hello\n"), 0o644))
	return dir
}

// hookStore is the real store with a hook after GetSandbox, to hold an
// operation between reading a record and acting on it.
type hookStore struct {
	store.Store

	mu       sync.Mutex
	afterGet func(ref string)
}

func (s *hookStore) GetSandbox(ctx context.Context, org, ref string) (*store.Sandbox, error) {
	sb, err := s.Store.GetSandbox(ctx, org, ref)
	s.mu.Lock()
	hook := s.afterGet
	s.mu.Unlock()
	if hook != nil {
		hook(ref)
	}
	return sb, err
}

func (s *hookStore) setAfterGet(fn func(ref string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.afterGet = fn
}

// env is a Manager over the fakes, the real copy pool and the real store.
type env struct {
	t    testing.TB
	ctx  context.Context
	cfg  sandbox.Config
	st   *hookStore
	pool *disk.Copy
	rt   *fake.Runtime
	nets *fakeNetworks
	tpl  *fakeTemplates
	// shelf holds the templates of the env's Manager (the fake built-ins
	// and checkpoint templates), cat serves them as the API does.
	shelf *template.Store
	cat   *template.Catalog
	m     *sandbox.Manager
	// limits are the checkpoints' (newEnvLimits); cps the current
	// Manager's checkpoints, made with it as the daemon's are.
	limits checkpoint.Limits
	cps    *checkpoints.Service
	// sleep is the current Manager's sleep capability (a restart makes
	// another), as the daemon's: its images, and idle sleep over it.
	sleep *sleep.Sleeper
}

// newEnv makes an env; edit changes the Manager's configuration.
func newEnv(t testing.TB, edit ...func(*sandbox.Config)) *env {
	t.Helper()
	return newEnvLimits(t, checkpoint.Limits{Owner: 10}, edit...)
}

// newEnvLimits is newEnv whose checkpoints have limits.
func newEnvLimits(t testing.TB, limits checkpoint.Limits, edit ...func(*sandbox.Config)) *env {
	t.Helper()
	// Registered first, so run last: once the Manager is closed and the
	// env torn down, no goroutine the test started is left (the
	// Manager's spare dials, death watches, pools, streams).
	var e *env
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		if e == nil {
			return
		}
		if err := e.m.Close(); err != nil {
			t.Errorf("closing the manager: %v", err)
		}
		goleak.VerifyNone(t, before)
	})
	ctx := t.Context()
	poolDir, dataDir := t.TempDir(), t.TempDir()
	pool, err := disk.NewCopy(poolDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "loam.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })

	// A block of loopback addresses and a port of its own, so that tests
	// in other packages running at the same time are not in the way.
	nets := &fakeNetworks{
		a: byte(1 + time.Now().UnixNano()%250), b: byte(os.Getpid()),
		live: map[string]network.Endpoint{}, prepared: map[string]int{},
	}
	host, _ := nets.Endpoint("sb-probe", 0)
	ln, err := net.Listen("tcp", net.JoinHostPort(host.HostIP.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	cfg := sandbox.Config{
		DataDir:         dataDir,
		AgentBinary:     "/nonexistent/loam",
		AgentPort:       port,
		Domain:          "loam.test",
		Org:             "acme",
		Scheme:          "https",
		DefaultTemplate: tinyTemplate,
		Defaults:        api.Resources{CPUs: 1, MemoryMiB: 512, DiskMiB: 4096},
		BootTimeout:     20 * time.Second,
		Secret:          []byte("test secret"),
		// As the daemon does: the orgs and their quotas in the store.
		Orgs: st,
		// As the daemon does: the sleep capability, made with the Manager.
		Sleep: func(m *sandbox.Manager) sandbox.SleepImages {
			e.sleep = sleep.New(sandbox.NewIdleCore(m), e.st, sleep.Config{DataDir: dataDir}, testLogger())
			return e.sleep
		},
	}
	for _, f := range edit {
		f(&cfg)
	}
	if err := st.EnsureOrg(ctx, cfg.Org); err != nil {
		t.Fatal(err)
	}
	e = &env{
		t: t, ctx: ctx, cfg: cfg,
		st:     &hookStore{Store: st},
		pool:   pool,
		rt:     fake.New(t),
		nets:   nets,
		tpl:    &fakeTemplates{pool: pool, src: makeTinyTree(t)},
		limits: limits,
	}
	e.rt.Tokens = func(id string) []string {
		var toks []string
		for gen := range 64 {
			toks = append(toks, sandbox.AgentToken(cfg.Secret, id, gen))
		}
		return toks
	}
	e.shelf = template.NewStore(cfg.DataDir, cfg.Org, e.tpl, e.pool, testLogger())
	e.newManager()
	if err := e.m.Recover(ctx); err != nil {
		t.Fatalf("Recover on an empty data dir: %v", err)
	}
	return e
}

// restart replaces the Manager with a new one over the same store, pool,
// runtime and network, as a restarted daemon, and runs its Recover.
func (e *env) restart() error {
	e.newManager()
	return e.m.Recover(e.ctx)
}

// newManager makes the env's Manager, and the template catalog over it
// and its warm pools, as the daemon does.
func (e *env) newManager() {
	cfg := e.cfg
	var pools template.Pools = noTemplatePools{}
	if mk := cfg.Pools; mk != nil {
		cfg.Pools = func(m *sandbox.Manager) sandbox.Pools {
			p := mk(m)
			if tp, ok := p.(template.Pools); ok {
				pools = tp
			}
			return p
		}
	}
	if cfg.Forks == nil {
		cfg.Forks = e.forks(e.rt)
	}
	e.m = sandbox.New(cfg, e.st, e.rt, e.pool, e.nets, e.shelf, testLogger())
	e.cat = template.New(template.Config{Store: e.shelf, Core: sandbox.NewTemplateCore(e.m), Pools: pools, Sandboxes: e.st, Log: testLogger()})
}

// forks makes the checkpoints of a Manager over runtime rt, as the
// daemon's, and makes them the env's (e.cps).
func (e *env) forks(rt runtime.Runtime) func(*sandbox.Manager) sandbox.Forks {
	return func(m *sandbox.Manager) sandbox.Forks {
		e.cps = checkpoints.New(sandbox.NewCheckpointCore(m), checkpoints.Config{DataDir: e.cfg.DataDir, Limits: e.limits}, e.st, rt, e.pool, testLogger())
		return e.cps
	}
}

// Each capability's side of the core implements exactly what it takes.
var (
	_ checkpoints.Core = (*sandbox.CheckpointCore)(nil)
	_ warmpool.Core    = (*sandbox.PoolCore)(nil)
	_ template.Core    = (*sandbox.TemplateCore)(nil)
	_ sleep.Core       = (*sandbox.IdleCore)(nil)
	_ guest.Core       = (*sandbox.GuestCore)(nil)
)

// noTemplatePools are the template catalog's pools of an env whose
// Manager has none: a template's pool is never kept.
type noTemplatePools struct{}

func (noTemplatePools) SetTemplatePool(_ context.Context, name string, size int) (*api.Pool, error) {
	return &api.Pool{Template: name}, nil
}
func (noTemplatePools) DropTemplatePools(context.Context, string, string) {}

func (e *env) create(req api.CreateSandbox) *api.Sandbox {
	e.t.Helper()
	sb, err := e.m.Create(e.ctx, req)
	if err != nil {
		e.t.Fatalf("Create(%+v): %v", req, err)
	}
	return sb
}

func (e *env) checkpoint(ref string, memory bool) *api.Checkpoint {
	e.t.Helper()
	cp, err := e.cps.CreateCheckpoint(e.ctx, ref, api.CreateCheckpoint{Memory: &memory})
	if err != nil {
		e.t.Fatalf("CreateCheckpoint(%s, memory=%v): %v", ref, memory, err)
	}
	return cp
}

// record is the stored record of sandbox id.
func (e *env) record(id string) *store.Sandbox {
	e.t.Helper()
	sb, err := e.st.GetSandbox(e.ctx, "", id)
	if err != nil {
		e.t.Fatalf("record of %s: %v", id, err)
	}
	return sb
}

func (e *env) cpRecord(id, cpID string) *store.Checkpoint {
	e.t.Helper()
	cp, err := e.st.GetCheckpoint(e.ctx, id, cpID)
	if err != nil {
		e.t.Fatalf("record of checkpoint %s of %s: %v", cpID, id, err)
	}
	return cp
}

// token is the token sandbox id's agent should answer to now.
func (e *env) token(id string) string {
	e.t.Helper()
	return sandbox.AgentToken(e.cfg.Secret, id, e.record(id).AgentGen)
}

// cpToken is the token the agent held when checkpoint cpID of sandbox id
// was taken.
func (e *env) cpToken(id, cpID string) string {
	e.t.Helper()
	return sandbox.AgentToken(e.cfg.Secret, id, e.cpRecord(id, cpID).AgentGen)
}

// agentAnswers checks that sandbox id's agent answers, at the sandbox's
// address, to the sandbox's own token and to no other.
func (e *env) agentAnswers(id string, others ...string) {
	e.t.Helper()
	sb := e.record(id)
	ep, err := e.nets.Endpoint(sb.ID, sb.NetIndex)
	if err != nil {
		e.t.Fatal(err)
	}
	own := e.token(id)
	for _, tok := range append([]string{own}, others...) {
		c := &agent.Client{
			BaseURL: "http://" + net.JoinHostPort(ep.SandboxIP.String(), fmt.Sprint(e.cfg.AgentPort)),
			Token:   tok,
			HTTP:    &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		}
		ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
		_, err := c.Health(ctx)
		cancel()
		if tok == own && err != nil {
			e.t.Errorf("the agent of %s does not answer to its token: %v", id, err)
		} else if tok != own && !agent.IsUnauthorized(err) {
			e.t.Errorf("the agent of %s with another sandbox's token: got %v, want unauthorized", id, err)
		}
	}
}

// readVolume reads a file of sandbox id's disk.
func (e *env) readVolume(id, rel string) string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.pool.VolumePath(id), rel))
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

func (e *env) writeVolume(id, rel, content string) {
	e.t.Helper()
	must(e.t, os.WriteFile(filepath.Join(e.pool.VolumePath(id), rel), []byte(content), 0o644))
}

func (e *env) sandboxDir(id string) string {
	return filepath.Join(e.cfg.DataDir, "sandboxes", id)
}

func (e *env) checkpointsDir(id string) string {
	return filepath.Join(e.cfg.DataDir, "checkpoints", id)
}

func (e *env) snapshots() []string {
	e.t.Helper()
	s, err := e.pool.Snapshots(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func (e *env) volumes() []string {
	e.t.Helper()
	v, err := e.pool.Volumes(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return v
}

// checkpointIDs lists the ids of sandbox ref's checkpoints, oldest first.
func (e *env) checkpointIDs(ref string) []string {
	e.t.Helper()
	cps, err := e.cps.ListCheckpoints(e.ctx, ref)
	if err != nil {
		e.t.Fatal(err)
	}
	var ids []string
	for _, cp := range cps {
		ids = append(ids, cp.ID)
	}
	return ids
}

// requireGone checks that nothing of sandbox id is left: record,
// checkpoints, disk, snapshots, directories, network, container.
func (e *env) requireGone(id string) {
	e.t.Helper()
	if _, err := e.st.GetSandbox(e.ctx, "", id); !errors.Is(err, store.ErrNotFound) {
		e.t.Errorf("record of %s: %v, want not found", id, err)
	}
	if _, err := e.m.Get(e.ctx, id); !errors.Is(err, api.ErrNotFound) {
		e.t.Errorf("Get(%s): %v, want not_found", id, err)
	}
	if slices.Contains(e.volumes(), id) {
		e.t.Errorf("the volume of %s is left", id)
	}
	for _, s := range e.snapshots() {
		if strings.HasPrefix(s, id+".") {
			e.t.Errorf("snapshot %s is left", s)
		}
	}
	for _, dir := range []string{e.sandboxDir(id), e.checkpointsDir(id)} {
		if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
			e.t.Errorf("%s is left (%v)", dir, err)
		}
	}
	if e.nets.exists(id) {
		e.t.Errorf("the network of %s is left", id)
	}
	if _, ok := e.rt.Get(id); ok {
		e.t.Errorf("the container of %s is left", id)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

// eventually waits until cond holds, failing the test if it does not
// within 10 s: how a test waits for something the code under test does
// on a goroutine of its own (a call that reached its wait, a watch that
// ended), instead of sleeping and hoping.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after 10s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// guest is the guest data plane over the env's Manager as it is now (it
// holds no state of its own, so a restart needs no new one).
func (e *env) guest() *guest.Guest { return guest.New(sandbox.NewGuestCore(e.m), testLogger()) }
