package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
)

// The docs' checkpoint walk-through, command by command.
func TestCheckpointWalkthrough(t *testing.T) {
	f, srv := newFakeAPI(t)
	steps := []struct {
		args       []string
		wantStdout string
	}{
		{[]string{"checkpoint", "create", "scratch", "--comment", "site up, state v1"}, "v1\n"},
		{[]string{"checkpoint", "create", "scratch", "--comment", "disk only", "--disk-only"}, "v2\n"},
		{[]string{"checkpoint", "ls", "scratch"}, "" +
			"ID  KIND    AUTO  CREATED              COMMENT\n" +
			"v1  memory  no    2026-10-12 05:17:36  site up, state v1\n" +
			"v2  disk    no    2026-10-12 05:17:37  disk only\n"},
		{[]string{"checkpoint", "restore", "scratch", "v1", "-y"}, "scratch\trunning\n"},
		{[]string{"checkpoint", "ls", "scratch"}, "" +
			"ID      KIND    AUTO  CREATED              COMMENT\n" +
			"v1      memory  no    2026-10-12 05:17:36  site up, state v1\n" +
			"v2      disk    no    2026-10-12 05:17:37  disk only\n" +
			"auto-1  memory  yes   2026-10-12 05:17:38  before restoring v1\n"},
		{[]string{"checkpoint", "rm", "scratch", "auto-1", "--yes"}, ""},
		{[]string{"fork", "scratch", "v1", "scratch-copy"}, "" +
			"name:        scratch-copy\n" +
			"id:          sb-000000000001\n" +
			"state:       running\n" +
			"url:         https://scratch-copy--docs.loam.example.com\n" +
			"access:      private\n" +
			"template:    base\n" +
			"cpus:        1\n" +
			"memory:      512Mi\n" +
			"disk:        4Gi\n" +
			"idle:        -\n" +
			"http_port:   -\n" +
			"env:         -\n" +
			"labels:      -\n" +
			"from:        scratch/v1\n" +
			"created:     2026-10-12 05:18:36\n"},
	}
	for _, s := range steps {
		r := runCLI(t, srv, "", false, nil, s.args...)
		if r.code != 0 || r.stderr != "" || r.stdout != s.wantStdout {
			t.Fatalf("loam %s: exit %d, stderr %q, stdout:\n%s\nwant:\n%s",
				strings.Join(s.args, " "), r.code, r.stderr, r.stdout, s.wantStdout)
		}
	}
	if want := `{"name":"scratch-copy","from":{"sandbox":"scratch","checkpoint":"v1"}}`; string(f.lastBody) != want {
		t.Errorf("fork sent %s, want %s", f.lastBody, want)
	}
}

// TestForkCount: loam fork --count prints a line for each fork, its
// sandbox or why it was not made, and exits 1 saying how many were not.
func TestForkCount(t *testing.T) {
	f, srv := newFakeAPI(t)
	if r := runCLI(t, srv, "", false, nil, "create", "worker-2"); r.code != 0 {
		t.Fatalf("create worker-2: exit %d: %s", r.code, r.stderr)
	}
	r := runCLI(t, srv, "", false, nil, "fork", "scratch", "v1", "worker", "--count", "3", "--label", "owner=docs")
	want := "" +
		"NAME      ID               NODE  STATE\n" +
		"worker-1  sb-000000000002  -     running\n" +
		"worker-2  -                -     failed: a sandbox named worker-2 exists\n" +
		"worker-3  sb-000000000003  -     running\n"
	if r.code != 1 || r.stdout != want || r.stderr != "loam: 1 of 3 forks were not made\n" {
		t.Errorf("fork --count 3 with worker-2 taken: exit %d, stderr %q, stdout:\n%s\nwant exit 1 and:\n%s", r.code, r.stderr, r.stdout, want)
	}
	if want := `{"name":"worker","labels":{"owner":"docs"},"from":{"sandbox":"scratch","checkpoint":"v1"},"count":3}`; string(f.lastBody) != want {
		t.Errorf("fork --count sent %s, want %s", f.lastBody, want)
	}

	r = runCLI(t, srv, "", false, nil, "fork", "scratch", "v1", "--count", "1", "--json")
	var list api.ForkList
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || r.code != 0 || len(list.Forks) != 1 || list.Forks[0].Sandbox == nil {
		t.Errorf("fork --count 1 --json: exit %d, stderr %q, stdout %s (%v)", r.code, r.stderr, r.stdout, err)
	}

	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"fork", "nope", "v1", "x", "--count", "2"}, "loam: sandbox nope not found\n"},
		{[]string{"fork", "scratch", "v1", "worker", "--count", "1"}, "loam: a sandbox named worker-1 exists\n"},
		{[]string{"fork", "scratch", "v1", "x", "--count", "0"}, "loam: count: 0; a create makes 1 to 64 forks at once\n"},
	} {
		r := runCLI(t, srv, "", false, nil, tc.args...)
		if r.code != 1 || r.stdout != "" || r.stderr != tc.stderr {
			t.Errorf("loam %s: exit %d, stdout %q, stderr %q; want exit 1, stderr %q", strings.Join(tc.args, " "), r.code, r.stdout, r.stderr, tc.stderr)
		}
	}
}

