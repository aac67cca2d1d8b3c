package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// The CLI shows times in the local zone; the tests fix it to the zone the
// docs were written in (UTC-4), so 09:17:36Z shows as 05:17:36.
func TestMain(m *testing.M) {
	time.Local = time.FixedZone("EDT", -4*60*60)
	os.Exit(m.Run())
}

var t0 = time.Date(2026, 10, 12, 9, 17, 36, 94927000, time.UTC)

// fakeAPI is a small in-memory loam daemon: enough of the REST API and the
// exec socket for the CLI's commands, with the last request body kept for
// checks.
type fakeAPI struct {
	mu          sync.Mutex
	sandboxes   []*api.Sandbox
	checkpoints map[string][]api.Checkpoint // by sandbox id
	lastBody    []byte
	lastQuery   string
	execs       []api.ExecRequest
}

func newFakeAPI(t *testing.T) (*fakeAPI, *httptest.Server) {
	f := &fakeAPI{checkpoints: map[string][]api.Checkpoint{}}
	f.sandboxes = []*api.Sandbox{{
		ID: "sb-2kjiso7vff5b", Name: "scratch", State: api.StateRunning, Template: "base",
		Resources: api.Resources{CPUs: 1, MemoryMiB: 512, DiskMiB: 4096},
		Env:       map[string]string{}, Labels: map[string]string{"owner": "docs"},
		Idle: "10m", HTTPPort: 8080, URL: "https://scratch--docs.loam.example.com", CreatedAt: t0,
	}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", f.create)
	mux.HandleFunc("GET /v1/sandboxes", f.list)
	mux.HandleFunc("GET /v1/sandboxes/{sandbox}", f.get)
	mux.HandleFunc("DELETE /v1/sandboxes/{sandbox}", f.delete)
	mux.HandleFunc("GET /v1/sandboxes/{sandbox}/exec", f.exec)
	mux.HandleFunc("POST /v1/sandboxes/{sandbox}/sleep", f.setState(api.StateSleeping))
	mux.HandleFunc("POST /v1/sandboxes/{sandbox}/wake", f.setState(api.StateRunning))
	mux.HandleFunc("GET /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, api.TemplateList{Templates: []api.Template{
			{Name: "base", Description: "Debian with Python and Node", Default: true, Ready: true, Kind: api.TemplateBuiltin, State: api.TemplateReady, Uses: 2},
			{Name: "go", Description: "", Ready: false, Kind: api.TemplateBuiltin, State: api.TemplatePending},
			{Name: "warm", Description: "memory and disk of checkpoint scratch/v1", Ready: true, Kind: api.TemplateCheckpoint,
				State: api.TemplateReady, Memory: true, SizeBytes: 281018368, Uses: 1},
		}})
	})
	mux.HandleFunc("POST /v1/sandboxes/{sandbox}/checkpoints", f.createCheckpoint)
	mux.HandleFunc("GET /v1/sandboxes/{sandbox}/checkpoints", f.listCheckpoints)
	mux.HandleFunc("GET /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}", f.getCheckpoint)
	mux.HandleFunc("DELETE /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}", f.deleteCheckpoint)
	mux.HandleFunc("POST /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}/restore", f.restore)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			reply(w, 401, api.ErrorBody{Error: api.Errorf(api.CodeUnauthorized, "bad token")})
			return
		}
		f.mu.Lock()
		f.lastQuery = r.URL.RawQuery
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return f, srv
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func replyErr(w http.ResponseWriter, err *api.Error) {
	reply(w, err.Code.HTTPStatus(), api.ErrorBody{Error: err})
}

func (f *fakeAPI) body(r *http.Request, v any) {
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(r.Body)
	f.lastBody = buf.Bytes()
	_ = json.Unmarshal(f.lastBody, v)
}

func (f *fakeAPI) find(ref string) *api.Sandbox {
	for _, sb := range f.sandboxes {
		if sb.Name == ref || sb.ID == ref {
			return sb
		}
	}
	return nil
}

// lookup finds the request's sandbox, or answers 404 and returns nil.
func (f *fakeAPI) lookup(w http.ResponseWriter, r *http.Request) *api.Sandbox {
	sb := f.find(r.PathValue("sandbox"))
	if sb == nil {
		replyErr(w, api.Errorf(api.CodeNotFound, "sandbox %s not found", r.PathValue("sandbox")))
	}
	return sb
}

func (f *fakeAPI) create(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var req api.CreateSandbox
	f.body(r, &req)
	if req.Count > 0 {
		f.createForks(w, req)
		return
	}
	if sb, err := f.createOne(req); err != nil {
		replyErr(w, err)
	} else {
		reply(w, 201, sb)
	}
}

