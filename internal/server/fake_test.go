package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/quota"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/store"
)

// fakeSandboxes is Sandboxes in memory, for tests of the HTTP layer: a
// running sandbox "box" (sb-000000000001) with a checkpoint v1, and a
// sleeping one "sleepy" (sb-000000000002).
type fakeSandboxes struct {
	mu      sync.Mutex
	sbs     []api.Sandbox
	filters []map[string]string // the label filters List was called with
	// cpDelay is how long CreateCheckpoint takes, as a memory checkpoint
	// can; it gives up early if its context ends.
	cpDelay time.Duration
}

func newFake() *fakeSandboxes {
	return &fakeSandboxes{sbs: []api.Sandbox{
		{ID: "sb-000000000001", Name: "box", State: api.StateRunning, Labels: map[string]string{"team": "red"}},
		{ID: "sb-000000000002", Name: "sleepy", State: api.StateSleeping},
	}}
}

// fakeServices serves the routes of the services beside the sandboxes
// (templates, images, registries, secrets) from fakes, the templates'
// checkpoints from sbs.
func fakeServices(sbs *fakeSandboxes) []Option {
	return []Option{WithTemplates(fakeTemplates{sbs}), WithImages(fakeImages{}, fakeRegistries{}), WithSecrets(fakeSecrets{}), WithAudit(&fakeAudit{}), WithOrgs(&fakeOrgs{})}
}

// fakeOrgs is the daemon's one org, DefaultOrg, and its quota, in memory.
type fakeOrgs struct {
	mu    sync.Mutex
	quota api.Quota
}

func (f *fakeOrgs) Get(ctx context.Context, org string) (*api.Org, error) {
	if org != DefaultOrg {
		return nil, api.Errorf(api.CodeNotFound, "org %q not found", org)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return &api.Org{Name: org, Quota: f.quota}, nil
}

func (f *fakeOrgs) Create(ctx context.Context, org string) (*api.Org, error) {
	if org == DefaultOrg {
		return nil, api.Errorf(api.CodeConflict, "org %q already exists", org)
	}
	return nil, api.Errorf(api.CodeUnavailable, "the fake keeps one org")
}

func (f *fakeOrgs) Delete(ctx context.Context, org string, all bool) error {
	if _, err := f.Get(ctx, org); err != nil {
		return err
	}
	return api.Errorf(api.CodeConflict, "org %s is this daemon's own (loam serve --org): it cannot be deleted", org)
}

func (f *fakeOrgs) List(ctx context.Context) ([]api.Org, error) {
	o, _ := f.Get(ctx, DefaultOrg)
	return []api.Org{*o}, nil
}

func (f *fakeOrgs) SetQuota(ctx context.Context, org string, q api.Quota) (*api.Org, error) {
	if err := quota.Validate(q); err != nil {
		return nil, err
	}
	if _, err := f.Get(ctx, org); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.quota = q
	f.mu.Unlock()
	return f.Get(ctx, org)
}

// fakeAudit keeps audit records in memory, as the SQLite store keeps them
// in its table.
type fakeAudit struct {
	mu     sync.Mutex
	events []api.AuditEvent
}

func (f *fakeAudit) AppendAudit(ctx context.Context, ev api.AuditEvent) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ev.Seq = int64(len(f.events) + 1)
	f.events = append(f.events, ev)
	return nil
}

func (f *fakeAudit) SetAuditOutcome(ctx context.Context, seq int64, outcome string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events[seq-1].Outcome = outcome
	return nil
}

func (f *fakeAudit) ListAudit(ctx context.Context, filter store.AuditFilter) ([]api.AuditEvent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []api.AuditEvent{}
	for _, ev := range f.events {
		if ev.Seq > filter.SinceSeq && (filter.Action == "" || ev.Action == filter.Action) && (filter.Org == "" || ev.Org == filter.Org) {
			out = append(out, ev)
		}
	}
	return out, nil
}

// fakeTemplates is the template catalog, answering as template.Catalog
// does: an *api.Error for what the caller got wrong.
type fakeTemplates struct{ sbs *fakeSandboxes }

