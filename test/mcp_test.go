package test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	imcp "loam.dev/loam/internal/mcp"
	"loam.dev/loam/test/harness"
)

// The MCP server is driven as an agent's MCP client drives it: the Go SDK's
// client runs the built `loam mcp` (stdio) or talks to `loam mcp --listen`
// (streamable HTTP), against a real daemon with real sandboxes.

// mcpServer is a `loam mcp` process and a client session to it.
type mcpServer struct {
	cs  *sdk.ClientSession
	log *harness.SyncBuffer // its stderr
}

// startMCP runs `loam mcp args…` for d over stdio and connects to it; it
// ends with the test.
func startMCP(t testing.TB, d *harness.Daemon, args ...string) *mcpServer {
	t.Helper()
	return startMCPAs(t, d, d.Token, args...)
}

// startMCPAs is startMCP with token (an API key) as LOAM_TOKEN.
func startMCPAs(t testing.TB, d *harness.Daemon, token string, args ...string) *mcpServer {
	t.Helper()
	cmd := exec.Command(harness.LoamBin, append([]string{"mcp"}, args...)...)
	cmd.Env = append(os.Environ(), "LOAM_API_URL="+d.URL, "LOAM_TOKEN="+token)
	m := &mcpServer{log: &harness.SyncBuffer{}}
	cmd.Stderr = m.log
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "loam-test", Version: "0"}, nil).
		Connect(mcpCtx(t), &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connecting to loam mcp: %v\n%s", err, m.log)
	}
	m.cs = cs
	t.Cleanup(func() {
		cs.Close()
		if t.Failed() {
			t.Logf("loam mcp log:\n%s", m.log)
		}
	})
	return m
}

// call calls a tool and returns its result; a protocol error fails the test.
func (m *mcpServer) call(t testing.TB, tool string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	res, err := m.cs.CallTool(mcpCtx(t), &sdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v\n%s", tool, err, m.log)
	}
	return res
}

// ok calls a tool that must succeed and decodes its structured result into out.
func (m *mcpServer) ok(t testing.TB, tool string, args map[string]any, out any) {
	t.Helper()
	res := m.call(t, tool, args)
	if res.IsError {
		t.Fatalf("%s %v: tool error: %s", tool, args, resultText(res))
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: decoding %s: %v", tool, b, err)
		}
	}
}

// fails calls a tool that must fail with a tool error saying want.
func (m *mcpServer) fails(t *testing.T, tool string, args map[string]any, want string) {
	t.Helper()
	res := m.call(t, tool, args)
	if !res.IsError || !strings.Contains(resultText(res), want) {
		t.Errorf("%s %v: want a tool error saying %q, got error=%v %q", tool, args, want, res.IsError, resultText(res))
	}
}

func (m *mcpServer) tools(t *testing.T) []*sdk.Tool {
	t.Helper()
	var tools []*sdk.Tool
	for tool, err := range m.cs.Tools(harness.Ctx(t), nil) {
		if err != nil {
			t.Fatal(err)
		}
		tools = append(tools, tool)
	}
	return tools
}

