package mcp

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// fakeDaemon is enough of loam's REST API for the server's guardrails:
// sandboxes, checkpoints (with the daemon's per-sandbox limit) and file
// writes, removals and stats. It records every request it gets, in order.
type fakeDaemon struct {
	mu          sync.Mutex
	sandboxes   []api.Sandbox
	checkpoints map[string][]api.Checkpoint // by sandbox name
	next        int
	limit       int // the owner's checkpoints per sandbox; 0 is no limit
	failCreate  bool
	requests    []string // "METHOD /path?query"
	bodies      []string
}

func newFakeDaemon(t *testing.T) (*fakeDaemon, *client.Client) {
	f := &fakeDaemon{checkpoints: map[string][]api.Checkpoint{}}
	for _, name := range []string{"a", "b"} {
		f.sandboxes = append(f.sandboxes, api.Sandbox{ID: "sb-" + name + "00000000000", Name: name, State: api.StateRunning,
			Template: "busybox", URL: "http://" + name + "--default.localhost:7070", CreatedAt: time.Now()})
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, api.SandboxList{Sandboxes: f.sandboxes})
	})
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateSandbox
		_ = json.Unmarshal([]byte(f.lastBody()), &req)
		sb := api.Sandbox{ID: "sb-new000000000", Name: req.Name, State: api.StateRunning, CreatedAt: time.Now()}
		f.sandboxes = append(f.sandboxes, sb)
		reply(w, 201, sb)
	})
	mux.HandleFunc("GET /v1/sandboxes/{sb}", func(w http.ResponseWriter, r *http.Request) {
		if sb := f.find(w, r); sb != nil {
			reply(w, 200, sb)
		}
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{sb}", func(w http.ResponseWriter, r *http.Request) {
		if f.find(w, r) != nil {
			w.WriteHeader(204)
		}
	})
	mux.HandleFunc("POST /v1/sandboxes/{sb}/checkpoints", func(w http.ResponseWriter, r *http.Request) {
		sb := f.find(w, r)
		if sb == nil {
			return
		}
		if f.failCreate {
			reply(w, 409, api.ErrorBody{Error: api.Errorf(api.CodeConflict, "sandbox %s is being deleted", sb.Name)})
			return
		}
		if f.limit > 0 && f.owners(sb.Name) >= f.limit {
			reply(w, 409, api.ErrorBody{Error: api.Errorf(api.CodeLimit, "the sandbox has %d checkpoints, the limit", f.limit)})
			return
		}
		var req api.CreateCheckpoint
		_ = json.Unmarshal([]byte(f.lastBody()), &req)
		f.next++
		cp := api.Checkpoint{ID: fmt.Sprintf("v%d", f.next), Sandbox: sb.ID, Name: req.Name, Comment: req.Comment,
			Memory: req.Memory == nil || *req.Memory, CreatedAt: time.Now()}
		f.checkpoints[sb.Name] = append(f.checkpoints[sb.Name], cp)
		reply(w, 201, cp)
	})
	mux.HandleFunc("GET /v1/sandboxes/{sb}/checkpoints", func(w http.ResponseWriter, r *http.Request) {
		if sb := f.find(w, r); sb != nil {
			reply(w, 200, api.CheckpointList{Checkpoints: f.checkpoints[sb.Name]})
		}
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{sb}/checkpoints/{cp}", func(w http.ResponseWriter, r *http.Request) {
		sb := f.find(w, r)
		if sb == nil {
			return
		}
		cps := f.checkpoints[sb.Name]
		for i, cp := range cps {
			if cp.ID == r.PathValue("cp") {
				f.checkpoints[sb.Name] = append(cps[:i:i], cps[i+1:]...)
				w.WriteHeader(204)
				return
			}
		}
		reply(w, 404, api.ErrorBody{Error: api.Errorf(api.CodeNotFound, "no checkpoint %s", r.PathValue("cp"))})
	})
	mux.HandleFunc("PUT /v1/sandboxes/{sb}/files/content", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("path") == "/full" {
			reply(w, 507, api.ErrorBody{Error: api.Errorf(api.CodeInsufficientStorage, "no room on the host")})
			return
		}
		if f.find(w, r) != nil {
			reply(w, 200, api.FileInfo{Path: r.URL.Query().Get("path"), Type: api.FileTypeFile, Size: int64(len(f.lastBody())), Mode: "0644"})
		}
	})
	mux.HandleFunc("GET /v1/sandboxes/{sb}/files", func(w http.ResponseWriter, r *http.Request) {
		if f.find(w, r) != nil {
			reply(w, 404, api.ErrorBody{Error: api.Errorf(api.CodeNotFound, "%s: no such file or directory", r.URL.Query().Get("path"))})
		}
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{sb}/files", func(w http.ResponseWriter, r *http.Request) {
		if f.find(w, r) != nil {
			w.WriteHeader(204)
		}
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			reply(w, 401, api.ErrorBody{Error: api.Errorf(api.CodeUnauthorized, "missing or wrong token")})
			return
		}
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		defer f.mu.Unlock()
		line := r.Method + " " + r.URL.Path
		if r.URL.RawQuery != "" {
			line += "?" + r.URL.RawQuery
		}
		f.requests = append(f.requests, line)
		f.bodies = append(f.bodies, string(b))
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return f, client.New(srv.URL, "tok")
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// find is the sandbox the request names, or nil after a 404. The caller
// holds f.mu.
func (f *fakeDaemon) find(w http.ResponseWriter, r *http.Request) *api.Sandbox {
	ref := r.PathValue("sb")
	for i := range f.sandboxes {
		if f.sandboxes[i].Name == ref || f.sandboxes[i].ID == ref {
			return &f.sandboxes[i]
		}
	}
	reply(w, 404, api.ErrorBody{Error: api.Errorf(api.CodeNotFound, "no sandbox %s", ref)})
	return nil
}

// owners is how many checkpoints of sandbox count against the owner's
// limit: those not taken from inside. The caller holds f.mu.
func (f *fakeDaemon) owners(sandbox string) int {
	n := 0
	for _, cp := range f.checkpoints[sandbox] {
		if !cp.Inside && !cp.Auto {
			n++
		}
	}
	return n
}

// lastBody is the body of the request being served. The caller holds f.mu.
func (f *fakeDaemon) lastBody() string { return f.bodies[len(f.bodies)-1] }

// log is the requests so far, one a line, and forgets them.
func (f *fakeDaemon) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	reqs := f.requests
	f.requests, f.bodies = nil, nil
	return reqs
}

// own is the checkpoints of sandbox whose comment starts with prefix.
func (f *fakeDaemon) own(sandbox, prefix string) []api.Checkpoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Checkpoint
	for _, cp := range f.checkpoints[sandbox] {
		if strings.HasPrefix(cp.Comment, prefix) {
			out = append(out, cp)
		}
	}
	return out
}