// createForks makes a count of forks as the daemon does: each as a create
// of its own, named NAME-1 … NAME-N.
func (f *fakeAPI) createForks(w http.ResponseWriter, req api.CreateSandbox) {
	var list api.ForkList
	made := false
	for i := range req.Count {
		one := req
		one.Count = 0
		if req.Name != "" {
			one.Name = fmt.Sprintf("%s-%d", req.Name, i+1)
		}
		sb, err := f.createOne(one)
		list.Forks = append(list.Forks, api.ForkResult{Name: one.Name, Sandbox: sb, Error: err})
		made = made || sb != nil
	}
	if !made {
		replyErr(w, list.Forks[0].Error)
		return
	}
	reply(w, 201, list)
}

// createOne makes the sandbox req asks for; f.mu is held.
func (f *fakeAPI) createOne(req api.CreateSandbox) (*api.Sandbox, *api.Error) {
	sb := &api.Sandbox{
		ID: fmt.Sprintf("sb-%012d", len(f.sandboxes)), Name: req.Name, State: api.StateRunning,
		Template: req.Template, Image: req.Image, Env: req.Env, Labels: req.Labels,
		Idle: req.Idle, HTTPPort: req.HTTPPort, CreatedAt: t0.Add(time.Minute),
	}
	if req.From != nil {
		if req.Template != "" || req.Image != "" || req.Resources != nil {
			return nil, api.Errorf(api.CodeInvalid, "a fork takes its template or image and its resources from the checkpoint; don't give them")
		}
		src := f.find(req.From.Sandbox)
		if src == nil {
			return nil, api.Errorf(api.CodeNotFound, "sandbox %s not found", req.From.Sandbox)
		}
		sb.Template, sb.Resources, sb.From = src.Template, src.Resources, req.From
	} else if req.Resources != nil {
		sb.Resources = *req.Resources
	}
	if sb.Name == "" {
		sb.Name = "brave-otter"
	}
	if f.find(sb.Name) != nil {
		return nil, api.Errorf(api.CodeConflict, "a sandbox named %s exists", sb.Name)
	}
	sb.URL = "https://" + sb.Name + "--docs.loam.example.com"
	f.sandboxes = append(f.sandboxes, sb)
	return sb, nil
}

func (f *fakeAPI) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	list := api.SandboxList{Sandboxes: []api.Sandbox{}}
next:
	for _, sb := range f.sandboxes {
		for _, sel := range r.URL.Query()["label"] {
			k, v, _ := strings.Cut(sel, "=")
			if sb.Labels[k] != v {
				continue next
			}
		}
		list.Sandboxes = append(list.Sandboxes, *sb)
	}
	reply(w, 200, list)
}

func (f *fakeAPI) get(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.lookup(w, r); sb != nil {
		reply(w, 200, sb)
	}
}

// setState answers a sleep or a wake: the sandbox, in state st.
func (f *fakeAPI) setState(st api.State) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if sb := f.lookup(w, r); sb != nil {
			sb.State = st
			reply(w, 200, sb)
		}
	}
}

func (f *fakeAPI) delete(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.lookup(w, r)
	if sb == nil {
		return
	}
	f.sandboxes = slices.DeleteFunc(f.sandboxes, func(s *api.Sandbox) bool { return s == sb })
	w.WriteHeader(204)
}

func (f *fakeAPI) createCheckpoint(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.lookup(w, r)
	if sb == nil {
		return
	}
	var req api.CreateCheckpoint
	f.body(r, &req)
	n := 1
	for _, cp := range f.checkpoints[sb.ID] {
		if !cp.Auto {
			n++
		}
	}
	cp := api.Checkpoint{
		ID: fmt.Sprintf("v%d", n), Sandbox: sb.ID, Name: req.Name, Comment: req.Comment,
		Memory: req.Memory == nil || *req.Memory, CreatedAt: t0.Add(time.Duration(n-1) * time.Second),
	}
	f.checkpoints[sb.ID] = append(f.checkpoints[sb.ID], cp)
	reply(w, 201, cp)
}

func (f *fakeAPI) listCheckpoints(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.lookup(w, r); sb != nil {
		reply(w, 200, api.CheckpointList{Checkpoints: f.checkpoints[sb.ID]})
	}
}

// findCheckpoint finds the request's checkpoint, or answers 404.
func (f *fakeAPI) findCheckpoint(w http.ResponseWriter, r *http.Request) (*api.Sandbox, int) {
	sb := f.lookup(w, r)
	if sb == nil {
		return nil, -1
	}
	ref := r.PathValue("checkpoint")
	for i, cp := range f.checkpoints[sb.ID] {
		if cp.ID == ref || (cp.Name != "" && cp.Name == ref) {
			return sb, i
		}
	}
	replyErr(w, api.Errorf(api.CodeNotFound, "checkpoint %s of %s not found", ref, sb.Name))
	return nil, -1
}

