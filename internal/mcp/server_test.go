package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/testenv"
)

// allTools is every tool the server offers, and readTools those that change
// nothing.
var (
	allTools = []string{
		"create_checkpoint", "create_sandbox", "delete_sandbox", "fork_sandbox", "kill_session",
		"list_checkpoints", "list_files", "list_sandboxes", "list_sessions", "read_file", "read_session",
		"remove_file", "restore_checkpoint", "run_command", "sandbox_url", "start_session", "write_file",
	}
	readTools = []string{
		"list_checkpoints", "list_files", "list_sandboxes", "list_sessions", "read_file", "read_session", "sandbox_url",
	}
)

// connect runs a server for c with cfg and returns a client session to it
// over an in-memory transport, and the server's log.
func connect(t *testing.T, c *client.Client, cfg Config) (*sdk.ClientSession, *testenv.SyncBuffer) {
	t.Helper()
	logs := &testenv.SyncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	srv, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ct, st := sdk.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, st) }()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		cancel()
		<-done
	})
	return cs, logs
}

// callTool calls a tool and returns its result, failing the test on a
// protocol error (a tool error is a result).
func callTool(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	return res
}

// text is a result's text content.
func text(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// decodeResult decodes a successful result's structured content into v.
func decodeResult(t *testing.T, res *sdk.CallToolResult, v any) {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", text(res))
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
}

func toolNames(t *testing.T, cs *sdk.ClientSession) []string {
	t.Helper()
	var names []string
	for tool, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

func TestTools(t *testing.T) {
	_, c := newFakeDaemon(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"all", Config{}, allTools},
		{"read-only", Config{ReadOnly: true}, readTools},
		{"read-only with checkpoints", Config{ReadOnly: true, CheckpointBefore: CheckpointExec}, readTools},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, _ := connect(t, c, tc.cfg)
			if got := toolNames(t, cs); !slices.Equal(got, tc.want) {
				t.Errorf("tools:\n got %v\nwant %v", got, tc.want)
			}
			for tool, err := range cs.Tools(context.Background(), nil) {
				if err != nil {
					t.Fatal(err)
				}
				ro := slices.Contains(readTools, tool.Name)
				if tool.Annotations == nil || tool.Annotations.ReadOnlyHint != ro {
					t.Errorf("%s: readOnlyHint should be %v", tool.Name, ro)
				}
				if tool.Description == "" {
					t.Errorf("%s has no description", tool.Name)
				}
			}
		})
	}
}

func TestSandboxesGuard(t *testing.T) {
	f, c := newFakeDaemon(t)
	cs, logs := connect(t, c, Config{Sandboxes: []string{"a"}, CheckpointBefore: CheckpointExec})
	f.log()

	refused := []struct {
		tool string
		args map[string]any
		want string
	}{
		{"write_file", map[string]any{"sandbox": "b", "path": "/tmp/x", "content": "hi"}, `sandbox "b" is not one this MCP server may use`},
		{"write_file", map[string]any{"sandbox": "sb-b00000000000", "path": "/tmp/x", "content": "hi"}, "may use only a"},
		{"run_command", map[string]any{"sandbox": "b", "command": "true"}, "--sandboxes"},
		{"read_file", map[string]any{"sandbox": "b", "path": "/etc/hostname"}, "--sandboxes"},
		{"delete_sandbox", map[string]any{"sandbox": "b"}, "--sandboxes"},
		{"create_sandbox", map[string]any{"name": "c"}, `sandbox "c" is not one this MCP server may make`},
		{"create_sandbox", map[string]any{}, "may only make sandboxes named a"},
		{"fork_sandbox", map[string]any{"sandbox": "a", "checkpoint": "v1", "name": "c"}, "may make only a"},
		{"fork_sandbox", map[string]any{"sandbox": "b", "checkpoint": "v1", "name": "a"}, `sandbox "b" is not one`},
	}
	for _, tc := range refused {
		res := callTool(t, cs, tc.tool, tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("%s %v: want a tool error saying %q, got %v %q", tc.tool, tc.args, tc.want, res.IsError, text(res))
		}
	}
	for _, req := range f.log() {
		if !strings.HasPrefix(req, "GET ") {
			t.Errorf("a refused call reached the daemon: %s", req)
		}
	}
	if !strings.Contains(logs.String(), "tool call failed") {
		t.Errorf("refusals are not logged:\n%s", logs)
	}

	var list ListSandboxesOutput
	decodeResult(t, callTool(t, cs, "list_sandboxes", nil), &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].Name != "a" {
		t.Errorf("list_sandboxes shows %+v; want only a", list.Sandboxes)
	}
	// The allowed sandbox, named by its id, may be used.
	var out FileOutput
	decodeResult(t, callTool(t, cs, "write_file", map[string]any{"sandbox": "sb-a00000000000", "path": "/tmp/x", "content": "hi"}), &out)
}