// mcpCtx bounds a call of an MCP test or benchmark.
func mcpCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func resultText(res *sdk.CallToolResult) string {
	if res == nil {
		return ""
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// checkpointByID is sandbox's checkpoint id, read from the daemon.
func checkpointByID(t *testing.T, d *harness.Daemon, sandbox, id string) api.Checkpoint {
	t.Helper()
	cp, err := d.C.GetCheckpoint(harness.Ctx(t), sandbox, id)
	if err != nil {
		t.Fatalf("checkpoint %s of %s: %v", id, sandbox, err)
	}
	return *cp
}

// TestMCPTools drives every tool through `loam mcp --checkpoint-before=exec`
// over stdio: a checkpoint comes before each command and each change, its
// id is in the result and the log, and restoring to it undoes the step.
func TestMCPTools(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	m := startMCP(t, d, "--checkpoint-before=exec")

	names := []string{}
	for _, tool := range m.tools(t) {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	want := []string{"create_checkpoint", "create_sandbox", "delete_sandbox", "fork_sandbox", "kill_session",
		"list_checkpoints", "list_files", "list_sandboxes", "list_sessions", "read_file", "read_session",
		"remove_file", "restore_checkpoint", "run_command", "sandbox_url", "start_session", "write_file"}
	if !slices.Equal(names, want) {
		t.Fatalf("tools: %v", names)
	}

	// create_sandbox, list_sandboxes.
	var created imcp.SandboxOutput
	m.ok(t, "create_sandbox", map[string]any{"name": "agent", "labels": map[string]string{"by": "mcp"}}, &created)
	if created.Sandbox.Name != "agent" || created.Sandbox.State != "running" || created.Sandbox.Labels["by"] != "mcp" {
		t.Fatalf("create_sandbox: %+v", created)
	}
	var list imcp.ListSandboxesOutput
	m.ok(t, "list_sandboxes", nil, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != created.Sandbox.ID {
		t.Fatalf("list_sandboxes: %+v", list)
	}

	// run_command: output, exit code, and the checkpoint before it.
	var run imcp.RunOutput
	m.ok(t, "run_command", map[string]any{"sandbox": "agent", "command": "echo out; echo err >&2; echo step1 > /home/loam/state; exit 3"}, &run)
	if run.ExitCode != 3 || run.Stdout != "out\n" || run.Stderr != "err\n" || run.Checkpoint == "" {
		t.Fatalf("run_command: %+v", run)
	}
	firstExec := run.Checkpoint
	cp := checkpointByID(t, d, "agent", run.Checkpoint)
	if cp.Memory || cp.Comment != "before mcp exec: echo out; echo err >&2; echo step1 > /home/loam/state; exit 3" {
		t.Errorf("the checkpoint before exec: %+v", cp)
	}
	// The log comes through a pipe: give it a moment.
	logged := regexp.MustCompile(`tool=run_command .*sandbox=agent .*checkpoint=` + run.Checkpoint)
	waitFor(t, func() bool { return logged.MatchString(m.log.String()) })

	// argv, stdin, env and dir.
	m.ok(t, "run_command", map[string]any{"sandbox": "agent", "argv": []string{"sh", "-c", `cat; echo "$X" "$(pwd)"`},
		"stdin": "in\n", "env": map[string]string{"X": "y"}, "dir": "/tmp"}, &run)
	if run.ExitCode != 0 || run.Stdout != "in\ny /tmp\n" || run.Checkpoint == "" || run.Checkpoint == firstExec {
		t.Errorf("run_command with argv: %+v", run)
	}

	// A command past its timeout is killed, with its children.
	start := time.Now()
	m.fails(t, "run_command", map[string]any{"sandbox": "agent", "command": "echo started; sleep 300 & sleep 300", "timeout_seconds": 2},
		"did not finish within 2s and was killed with its children; what it wrote until then:\nstdout:\nstarted\n")
	m.fails(t, "run_command", map[string]any{"sandbox": "agent", "command": "sleep 300", "timeout_seconds": 1},
		"restore_checkpoint to it to undo what the call did")
	if el := time.Since(start); el > time.Minute {
		t.Errorf("the timed-out call took %s", el)
	}
	waitFor(t, func() bool {
		out := d.Run("agent", "ps")
		return !strings.Contains(out, "sleep 300")
	})

	// Files: write, read, list, remove; binary content comes back in base64.
	var wrote imcp.FileOutput
	m.ok(t, "write_file", map[string]any{"sandbox": "agent", "path": "/home/loam/notes/hello.txt", "content": "hello, agent\n"}, &wrote)
	firstWrite := wrote.Checkpoint
	if wrote.File.Size != 13 || firstWrite == "" {
		t.Errorf("write_file: %+v", wrote)
	}
	if cp := checkpointByID(t, d, "agent", wrote.Checkpoint); cp.Comment != "before mcp write_file: /home/loam/notes/hello.txt" {
		t.Errorf("the checkpoint before write_file: %+v", cp)
	}
	var read imcp.ReadFileOutput
	m.ok(t, "read_file", map[string]any{"sandbox": "agent", "path": "/home/loam/notes/hello.txt"}, &read)
	if read.Content != "hello, agent\n" || read.Encoding != "utf-8" || read.Size != 13 || read.More {
		t.Errorf("read_file: %+v", read)
	}
	m.ok(t, "read_file", map[string]any{"sandbox": "agent", "path": "/home/loam/notes/hello.txt", "offset": 7, "max_bytes": 3}, &read)
	if read.Content != "age" || !read.More {
		t.Errorf("read_file from 7, 3 bytes: %+v", read)
	}
	bin := []byte{0, 1, 2, 0xff, 0xfe}
	m.ok(t, "write_file", map[string]any{"sandbox": "agent", "path": "/home/loam/notes/bin", "content": base64.StdEncoding.EncodeToString(bin),
		"encoding": "base64", "mode": "0600"}, &wrote)
	if wrote.File.Mode != "0600" {
		t.Errorf("write_file with mode 0600: %+v", wrote.File)
	}
	m.ok(t, "read_file", map[string]any{"sandbox": "agent", "path": "/home/loam/notes/bin"}, &read)
	if got, _ := base64.StdEncoding.DecodeString(read.Content); read.Encoding != "base64" || string(got) != string(bin) {
		t.Errorf("read_file of binary content: %+v", read)
	}
	var ls imcp.ListFilesOutput
	m.ok(t, "list_files", map[string]any{"sandbox": "agent", "path": "/home/loam", "depth": 2}, &ls)
	var paths []string
	for _, e := range ls.Entries {
		paths = append(paths, e.Path)
	}
	for _, p := range []string{"/home/loam/notes", "/home/loam/notes/hello.txt", "/home/loam/notes/bin", "/home/loam/state"} {
		if !slices.Contains(paths, p) {
			t.Errorf("list_files does not show %s: %v", p, paths)
		}
	}
	var removed imcp.RemoveFileOutput
	m.ok(t, "remove_file", map[string]any{"sandbox": "agent", "path": "/home/loam/notes/bin"}, &removed)
	if removed.Checkpoint == "" {
		t.Errorf("remove_file took no checkpoint: %+v", removed)
	}
	m.fails(t, "read_file", map[string]any{"sandbox": "agent", "path": "/home/loam/notes/bin"}, "not_found")

	// Sessions: start, read on from the offsets, kill.
	var started imcp.StartSessionOutput
	m.ok(t, "start_session", map[string]any{"sandbox": "agent", "command": "for i in 1 2 3; do echo line$i; done; echo oops >&2; sleep 600"}, &started)
	if !api.ValidSessionID(started.Session.ID) || started.Checkpoint == "" {
		t.Fatalf("start_session: %+v", started)
	}
	var rs imcp.ReadSessionOutput
	waitFor(t, func() bool {
		m.ok(t, "read_session", map[string]any{"sandbox": "agent", "session": started.Session.ID}, &rs)
		return strings.Contains(rs.Stdout, "line3") && rs.Stderr == "oops\n"
	})
	if rs.Stdout != "line1\nline2\nline3\n" || rs.NextOffset != 18 || rs.NextStderrOffset != 5 || rs.Session.State != "running" {
		t.Errorf("read_session: %+v", rs)
	}
	m.ok(t, "read_session", map[string]any{"sandbox": "agent", "session": started.Session.ID, "offset": 6, "stderr_offset": 5, "max_bytes": 6}, &rs)
	if rs.Stdout != "line2\n" || rs.Stderr != "" || rs.NextOffset != 12 || !rs.More {
		t.Errorf("read_session from offset 6, 6 bytes: %+v", rs)
	}
	var sessions imcp.ListSessionsOutput
	m.ok(t, "list_sessions", map[string]any{"sandbox": "agent"}, &sessions)
	if !slices.ContainsFunc(sessions.Sessions, func(s imcp.Session) bool { return s.ID == started.Session.ID && s.State == "running" }) {
		t.Errorf("list_sessions: %+v", sessions)
	}
	var killed imcp.KillSessionOutput
	m.ok(t, "kill_session", map[string]any{"sandbox": "agent", "session": started.Session.ID}, &killed)
	if killed.Checkpoint == "" {
		t.Errorf("kill_session took no checkpoint: %+v", killed)
	}
	waitFor(t, func() bool { return !strings.Contains(d.Run("agent", "ps"), "sleep 600") })

	// Checkpoints: take one; list them (the server kept its newest five,
	// --checkpoint-keep's default, so the first exec's is gone); restore to
	// the one before the first write (the file it wrote is gone, the file
	// written before it is there); fork.
	var mine imcp.CheckpointOutput
	m.ok(t, "create_checkpoint", map[string]any{"sandbox": "agent", "comment": "notes written", "name": "notes", "memory": false}, &mine)
	if mine.Checkpoint.Name != "notes" || mine.Checkpoint.Memory {
		t.Errorf("create_checkpoint: %+v", mine)
	}
	var cps imcp.ListCheckpointsOutput
	m.ok(t, "list_checkpoints", map[string]any{"sandbox": "agent"}, &cps)
	var own []string
	for _, c := range cps.Checkpoints {
		if strings.HasPrefix(c.Name, "mcp-") {
			own = append(own, c.ID)
		}
	}
	if len(own) != 5 || own[0] != firstWrite || slices.Contains(own, firstExec) ||
		cps.Checkpoints[len(cps.Checkpoints)-1].ID != mine.Checkpoint.ID {
		t.Errorf("list_checkpoints: %+v; want the server's newest five, from the first write's (%s), then the agent's own", cps, firstWrite)
	}
	var restored imcp.RestoreOutput
	m.ok(t, "restore_checkpoint", map[string]any{"sandbox": "agent", "checkpoint": firstWrite}, &restored)
	if !strings.HasPrefix(restored.Checkpoint, "auto-") || restored.Sandbox.State != "running" {
		t.Errorf("restore_checkpoint: %+v", restored)
	}
	m.ok(t, "run_command", map[string]any{"sandbox": "agent", "command": "cat /home/loam/state /home/loam/notes/hello.txt 2>&1; true"}, &run)
	if !strings.Contains(run.Stdout, "step1") || !strings.Contains(run.Stdout, "No such file") {
		t.Errorf("after restoring the checkpoint before the first write: %q", run.Stdout)
	}
	var fork imcp.SandboxOutput
	m.ok(t, "fork_sandbox", map[string]any{"sandbox": "agent", "checkpoint": "notes", "name": "agent-fork"}, &fork)
	if fork.Sandbox.Name != "agent-fork" || fork.Sandbox.Fork == "" {
		t.Errorf("fork_sandbox: %+v", fork)
	}
	m.ok(t, "read_file", map[string]any{"sandbox": "agent-fork", "path": "/home/loam/notes/hello.txt"}, &read)
	if read.Content != "hello, agent\n" {
		t.Errorf("the fork's file: %+v", read)
	}

	// sandbox_url.
	var u imcp.URLOutput
	m.ok(t, "sandbox_url", map[string]any{"sandbox": "agent"}, &u)
	if u.URL == "" || u.AccessToken == "" || !strings.Contains(u.OpenURL, "loam_token=") {
		t.Errorf("sandbox_url: %+v", u)
	}

	// Bad arguments and the daemon's refusals are tool errors; the server
	// carries on.
	m.fails(t, "run_command", map[string]any{"sandbox": "agent"}, "give command (a shell line) or argv")
	m.fails(t, "write_file", map[string]any{"sandbox": "agent", "path": "notes.txt", "content": "x"}, "not an absolute path")
	m.fails(t, "run_command", map[string]any{"sandbox": "agent", "argv": []string{"no-such-program"}}, "not_found")
	m.fails(t, "read_file", map[string]any{"sandbox": "ghost", "path": "/x"}, "ghost")
	m.fails(t, "restore_checkpoint", map[string]any{"sandbox": "agent", "checkpoint": "v999"}, "v999")
	m.fails(t, "run_command", map[string]any{"sandbox": "agent", "command": "true", "bogus": 1}, "bogus")

	// delete_sandbox.
	m.ok(t, "delete_sandbox", map[string]any{"sandbox": "agent-fork"}, nil)
	if _, err := d.C.GetSandbox(harness.Ctx(t), "agent-fork"); err == nil {
		t.Error("delete_sandbox left the sandbox")
	}
	if strings.Contains(m.log.String(), "panic") {
		t.Errorf("the server panicked:\n%s", m.log)
	}
}

// TestMCPGuardrails checks --sandboxes, --read-only and
// --checkpoint-before=write against a real daemon.
func TestMCPGuardrails(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	for _, name := range []string{"mine", "theirs"} {
		if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: name}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("sandboxes", func(t *testing.T) {
		m := startMCP(t, d, "--sandboxes", "mine")
		m.fails(t, "write_file", map[string]any{"sandbox": "theirs", "path": "/home/loam/x", "content": "x"}, `sandbox "theirs" is not one this MCP server may use`)
		if _, err := d.C.StatFile(ctx, "theirs", "/home/loam/x", nil); err == nil {
			t.Error("the refused write was made")
		}
		m.fails(t, "run_command", map[string]any{"sandbox": "theirs", "command": "touch /home/loam/y"}, "--sandboxes")
		m.fails(t, "delete_sandbox", map[string]any{"sandbox": "theirs"}, "--sandboxes")
		m.fails(t, "create_sandbox", map[string]any{"name": "other"}, `sandbox "other" is not one this MCP server may make`)
		var list imcp.ListSandboxesOutput
		m.ok(t, "list_sandboxes", nil, &list)
		if len(list.Sandboxes) != 1 || list.Sandboxes[0].Name != "mine" {
			t.Errorf("list_sandboxes: %+v", list)
		}
		m.ok(t, "write_file", map[string]any{"sandbox": "mine", "path": "/home/loam/x", "content": "x"}, nil)
		sbs, err := d.C.ListSandboxes(ctx, client.ListOptions{})
		if err != nil || len(sbs) != 2 {
			t.Errorf("sandboxes after the refusals: %d %v", len(sbs), err)
		}
	})

	t.Run("sleeping sandbox", func(t *testing.T) {
		// An agent's sandbox that went to sleep while it thought gets its
		// checkpoint and its command all the same.
		if _, err := d.C.Sleep(ctx, "mine"); err != nil {
			t.Fatal(err)
		}
		m := startMCP(t, d, "--checkpoint-before=exec")
		var run imcp.RunOutput
		m.ok(t, "run_command", map[string]any{"sandbox": "mine", "command": "echo awake"}, &run)
		if run.Stdout != "awake\n" || run.Checkpoint == "" {
			t.Errorf("run_command on a sleeping sandbox: %+v", run)
		}
	})

	t.Run("read-only", func(t *testing.T) {
		m := startMCP(t, d, "--read-only")
		var names []string
		for _, tool := range m.tools(t) {
			names = append(names, tool.Name)
			if tool.Annotations == nil || !tool.Annotations.ReadOnlyHint {
				t.Errorf("read-only server offers %s, which is not read-only", tool.Name)
			}
		}
		slices.Sort(names)
		if want := []string{"list_checkpoints", "list_files", "list_sandboxes", "list_sessions", "read_file", "read_session", "sandbox_url"}; !slices.Equal(names, want) {
			t.Errorf("read-only tools: %v", names)
		}
		res, err := m.cs.CallTool(ctx, &sdk.CallToolParams{Name: "write_file", Arguments: map[string]any{"sandbox": "mine", "path": "/x", "content": "x"}})
		if err == nil && !res.IsError {
			t.Error("a read-only server wrote a file")
		}
	})

	t.Run("checkpoint-before=write", func(t *testing.T) {
		m := startMCP(t, d, "--checkpoint-before=write", "--checkpoint-memory")
		var run imcp.RunOutput
		m.ok(t, "run_command", map[string]any{"sandbox": "mine", "command": "echo hi > /home/loam/ran"}, &run)
		if run.Checkpoint != "" {
			t.Errorf("--checkpoint-before=write took a checkpoint before a command: %+v", run)
		}
		var wrote imcp.FileOutput
		m.ok(t, "write_file", map[string]any{"sandbox": "mine", "path": "/home/loam/ran", "content": "changed"}, &wrote)
		if wrote.Checkpoint == "" {
			t.Fatalf("--checkpoint-before=write took no checkpoint before write_file: %+v", wrote)
		}
		if cp := checkpointByID(t, d, "mine", wrote.Checkpoint); !cp.Memory {
			t.Errorf("--checkpoint-memory took a disk-only checkpoint: %+v", cp)
		}
		// Undo the write with the checkpoint the result named.
		m.ok(t, "restore_checkpoint", map[string]any{"sandbox": "mine", "checkpoint": wrote.Checkpoint}, nil)
		var read imcp.ReadFileOutput
		m.ok(t, "read_file", map[string]any{"sandbox": "mine", "path": "/home/loam/ran"}, &read)
		if read.Content != "hi\n" {
			t.Errorf("after undoing the write: %q", read.Content)
		}
	})
}

// TestMCPCommandThroughCheckpoint checks that a command run_command waits
// for outlives a memory checkpoint taken meanwhile (which ends every exec
// stream on the sandbox): the server attaches to it again and returns its
// whole output and exit code.
func TestMCPCommandThroughCheckpoint(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	if _, err := d.C.CreateSandbox(harness.Ctx(t), api.CreateSandbox{Name: "busy"}); err != nil {
		t.Fatal(err)
	}
	m := startMCP(t, d, "--checkpoint-before=write", "--checkpoint-memory")
	done := make(chan *sdk.CallToolResult, 1)
	go func() {
		res, err := m.cs.CallTool(mcpCtx(t), &sdk.CallToolParams{Name: "run_command",
			Arguments: map[string]any{"sandbox": "busy", "command": "echo before; sleep 3; echo after; exit 7"}})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	waitFor(t, func() bool { return strings.Contains(d.Run("busy", "ps"), "sleep 3") })
	var wrote imcp.FileOutput
	m.ok(t, "write_file", map[string]any{"sandbox": "busy", "path": "/home/loam/mid", "content": "x"}, &wrote)
	if cp := checkpointByID(t, d, "busy", wrote.Checkpoint); !cp.Memory {
		t.Fatalf("want a memory checkpoint: %+v", cp)
	}
	res := <-done
	if res == nil {
		return
	}
	var run imcp.RunOutput
	b, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(b, &run)
	if res.IsError || run.ExitCode != 7 || run.Stdout != "before\nafter\n" {
		t.Errorf("run_command through a memory checkpoint: error=%v %s", res.IsError, resultText(res))
	}
}

// TestMCPHTTP serves `loam mcp --listen` and checks that it wants the
// daemon's token.
func TestMCPHTTP(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx, cancel := context.WithCancel(harness.Ctx(t))
	defer cancel()
	cmd := exec.CommandContext(ctx, harness.LoamBin, "mcp", "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "LOAM_API_URL="+d.URL, "LOAM_TOKEN="+d.Token)
	log := &harness.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = io.Discard, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cancel()
			_ = cmd.Wait()
		}
	})
	endpoint := mcpEndpoint(t, log, "http")

	for _, tc := range []struct{ name, header string }{
		{"no token", ""},
		{"wrong token", "Bearer loam_wrong"},
		{"token not as bearer", d.Token},
	} {
		req, _ := http.NewRequest("POST", endpoint, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"0"}}}`))
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
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: status %d; want 401", tc.name, resp.StatusCode)
		}
	}

	hc := &http.Client{Transport: bearerTransport{d.Token}}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "loam-test", Version: "0"}, nil).
		Connect(ctx, &sdk.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connecting with the token: %v\n%s", err, log)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "create_sandbox", Arguments: map[string]any{"name": "over-http"}})
	if err != nil || res.IsError {
		t.Fatalf("create_sandbox over HTTP: %v %s", err, resultText(res))
	}
	res, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_command", Arguments: map[string]any{"sandbox": "over-http", "command": "echo over http"}})
	if err != nil || res.IsError || !strings.Contains(resultText(res), "over http") {
		t.Fatalf("run_command over HTTP: %v %s", err, resultText(res))
	}
	// The log comes through a pipe: give it a moment.
	waitFor(t, func() bool { return strings.Contains(log.String(), `msg="tool call" tool=run_command`) })

	// SIGTERM shuts the server down cleanly.
	cs.Close()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("loam mcp --listen after SIGTERM: %v\n%s", err, log)
	}
}

// bearerTransport sends the loam token with every request.
type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpEndpoint waits for loam mcp --listen to log the URL it serves at, of
// scheme (http or https), and returns it.
func mcpEndpoint(t *testing.T, log *harness.SyncBuffer, scheme string) string {
	t.Helper()
	urlRE := regexp.MustCompile(`url=(` + scheme + `://\S+/mcp)`)
	var endpoint string
	waitFor(t, func() bool {
		if m := urlRE.FindStringSubmatch(log.String()); m != nil {
			endpoint = m[1]
			return true
		}
		return false
	})
	return endpoint
}

// TestMCPWithKeys: loam mcp works with any API key, within its scope,
// labels and org: a read key lists but cannot run or make; a key limited
// by labels makes sandboxes with them and sees only those; a key of
// another org finds none of this one's.
func TestMCPWithKeys(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "theirs"}); err != nil {
		t.Fatal(err)
	}
	reader := startMCPAs(t, d, makeKey(t, d, `{"name":"mcp-reader","scope":"read"}`).Secret)
	var list imcp.ListSandboxesOutput
	reader.ok(t, "list_sandboxes", nil, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].Name != "theirs" {
		t.Errorf("list_sandboxes with a read key: %+v", list)
	}
	reader.fails(t, "run_command", map[string]any{"sandbox": "theirs", "command": "true"}, "needs a key of scope write")
	reader.fails(t, "create_sandbox", map[string]any{"name": "mine"}, "needs a key of scope write")

	agent := startMCPAs(t, d, makeKey(t, d, `{"name":"mcp-agent","labels":{"owner":"agent"}}`).Secret)
	var created imcp.SandboxOutput
	agent.ok(t, "create_sandbox", map[string]any{"name": "mine"}, &created)
	if created.Sandbox.Labels["owner"] != "agent" {
		t.Errorf("a sandbox the agent's key made over MCP: labels %v, want owner=agent", created.Sandbox.Labels)
	}
	var run imcp.RunOutput
	agent.ok(t, "run_command", map[string]any{"sandbox": "mine", "command": "echo hi"}, &run)
	if run.Stdout != "hi\n" {
		t.Errorf("run_command in its own sandbox: %+v", run)
	}
	agent.fails(t, "run_command", map[string]any{"sandbox": "theirs", "command": "true"}, "not found")
	agent.ok(t, "list_sandboxes", nil, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].Name != "mine" {
		t.Errorf("list_sandboxes with the agent's key: %+v", list)
	}

	op := client.New(d.URL, d.Token)
	if _, err := op.CreateOrg(ctx, "elsewhere"); err != nil {
		t.Fatal(err)
	}
	k, err := op.CreateOrgKey(ctx, "elsewhere", api.CreateKey{Name: "elsewhere-admin", Scope: api.ScopeAdmin})
	if err != nil {
		t.Fatal(err)
	}
	other := startMCPAs(t, d, k.Secret)
	other.ok(t, "list_sandboxes", nil, &list)
	if len(list.Sandboxes) != 0 {
		t.Errorf("list_sandboxes with a key of another org: %+v", list)
	}
	for tool, args := range map[string]map[string]any{
		"run_command":      {"sandbox": "theirs", "command": "true"},
		"delete_sandbox":   {"sandbox": "theirs"},
		"list_checkpoints": {"sandbox": "theirs"},
		"read_file":        {"sandbox": "theirs", "path": "/etc/hostname"},
	} {
		other.fails(t, tool, args, `"theirs" not found`)
	}
	if sb, err := d.C.GetSandbox(ctx, "theirs"); err != nil || sb.State != api.StateRunning {
		t.Errorf("theirs after the other org's calls: %+v, %v", sb, err)
	}
}