func TestCheckpointCreateBodies(t *testing.T) {
	f, srv := newFakeAPI(t)
	tests := []struct {
		args []string
		env  map[string]string
		body string
	}{
		{[]string{"checkpoint", "create", "scratch"}, nil, `{}`},
		{[]string{"checkpoint", "create", "scratch", "--disk-only", "--name", "clean"}, nil, `{"memory":false,"name":"clean"}`},
		{[]string{"checkpoint", "create", "--comment", "inside"}, map[string]string{"LOAM_SANDBOX": "sb-2kjiso7vff5b"}, `{"comment":"inside"}`},
	}
	for _, tt := range tests {
		r := runCLI(t, srv, "", false, tt.env, tt.args...)
		if r.code != 0 {
			t.Fatalf("loam %s: exit %d: %s", strings.Join(tt.args, " "), r.code, r.stderr)
		}
		if string(f.lastBody) != tt.body {
			t.Errorf("loam %s sent %s, want %s", strings.Join(tt.args, " "), f.lastBody, tt.body)
		}
	}
	r := runCLI(t, srv, "", false, nil, "checkpoint", "create")
	if r.code != 1 || r.stderr != "loam: no sandbox given\n" {
		t.Errorf("checkpoint create without a sandbox: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestCheckpointGet(t *testing.T) {
	_, srv := newFakeAPI(t)
	runCLI(t, srv, "", false, nil, "checkpoint", "create", "scratch", "--comment", "c")
	r := runCLI(t, srv, "", false, nil, "checkpoint", "get", "scratch", "v1")
	want := "id:          v1\nsandbox:     sb-2kjiso7vff5b\nkind:        memory\nauto:        no\ncreated:     2026-10-12 05:17:36\ncomment:     c\n"
	if r.code != 0 || r.stdout != want {
		t.Errorf("exit %d, stderr %q, stdout:\n%s", r.code, r.stderr, r.stdout)
	}
	r = runCLI(t, srv, "", false, nil, "checkpoint", "get", "scratch", "v1", "--json")
	var cp api.Checkpoint
	if err := json.Unmarshal([]byte(r.stdout), &cp); err != nil || cp.ID != "v1" || !cp.Memory {
		t.Errorf("--json: %v %+v", err, cp)
	}
}

func TestAPIErrors(t *testing.T) {
	_, srv := newFakeAPI(t)
	tests := []struct {
		args   []string
		stderr string
	}{
		{[]string{"get", "nope"}, "loam: sandbox nope not found\n"},
		{[]string{"checkpoint", "get", "scratch", "v9"}, "loam: checkpoint v9 of scratch not found\n"},
		{[]string{"checkpoint", "restore", "scratch", "v9", "-y"}, "loam: checkpoint v9 of scratch not found\n"},
		{[]string{"create", "scratch"}, "loam: a sandbox named scratch exists\n"},
		{[]string{"fork", "nope", "v1", "x"}, "loam: sandbox nope not found\n"},
		{[]string{"create", "x", "--memory", "lots"}, "loam: --memory: invalid size \"lots\": want MiB, or a size like 512Mi or 2Gi\n"},
		{[]string{"create", "x", "--env", "NOEQUALS"}, "loam: invalid --env \"NOEQUALS\": want KEY=VALUE\n"},
		{[]string{"get"}, "loam: accepts 1 arg(s), received 0\n"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := runCLI(t, srv, "", false, nil, tt.args...)
			if r.code != 1 || r.stderr != tt.stderr || r.stdout != "" {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 1, stderr %q", r.code, r.stdout, r.stderr, tt.stderr)
			}
		})
	}
}

func TestCreate(t *testing.T) {
	f, srv := newFakeAPI(t)
	r := runCLI(t, srv, "", false, nil, "create", "web", "--template", "base", "-e", "A=1", "--env", "B=x,y",
		"--label", "owner=docs", "--cpus", "0.5", "--memory", "1Gi", "--disk", "8G", "--idle", "10m", "--http-port", "8080")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var req api.CreateSandbox
	if err := json.Unmarshal(f.lastBody, &req); err != nil {
		t.Fatal(err)
	}
	if req.Name != "web" || req.Template != "base" || req.Env["A"] != "1" || req.Env["B"] != "x,y" ||
		req.Labels["owner"] != "docs" || req.Idle != "10m" || req.HTTPPort != 8080 ||
		req.Resources == nil || *req.Resources != (api.Resources{CPUs: 0.5, MemoryMiB: 1024, DiskMiB: 8192}) {
		t.Errorf("request = %s", f.lastBody)
	}
	if !strings.HasPrefix(r.stdout, "name:        web\nid:          sb-000000000001\n") ||
		!strings.Contains(r.stdout, "\nmemory:      1Gi\n") || !strings.Contains(r.stdout, "\nenv:         A=1,B=x,y\n") {
		t.Errorf("stdout:\n%s", r.stdout)
	}

	// Without resource flags the daemon's defaults apply: none are sent.
	r = runCLI(t, srv, "", false, nil, "create", "--json")
	if r.code != 0 || string(f.lastBody) != `{}` {
		t.Errorf("exit %d, body %s", r.code, f.lastBody)
	}
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil || sb.Name != "brave-otter" {
		t.Errorf("--json: %v, %q", err, r.stdout)
	}
}

func TestLsAndGet(t *testing.T) {
	f, srv := newFakeAPI(t)
	runCLI(t, srv, "", false, nil, "create", "other", "--image", "python:3.13", "--label", "owner=ops")
	r := runCLI(t, srv, "", false, nil, "ls")
	want := "" +
		"NAME     ID               STATE    TEMPLATE     CREATED\n" +
		"scratch  sb-2kjiso7vff5b  running  base         2026-10-12 05:17:36\n" +
		"other    sb-000000000001  running  python:3.13  2026-10-12 05:18:36\n"
	if r.code != 0 || r.stdout != want {
		t.Errorf("ls: exit %d, stderr %q, stdout:\n%s\nwant:\n%s", r.code, r.stderr, r.stdout, want)
	}

	r = runCLI(t, srv, "", false, nil, "ls", "--label", "owner=ops", "--json")
	var sbs []api.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &sbs); err != nil || len(sbs) != 1 || sbs[0].Name != "other" {
		t.Errorf("ls --label --json: %v, %s", err, r.stdout)
	}
	if f.lastQuery != "label=owner%3Dops" {
		t.Errorf("query = %q", f.lastQuery)
	}
	r = runCLI(t, srv, "", false, nil, "ls", "--label", "owner=nobody", "--json")
	if strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("empty ls --json = %q, want []", r.stdout)
	}

	r = runCLI(t, srv, "", false, nil, "get", "scratch")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "name:        scratch\nid:          sb-2kjiso7vff5b\nstate:       running\nurl:         https://scratch--docs.loam.example.com\n") {
		t.Errorf("get: exit %d, stdout:\n%s", r.code, r.stdout)
	}
}