func TestCheckpointBefore(t *testing.T) {
	calls := []struct {
		tool string
		args map[string]any
		kind kind
		// comment is the guard checkpoint's comment; request is the
		// daemon request the call makes after it.
		comment, request string
	}{
		{"write_file", map[string]any{"sandbox": "a", "path": "/home/loam/x.txt", "content": "hi"}, changes,
			"before mcp write_file: /home/loam/x.txt", "PUT /v1/sandboxes/a/files/content"},
		{"remove_file", map[string]any{"sandbox": "a", "path": "/home/loam/x.txt"}, changes,
			"before mcp remove_file: /home/loam/x.txt", "DELETE /v1/sandboxes/a/files"},
	}
	for _, policy := range []Checkpointing{CheckpointExec, CheckpointWrite, CheckpointNever} {
		for _, memory := range []bool{false, true} {
			for _, tc := range calls {
				t.Run(string(policy)+"/"+tc.tool, func(t *testing.T) {
					f, c := newFakeDaemon(t)
					cs, logs := connect(t, c, Config{CheckpointBefore: policy, CheckpointMemory: memory, CheckpointKeep: DefaultCheckpointKeep})
					f.log()
					res := callTool(t, cs, tc.tool, tc.args)
					var out struct{ Checkpoint string }
					decodeResult(t, res, &out)
					reqs := f.log()
					want := policy == CheckpointExec || (policy == CheckpointWrite && tc.kind == changes)
					cps := f.own("a", guardCommentPrefix)
					if !want {
						if len(cps) != 0 || out.Checkpoint != "" {
							t.Fatalf("policy %s took a checkpoint before %s: %+v", policy, tc.tool, cps)
						}
						return
					}
					if len(cps) != 1 {
						t.Fatalf("want one checkpoint before %s, got %+v (requests %q)", tc.tool, cps, reqs)
					}
					cp := cps[0]
					if cp.Comment != tc.comment || cp.Memory != memory || !strings.HasPrefix(cp.Name, guardNamePrefix) {
						t.Errorf("checkpoint %+v: want comment %q, memory %v, name mcp-…", cp, tc.comment, memory)
					}
					if out.Checkpoint != cp.ID {
						t.Errorf("result names checkpoint %q; want %q", out.Checkpoint, cp.ID)
					}
					cpAt := slices.Index(reqs, "POST /v1/sandboxes/a/checkpoints")
					callAt := slices.IndexFunc(reqs, func(r string) bool { return strings.HasPrefix(r, tc.request) })
					if cpAt < 0 || callAt < cpAt {
						t.Errorf("the checkpoint must come before the call: %q", reqs)
					}
					if !strings.Contains(logs.String(), "checkpoint="+cp.ID) {
						t.Errorf("the log does not name the checkpoint %s:\n%s", cp.ID, logs)
					}
				})
			}
		}
	}
}