func (f fakeTemplates) List(ctx context.Context) []api.Template {
	return []api.Template{{Name: "busybox", Default: true, Ready: true}}
}

func (f fakeTemplates) Create(ctx context.Context, req api.CreateTemplate) (*api.Template, error) {
	if req.From == nil {
		return nil, api.Errorf(api.CodeInvalid, "from: give the sandbox and checkpoint")
	}
	if _, err := f.sbs.GetCheckpoint(ctx, req.From.Sandbox, req.From.Checkpoint); err != nil {
		return nil, err
	}
	return &api.Template{Name: req.Name, Ready: true}, nil
}

func (f fakeTemplates) Delete(ctx context.Context, name string) error {
	return api.Errorf(api.CodeNotFound, "template %q not found", name)
}

func (f fakeTemplates) Export(ctx context.Context, name string, w io.Writer) error {
	return api.Errorf(api.CodeNotFound, "template %q not found", name)
}

func (f fakeTemplates) Import(ctx context.Context, name string, r io.Reader) (*api.Template, error) {
	if _, err := io.Copy(io.Discard, r); err != nil {
		return nil, err
	}
	return nil, api.Errorf(api.CodeInvalid, "template archive refused")
}

var _ Templates = fakeTemplates{}

func (f *fakeSandboxes) Create(ctx context.Context, req api.CreateSandbox) (*api.Sandbox, error) {
	if req.From != nil {
		if _, err := f.GetCheckpoint(ctx, req.From.Sandbox, req.From.Checkpoint); err != nil {
			return nil, err
		}
	}
	if req.Count != 0 {
		return nil, api.Errorf(api.CodeInternal, "the manager was given a count")
	}
	f.mu.Lock()
	for _, sb := range f.sbs {
		if req.Name != "" && sb.Name == req.Name {
			f.mu.Unlock()
			return nil, api.Errorf(api.CodeConflict, "a sandbox named %s exists", req.Name)
		}
	}
	f.mu.Unlock()
	return &api.Sandbox{ID: "sb-000000000003", Name: req.Name, State: api.StateRunning, Labels: req.Labels}, nil
}

func (f *fakeSandboxes) List(ctx context.Context, labels map[string]string) ([]api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.filters = append(f.filters, maps.Clone(labels))
	var out []api.Sandbox
	for _, sb := range f.sbs {
		match := true
		for k, v := range labels {
			if got, ok := sb.Labels[k]; !ok || got != v {
				match = false
			}
		}
		if match {
			out = append(out, sb)
		}
	}
	return out, nil
}

// lastFilter is the label filter of the last List call.
func (f *fakeSandboxes) lastFilter() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.filters) == 0 {
		return nil
	}
	return f.filters[len(f.filters)-1]
}

func (f *fakeSandboxes) Get(ctx context.Context, ref string) (*api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, limited := auth.From(ctx)
	for _, sb := range f.sbs {
		// As the sandbox manager's lookup: a key limited by labels finds
		// only the sandboxes of its selector.
		if (sb.ID == ref || sb.Name == ref) && (!limited || p.Matches(sb.Labels)) {
			return &sb, nil
		}
	}
	return nil, api.Errorf(api.CodeNotFound, "sandbox %q not found", ref)
}

func (f *fakeSandboxes) Update(ctx context.Context, ref string, req api.UpdateSandbox) (*api.Sandbox, error) {
	sb, err := f.Get(ctx, ref)
	if err != nil {
		return nil, err
	}
	if req.Public != nil {
		sb.Public = *req.Public
	}
	if req.Labels != nil {
		sb.Labels = *req.Labels
		f.mu.Lock()
		for i := range f.sbs {
			if f.sbs[i].ID == sb.ID {
				f.sbs[i].Labels = sb.Labels
			}
		}
		f.mu.Unlock()
	}
	return sb, nil
}

func (f *fakeSandboxes) AccessToken(ctx context.Context, ref string) (*api.AccessToken, error) {
	sb, err := f.Get(ctx, ref)
	if err != nil {
		return nil, err
	}
	return &api.AccessToken{URL: sb.URL, AccessToken: "loam_at_" + sb.ID}, nil
}