func TestTemplates(t *testing.T) {
	_, srv := newFakeAPI(t)
	r := runCLI(t, srv, "", false, nil, "templates")
	want := "" +
		"NAME  DEFAULT  READY  KIND               STATE    SIZE   USES  DESCRIPTION\n" +
		"base  yes      yes    builtin            ready    -      2     Debian with Python and Node\n" +
		"go    no       no     builtin            pending  -      0\n" +
		"warm  no       yes    checkpoint+memory  ready    268Mi  1     memory and disk of checkpoint scratch/v1\n"
	if r.code != 0 || r.stdout != want {
		t.Errorf("exit %d, stdout:\n%q\nwant:\n%q", r.code, r.stdout, want)
	}
}

// Destructive commands ask on a terminal, and refuse without one unless -y.
func TestConfirmation(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		interactive bool
		answer      string
		wantCode    int
		wantStderr  string
		wantDeleted bool
	}{
		{"yes flag", []string{"rm", "scratch", "-y"}, false, "", 0, "", true},
		{"no terminal", []string{"rm", "scratch"}, false, "y\n", 1,
			"loam: cannot ask to confirm (not a terminal): pass --yes to delete sandbox scratch\n", false},
		{"answer y", []string{"rm", "scratch"}, true, "y\n", 0, "Delete sandbox scratch? [y/N] ", true},
		{"answer YES", []string{"rm", "scratch"}, true, "YES\n", 0, "Delete sandbox scratch? [y/N] ", true},
		{"answer n", []string{"rm", "scratch"}, true, "n\n", 1, "Delete sandbox scratch? [y/N] loam: cancelled\n", false},
		{"answer empty", []string{"rm", "scratch"}, true, "\n", 1, "Delete sandbox scratch? [y/N] loam: cancelled\n", false},
		{"end of input", []string{"rm", "scratch"}, true, "", 1, "Delete sandbox scratch? [y/N] \nloam: cancelled\n", false},
		{"restore no terminal", []string{"checkpoint", "restore", "scratch", "v1"}, false, "", 1,
			"loam: cannot ask to confirm (not a terminal): pass --yes to restore scratch to checkpoint v1\n", false},
		{"restore asks", []string{"checkpoint", "restore", "scratch", "v1"}, true, "y\n", 0,
			"Restore scratch to checkpoint v1? [y/N] ", false},
		{"checkpoint rm asks", []string{"checkpoint", "rm", "scratch", "v1"}, true, "n\n", 1,
			"Delete checkpoint v1 of scratch? [y/N] loam: cancelled\n", false},
		{"checkpoint rm no terminal", []string{"checkpoint", "rm", "scratch", "v1"}, false, "", 1,
			"loam: cannot ask to confirm (not a terminal): pass --yes to delete checkpoint v1 of scratch\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, srv := newFakeAPI(t)
			runCLI(t, srv, "", false, nil, "checkpoint", "create", "scratch")
			r := runCLI(t, srv, tt.answer, tt.interactive, nil, tt.args...)
			if r.code != tt.wantCode || r.stderr != tt.wantStderr {
				t.Errorf("exit %d, stderr %q; want exit %d, stderr %q", r.code, r.stderr, tt.wantCode, tt.wantStderr)
			}
			if deleted := f.find("scratch") == nil; deleted != tt.wantDeleted {
				t.Errorf("deleted = %v, want %v", deleted, tt.wantDeleted)
			}
		})
	}
}