func TestFailedCallNamesItsCheckpoint(t *testing.T) {
	f, c := newFakeDaemon(t)
	cs, _ := connect(t, c, Config{CheckpointBefore: CheckpointWrite})
	res := callTool(t, cs, "write_file", map[string]any{"sandbox": "a", "path": "/full", "content": "x"})
	cps := f.own("a", guardCommentPrefix)
	if len(cps) != 1 {
		t.Fatalf("checkpoints: %+v", cps)
	}
	if !res.IsError || !strings.Contains(text(res), "no room on the host") || !strings.Contains(text(res), "checkpoint "+cps[0].ID+" was taken before the call") {
		t.Errorf("want the daemon's message and the checkpoint, got %v %q", res.IsError, text(res))
	}
}

// TestGuardIgnoresInsideCheckpoints: a sandbox may name the checkpoints it
// takes of itself as the server names its own ("mcp-…", "before mcp …").
// The server must neither prune the sandbox's (not its to delete) nor count
// them as its own, or a sandbox could have the server delete its real undo
// points by taking a few newer look-alikes.
func TestGuardIgnoresInsideCheckpoints(t *testing.T) {
	f, c := newFakeDaemon(t)
	f.limit = 10
	cs, _ := connect(t, c, Config{CheckpointBefore: CheckpointWrite, CheckpointKeep: 3})
	write := func() string {
		var out FileOutput
		decodeResult(t, callTool(t, cs, "write_file", map[string]any{"sandbox": "a", "path": "/x", "content": "x"}), &out)
		return out.Checkpoint
	}
	real := []string{write(), write()}
	f.mu.Lock()
	for i := range 3 {
		f.next++
		f.checkpoints["a"] = append(f.checkpoints["a"], api.Checkpoint{ID: fmt.Sprintf("v%d", f.next), Sandbox: "sb-a00000000000",
			Name: fmt.Sprintf("mcp-0000000%d", i), Comment: guardCommentPrefix + "write_file: /x", Inside: true, CreatedAt: time.Now()})
	}
	f.mu.Unlock()
	real = append(real, write())
	var kept, fakes []string
	for _, cp := range f.own("a", guardCommentPrefix) {
		if cp.Inside {
			fakes = append(fakes, cp.ID)
		} else {
			kept = append(kept, cp.ID)
		}
	}
	if !slices.Equal(kept, real) || len(fakes) != 3 {
		t.Errorf("kept %v and the sandbox's %v; want all three of the server's %v and the sandbox's three", kept, fakes, real)
	}
}

func TestCheckpointKeep(t *testing.T) {
	f, c := newFakeDaemon(t)
	f.limit = 4
	// A checkpoint of the user's own, which the server must never prune.
	if _, err := c.CreateCheckpoint(context.Background(), "a", apiCheckpoint("mine")); err != nil {
		t.Fatal(err)
	}
	cs, _ := connect(t, c, Config{CheckpointBefore: CheckpointWrite, CheckpointKeep: 3})
	var ids []string
	for range 6 {
		var out FileOutput
		decodeResult(t, callTool(t, cs, "write_file", map[string]any{"sandbox": "a", "path": "/x", "content": "x"}), &out)
		ids = append(ids, out.Checkpoint)
	}
	own := f.own("a", guardCommentPrefix)
	var kept []string
	for _, cp := range own {
		kept = append(kept, cp.ID)
	}
	if !slices.Equal(kept, ids[3:]) {
		t.Errorf("kept %v; want the newest three of %v", kept, ids)
	}
	if mine := f.own("a", "mine"); len(mine) != 1 {
		t.Errorf("the user's checkpoint was pruned: %+v", f.checkpoints["a"])
	}

	// At the daemon's limit with nothing of its own to prune, the call is
	// refused and not made.
	f2, c2 := newFakeDaemon(t)
	f2.limit = 1
	if _, err := c2.CreateCheckpoint(context.Background(), "a", apiCheckpoint("mine")); err != nil {
		t.Fatal(err)
	}
	cs2, _ := connect(t, c2, Config{CheckpointBefore: CheckpointWrite, CheckpointKeep: 3})
	f2.log()
	res := callTool(t, cs2, "write_file", map[string]any{"sandbox": "a", "path": "/x", "content": "x"})
	if !res.IsError || !strings.Contains(text(res), "the call was not made") || !strings.Contains(text(res), "the limit") {
		t.Errorf("want a refusal naming the limit, got %v %q", res.IsError, text(res))
	}
	for _, r := range f2.log() {
		if strings.HasPrefix(r, "PUT ") {
			t.Errorf("the write was made without its checkpoint: %s", r)
		}
	}
}