func (f *fakeSandboxes) Delete(ctx context.Context, ref string) error {
	_, err := f.Get(ctx, ref)
	return err
}

func (f *fakeSandboxes) CheckExec(ctx context.Context, ref string) (*api.Sandbox, func(), error) {
	sb, err := f.Get(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	if sb.State != api.StateRunning {
		return nil, nil, api.Errorf(api.CodeConflict, "sandbox %s is %s, not running", sb.Name, sb.State)
	}
	return sb, func() {}, nil
}

// Exec runs every command at once, with exit status 0: its "agent" reads
// the request, says exit and closes.
func (f *fakeSandboxes) Exec(ctx context.Context, ref string, req api.ExecRequest) (*sandbox.Stream, error) {
	var agent *httptest.Server
	agent = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { go agent.Close() }() // one socket each
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		code := 0
		b, _ := json.Marshal(api.ExecControl{Type: api.ExecExit, ExitCode: &code})
		if err := c.Write(r.Context(), websocket.MessageText, b); err != nil {
			return
		}
		c.Close(websocket.StatusNormalClosure, "")
	}))
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(agent.URL, "http"), nil)
	if err != nil {
		agent.Close()
		return nil, err
	}
	return sandbox.NewStream(conn), nil
}

func (f *fakeSandboxes) CreateCheckpoint(ctx context.Context, sandbox string, req api.CreateCheckpoint) (*api.Checkpoint, error) {
	sb, err := f.Get(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	select {
	case <-time.After(f.cpDelay):
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	return &api.Checkpoint{ID: "v2", Sandbox: sb.ID, Comment: req.Comment, Memory: req.Memory == nil || *req.Memory}, nil
}

func (f *fakeSandboxes) ListCheckpoints(ctx context.Context, sandbox string) ([]api.Checkpoint, error) {
	cp, err := f.GetCheckpoint(ctx, sandbox, "v1")
	if err != nil {
		return nil, err
	}
	return []api.Checkpoint{*cp}, nil
}

func (f *fakeSandboxes) GetCheckpoint(ctx context.Context, sandbox, ref string) (*api.Checkpoint, error) {
	sb, err := f.Get(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	if sb.Name != "box" || ref != "v1" {
		return nil, api.Errorf(api.CodeNotFound, "checkpoint %q of %s not found", ref, sb.Name)
	}
	return &api.Checkpoint{ID: "v1", Sandbox: sb.ID, Memory: true}, nil
}

func (f *fakeSandboxes) DeleteCheckpoint(ctx context.Context, sandbox, ref string) error {
	_, err := f.GetCheckpoint(ctx, sandbox, ref)
	return err
}

func (f *fakeSandboxes) RestoreCheckpoint(ctx context.Context, sandbox, ref string) (*api.Sandbox, error) {
	if _, err := f.GetCheckpoint(ctx, sandbox, ref); err != nil {
		return nil, err
	}
	return f.Get(ctx, sandbox)
}

func (f *fakeSandboxes) Sleep(ctx context.Context, ref string) (*api.Sandbox, error) {
	return f.Get(ctx, ref)
}

func (f *fakeSandboxes) Wake(ctx context.Context, ref string) (*api.Sandbox, error) {
	return f.Get(ctx, ref)
}

const testToken = "test-token"

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// serve serves h on a real socket for the length of the test.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// request is one request a test sends.
type request struct {
	method, path string
	token        string // "-" sends none; "" the test's default
	body         string
	header       map[string]string
}

// do sends req to base over a real socket and returns the answer and its
// body. Redirects are not followed: they are answers too.
func do(t *testing.T, base, defaultToken string, req request) (*http.Response, []byte) {
	t.Helper()
	var body io.Reader
	if req.body != "" {
		body = strings.NewReader(req.body)
	}
	r, err := http.NewRequest(req.method, base+req.path, body)
	if err != nil {
		t.Fatal(err)
	}
	switch req.token {
	case "-":
	case "":
		r.Header.Set("Authorization", "Bearer "+defaultToken)
	default:
		r.Header.Set("Authorization", "Bearer "+req.token)
	}
	for k, v := range req.header {
		r.Header.Set(k, v)
	}
	c := &http.Client{
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := c.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}