func TestRmSeveral(t *testing.T) {
	f, srv := newFakeAPI(t)
	runCLI(t, srv, "", false, nil, "create", "a")
	r := runCLI(t, srv, "", false, nil, "rm", "-y", "a", "nope", "scratch")
	if r.code != 1 || r.stderr != "loam: sandbox nope not found\n" || r.stdout != "" {
		t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if len(f.sandboxes) != 0 {
		t.Errorf("%d sandboxes left, want 0", len(f.sandboxes))
	}
	r = runCLI(t, srv, "y\n", true, nil, "rm", "b", "c")
	if !strings.HasPrefix(r.stderr, "Delete sandboxes b, c? [y/N] ") {
		t.Errorf("stderr %q", r.stderr)
	}
}

func TestRun(t *testing.T) {
	tests := []struct {
		name               string
		args               []string
		stdin              string
		wantCode           int
		wantOut, wantErr   string
		wantCmd            []string
		wantStdinRequested bool
	}{
		{"echo", []string{"run", "scratch", "--", "echo", "-n", "hi"}, "", 0, "-n hi\n", "", []string{"echo", "-n", "hi"}, true},
		{"no dash", []string{"run", "scratch", "echo", "hi"}, "", 0, "hi\n", "", []string{"echo", "hi"}, true},
		{"stdin", []string{"run", "scratch", "--", "cat"}, "from stdin\n", 0, "from stdin\n", "", []string{"cat"}, true},
		{"stderr", []string{"run", "scratch", "--", "warn"}, "", 0, "", "careful\n", []string{"warn"}, true},
		{"exit status", []string{"run", "scratch", "--", "exit", "3"}, "", 3, "", "", []string{"exit", "3"}, true},
		{"not found", []string{"run", "scratch", "--", "nope"}, "", 127, "", "loam: nope: command not found\n", []string{"nope"}, true},
		{"not started", []string{"run", "scratch", "--", "forbidden"}, "", 126, "", "loam: /etc: permission denied\n", []string{"forbidden"}, true},
		{"no sandbox", []string{"run", "nope", "--", "echo"}, "", 1, "", "loam: sandbox nope not found\n", nil, false},
		{"checkpointed", []string{"run", "scratch", "--", "checkpointed"}, "", 1, "partial\n",
			"loam: exec stream ended before the command exited: the sandbox was checkpointed or restored\n", []string{"checkpointed"}, true},
		{"no command", []string{"run", "scratch"}, "", 1, "", "loam: no command given: put it after \"--\"\n", nil, false},
		{"flag in command", []string{"run", "scratch", "ls", "-la"}, "", 1, "",
			"loam: unknown shorthand flag: 'l' in -la (put the command after \"--\": loam run SANDBOX -- CMD [ARG...])\n", nil, false},
		{"nothing", []string{"run"}, "", 1, "", "loam: no sandbox given\n", nil, false},
		{"two sandboxes", []string{"run", "a", "b", "--", "echo"}, "", 1, "", "loam: run takes one sandbox before \"--\", not a b\n", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, srv := newFakeAPI(t)
			r := runCLI(t, srv, tt.stdin, false, nil, tt.args...)
			if r.code != tt.wantCode || r.stdout != tt.wantOut || r.stderr != tt.wantErr {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, %q, %q", r.code, r.stdout, r.stderr, tt.wantCode, tt.wantOut, tt.wantErr)
			}
			if tt.wantCmd == nil {
				if len(f.execs) != 0 {
					t.Errorf("execs = %+v, want none", f.execs)
				}
				return
			}
			if len(f.execs) != 1 || strings.Join(f.execs[0].Cmd, " ") != strings.Join(tt.wantCmd, " ") || f.execs[0].Stdin != tt.wantStdinRequested {
				t.Errorf("execs = %+v, want cmd %q", f.execs, tt.wantCmd)
			}
		})
	}
}