func TestCheckpointFailureRefusesTheCall(t *testing.T) {
	f, c := newFakeDaemon(t)
	f.failCreate = true
	cs, _ := connect(t, c, Config{CheckpointBefore: CheckpointExec})
	f.log()
	res := callTool(t, cs, "remove_file", map[string]any{"sandbox": "a", "path": "/home/loam/important"})
	if !res.IsError || !strings.Contains(text(res), "is being deleted") {
		t.Errorf("want the daemon's message in a tool error, got %v %q", res.IsError, text(res))
	}
	for _, r := range f.log() {
		if strings.HasPrefix(r, "DELETE ") {
			t.Errorf("the removal was made without its checkpoint: %s", r)
		}
	}
}

func TestBadArguments(t *testing.T) {
	f, c := newFakeDaemon(t)
	cs, _ := connect(t, c, Config{})
	f.log()
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"run_command", map[string]any{"sandbox": "a"}, "give command (a shell line) or argv"},
		{"run_command", map[string]any{"sandbox": "a", "command": "ls", "argv": []string{"ls"}}, "not both"},
		{"run_command", map[string]any{"sandbox": "a", "argv": []string{""}}, "argv[0]"},
		{"run_command", map[string]any{"sandbox": "a", "command": "ls", "timeout_seconds": -1}, "timeout_seconds -1"},
		{"run_command", map[string]any{"sandbox": "a", "command": "ls", "timeout_seconds": 100000}, "give 1 to 3600"},
		{"run_command", map[string]any{"sandbox": "a", "command": "ls", "dir": "tmp"}, "not an absolute path"},
		{"run_command", map[string]any{"command": "ls"}, "sandbox"},
		{"run_command", map[string]any{"sandbox": 7, "command": "ls"}, "sandbox"},
		{"start_session", map[string]any{"sandbox": "a"}, "give command"},
		{"read_session", map[string]any{"sandbox": "a", "session": "../../etc"}, "a session id is s-"},
		{"read_session", map[string]any{"sandbox": "a", "session": "s-abc", "max_bytes": 1 << 30}, "max_bytes"},
		{"read_session", map[string]any{"sandbox": "a", "session": "s-abc", "offset": -5}, "0 or more"},
		{"kill_session", map[string]any{"sandbox": "a", "session": ""}, "a session id is s-"},
		{"write_file", map[string]any{"sandbox": "a", "path": "relative.txt", "content": "x"}, "not an absolute path"},
		{"write_file", map[string]any{"sandbox": "a", "path": "/x", "content": "%%%", "encoding": "base64"}, "not valid base64"},
		{"write_file", map[string]any{"sandbox": "a", "path": "/x", "content": "x", "encoding": "latin1"}, "give utf-8 or base64"},
		{"write_file", map[string]any{"sandbox": "a", "path": "/x", "content": "x", "mode": "rwx"}, "in octal"},
		{"write_file", map[string]any{"sandbox": "a", "path": "/x"}, "content"},
		{"read_file", map[string]any{"sandbox": "a", "path": "/x", "offset": -1}, "0 or more"},
		{"list_files", map[string]any{"sandbox": "a", "path": "/", "depth": 99}, "depth 99"},
		{"remove_file", map[string]any{"sandbox": "a", "path": "/"}, "root"},
		{"remove_file", map[string]any{"sandbox": "", "path": "/x"}, "give the name or id of a sandbox"},
		{"restore_checkpoint", map[string]any{"sandbox": "a", "checkpoint": ""}, "give a checkpoint"},
		{"fork_sandbox", map[string]any{"sandbox": "a", "checkpoint": ""}, "give a checkpoint"},
		{"create_sandbox", map[string]any{"http_port": 70000}, "http_port"},
	} {
		res := callTool(t, cs, tc.tool, tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("%s %v: want a tool error saying %q, got %v %q", tc.tool, tc.args, tc.want, res.IsError, text(res))
		}
	}
	for _, r := range f.log() {
		t.Errorf("a call with bad arguments reached the daemon: %s", r)
	}
}