func (f *fakeAPI) getCheckpoint(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb, i := f.findCheckpoint(w, r); sb != nil {
		reply(w, 200, f.checkpoints[sb.ID][i])
	}
}

func (f *fakeAPI) deleteCheckpoint(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb, i := f.findCheckpoint(w, r); sb != nil {
		f.checkpoints[sb.ID] = slices.Delete(f.checkpoints[sb.ID], i, i+1)
		w.WriteHeader(204)
	}
}

func (f *fakeAPI) restore(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, i := f.findCheckpoint(w, r)
	if sb == nil {
		return
	}
	auto := 1
	for _, cp := range f.checkpoints[sb.ID] {
		if cp.Auto {
			auto++
		}
	}
	f.checkpoints[sb.ID] = append(f.checkpoints[sb.ID], api.Checkpoint{
		ID: fmt.Sprintf("auto-%d", auto), Sandbox: sb.ID, Memory: true, Auto: true,
		Comment: "before restoring " + f.checkpoints[sb.ID][i].ID, CreatedAt: t0.Add(2 * time.Second),
	})
	reply(w, 200, sb)
}

// exec runs a few pretend commands: echo ARGS, cat (stdin to stdout),
// warn (stderr), exit N, nope (not found), checkpointed (the socket ends
// with 1011), and tty (reports its size, then waits for a resize).
func (f *fakeAPI) exec(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	sb := f.lookup(w, r)
	f.mu.Unlock()
	if sb == nil {
		return
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	ctx := r.Context()
	_, b, err := conn.Read(ctx)
	if err != nil {
		return
	}
	var req api.ExecRequest
	_ = json.Unmarshal(b, &req)
	f.mu.Lock()
	f.execs = append(f.execs, req)
	f.mu.Unlock()

	out := func(stream byte, s string) {
		_ = conn.Write(ctx, websocket.MessageBinary, append([]byte{stream}, s...))
	}
	control := func(ctl api.ExecControl) {
		b, _ := json.Marshal(ctl)
		_ = conn.Write(ctx, websocket.MessageText, b)
	}
	exit := func(code int) {
		control(api.ExecControl{Type: api.ExecExit, ExitCode: &code})
		_ = conn.Close(websocket.StatusNormalClosure, "")
	}
	// readStdin returns the stdin the client sent, up to its "eof".
	readStdin := func() string {
		var in strings.Builder
		for {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				return in.String()
			}
			if typ == websocket.MessageBinary {
				in.Write(b[1:])
				continue
			}
			var ctl api.ExecControl
			_ = json.Unmarshal(b, &ctl)
			if ctl.Type == api.ExecEOF {
				return in.String()
			}
		}
	}

	switch req.Cmd[0] {
	case "nope":
		control(api.ExecControl{Type: api.ExecError, Error: api.Errorf(api.CodeNotFound, "nope: command not found")})
		_ = conn.Close(websocket.StatusNormalClosure, "")
		return
	case "forbidden":
		control(api.ExecControl{Type: api.ExecError, Error: api.Errorf(api.CodeInvalid, "/etc: permission denied")})
		_ = conn.Close(websocket.StatusNormalClosure, "")
		return
	}
	control(api.ExecControl{Type: api.ExecStarted, PID: 314})
	switch req.Cmd[0] {
	case "echo":
		out(api.StreamStdout, strings.Join(req.Cmd[1:], " ")+"\n")
		exit(0)
	case "cat":
		if req.Stdin {
			out(api.StreamStdout, readStdin())
		}
		exit(0)
	case "warn":
		out(api.StreamStderr, "careful\n")
		exit(0)
	case "exit":
		var code int
		fmt.Sscan(req.Cmd[1], &code)
		exit(code)
	case "checkpointed":
		out(api.StreamStdout, "partial\n")
		_ = conn.Close(websocket.StatusInternalError, "")
	default:
		exit(0)
	}
}

// cliResult is what one run of the CLI did.
type cliResult struct {
	stdout, stderr string
	code           int
}

// runCLI runs the CLI against srv with the given stdin, as if at a terminal
// when interactive is true.
func runCLI(t *testing.T, srv *httptest.Server, stdin string, interactive bool, env map[string]string, args ...string) cliResult {
	t.Helper()
	var stdout, stderr bytes.Buffer
	a := &app{
		stdin:  strings.NewReader(stdin),
		stdout: &stdout,
		stderr: &stderr,
		getenv: func(k string) string { return env[k] },
		connect: func() (*client.Client, error) {
			return client.New(srv.URL, "tok"), nil
		},
		interactive: func() bool { return interactive },
	}
	root := newRoot(a)
	root.SetArgs(args)
	code := Execute(context.Background(), root)
	return cliResult{stdout: stdout.String(), stderr: stderr.String(), code: code}
}