func TestRunOptions(t *testing.T) {
	f, srv := newFakeAPI(t)
	r := runCLI(t, srv, "", false, nil, "run", "scratch", "-e", "A=1", "-w", "/tmp", "-u", "root", "--", "echo", "-e", "x")
	if r.code != 0 || r.stdout != "-e x\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	got := f.execs[0]
	if got.Env["A"] != "1" || got.Dir != "/tmp" || got.User != "root" || got.TTY {
		t.Errorf("request = %+v", got)
	}
	r = runCLI(t, srv, "", false, nil, "run", "-t", "scratch", "--", "bash")
	if r.code != 0 || !f.execs[1].TTY {
		t.Errorf("-t: exit %d, request %+v", r.code, f.execs[1])
	}
}

func TestExtraCommands(t *testing.T) {
	root := NewRoot(&cobra.Command{Use: "serve", Short: "Run the daemon"})
	if c, _, err := root.Find([]string{"serve"}); err != nil || c.Name() != "serve" {
		t.Errorf("serve not added: %v", err)
	}
	for _, name := range []string{"create", "ls", "get", "rm", "run", "templates", "checkpoint", "fork"} {
		if c, _, err := root.Find([]string{name}); err != nil || c.Name() != name {
			t.Errorf("%s missing: %v", name, err)
		}
	}
}