func TestAPIErrors(t *testing.T) {
	_, c := newFakeDaemon(t)
	cs, _ := connect(t, c, Config{})
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"read_file", map[string]any{"sandbox": "a", "path": "/nope"}, "/nope: no such file or directory"},
		{"list_checkpoints", map[string]any{"sandbox": "ghost"}, "no sandbox ghost"},
		{"delete_sandbox", map[string]any{"sandbox": "ghost"}, "no sandbox ghost"},
	} {
		res := callTool(t, cs, tc.tool, tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("%s: want a tool error with the API's message %q, got %v %q", tc.tool, tc.want, res.IsError, text(res))
		}
	}

	// A server started with the wrong token says so.
	wrong := client.New(c.URL(), "not-the-token")
	cs2, _ := connect(t, wrong, Config{})
	res := callTool(t, cs2, "list_sandboxes", nil)
	if !res.IsError || !strings.Contains(text(res), "not the daemon's") {
		t.Errorf("want a tool error about the token, got %v %q", res.IsError, text(res))
	}
}

func TestHTTPToken(t *testing.T) {
	_, c := newFakeDaemon(t)
	srv, err := New(c, Config{Logger: slog.New(slog.NewTextHandler(&testenv.SyncBuffer{}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler("tok"))
	defer hs.Close()
	for _, tc := range []struct {
		name, header string
		status       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"wrong token", "Bearer nope", http.StatusUnauthorized},
		{"not bearer", "Basic dG9rOg==", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", hs.URL+Path, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("status %d; want %d", resp.StatusCode, tc.status)
			}
		})
	}

	// With the token, a client lists the tools.
	hc := &http.Client{Transport: bearer{"tok", http.DefaultTransport}}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "0"}, nil).
		Connect(context.Background(), &sdk.StreamableClientTransport{Endpoint: hs.URL + Path, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if got := toolNames(t, cs); !slices.Equal(got, allTools) {
		t.Errorf("tools over HTTP: %v", got)
	}

	// An empty token lets no one in.
	empty := httptest.NewServer(srv.Handler(""))
	defer empty.Close()
	req, _ := http.NewRequest("POST", empty.URL+Path, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer ")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("an empty token: status %d; want 401", resp.StatusCode)
	}
}

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func TestParseCheckpointing(t *testing.T) {
	for _, s := range []string{"exec", "write", "never"} {
		if _, err := ParseCheckpointing(s); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	if _, err := ParseCheckpointing("always"); err == nil || !strings.Contains(err.Error(), "give exec, write or never") {
		t.Errorf("always: %v", err)
	}
}

func TestGuardComment(t *testing.T) {
	long := strings.Repeat("é", 300)
	for _, tc := range []struct{ tool, what, want string }{
		{"run_command", "make  test\n&& echo ok", "before mcp exec: make test && echo ok"},
		{"write_file", "/x", "before mcp write_file: /x"},
		{"kill_session", "", "before mcp kill_session"},
	} {
		if got := guardComment(tc.tool, tc.what); got != tc.want {
			t.Errorf("guardComment(%q, %q) = %q; want %q", tc.tool, tc.what, got, tc.want)
		}
	}
	got := guardComment("run_command", long)
	if len(got) > 1024 || !strings.HasSuffix(got, "…") || !utf8Valid(got) {
		t.Errorf("a long command's comment: %q", got)
	}
}

func apiCheckpoint(comment string) api.CreateCheckpoint {
	return api.CreateCheckpoint{Comment: comment, Memory: new(false)}
}

func utf8Valid(s string) bool { return utf8.ValidString(s) }

func TestTail(t *testing.T) {
	tl := &tail{max: 4}
	for _, s := range []string{"ab", "cde", "fghij"} {
		tl.Write([]byte(s))
	}
	if tl.String() != "ghij" || tl.dropped() != 6 {
		t.Errorf("tail %q dropped %d; want ghij, 6", tl, tl.dropped())
	}
}

func TestWindow(t *testing.T) {
	w := &window{max: 5, pos: 10}
	if n, err := w.Write([]byte("abc")); n != 3 || err != nil {
		t.Fatalf("write: %d %v", n, err)
	}
	if n, err := w.Write([]byte("defg")); n != 2 || !errors.Is(err, errFull) {
		t.Fatalf("write past the window: %d %v", n, err)
	}
	if string(w.buf) != "abcde" || w.pos != 15 {
		t.Errorf("window %q at %d; want abcde at 15", w.buf, w.pos)
	}
}

func TestRuneCut(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want int
	}{
		{[]byte("abc"), 0},
		{[]byte("ab\xc3"), 2},         // é cut after its first byte
		{[]byte("ab\xe2\x82"), 2},     // € cut after two
		{[]byte("abé"), 0},            // whole
		{[]byte{0xff, 0xfe, 0xfd}, 0}, // not text at all
	} {
		if got := runeCut(tc.in); got != tc.want {
			t.Errorf("runeCut(%q) = %d; want %d", tc.in, got, tc.want)
		}
	}
}

func TestEveryCallLogged(t *testing.T) {
	_, c := newFakeDaemon(t)
	cs, logs := connect(t, c, Config{})
	// Refused by the SDK's schema check before any handler runs.
	callTool(t, cs, "run_command", map[string]any{"sandbox": 7})
	// Refused by the handler.
	callTool(t, cs, "write_file", map[string]any{"sandbox": "a", "path": "x", "content": ""})
	callTool(t, cs, "list_sandboxes", nil)
	log := logs.String()
	for _, want := range []string{
		`msg="tool call failed" tool=run_command`,
		`msg="tool call failed" tool=write_file`,
		`msg="tool call" tool=list_sandboxes`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, log)
		}
	}
}

func TestPanicIsAToolError(t *testing.T) {
	logs := &testenv.SyncBuffer{}
	c := &call{tool: "boom"}
	_, err := safely(context.Background(), slog.New(slog.NewTextHandler(logs, nil)), c, 0,
		func(context.Context, *call, int) (int, error) { panic("nil map") })
	if err == nil || !strings.Contains(err.Error(), "internal error in boom: nil map") {
		t.Errorf("a panic: %v", err)
	}
	if !strings.Contains(logs.String(), "stack=") {
		t.Errorf("the panic's stack is not logged:\n%s", logs)
	}
}

func TestConfig(t *testing.T) {
	_, c := newFakeDaemon(t)
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{CheckpointBefore: "always"}, "give exec, write or never"},
		{Config{CheckpointKeep: -1}, "checkpoint-keep -1"},
		{Config{Sandboxes: []string{"a", " "}}, "an empty name"},
	} {
		if _, err := New(c, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v; want an error saying %q", tc.cfg, err, tc.want)
		}
	}
	s, err := New(c, Config{Sandboxes: []string{"a", " b"}})
	if err != nil {
		t.Fatal(err)
	}
	if !s.allowed("b", "") || s.allowed(" b", "") {
		t.Errorf("sandboxes %q: spaces around a name should not count", s.cfg.Sandboxes)
	}
}
