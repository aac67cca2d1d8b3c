package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// TestSandboxLifecycle drives the core through the Go client: create, run
// with stdout, stderr, stdin and exit codes, env and labels, isolation of
// two sandboxes, and delete freeing everything.
func TestSandboxLifecycle(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	c := d.C

	a, err := c.CreateSandbox(ctx, api.CreateSandbox{
		// BIG: an env larger than the agent's old 8 KiB identity limit.
		Name: "alpha", Env: map[string]string{"GREETING": "hello", "BIG": strings.Repeat("x", 100000)},
		Labels: map[string]string{"team": "red"}, HTTPPort: 8080,
		Resources: &api.Resources{MemoryMiB: 256, CPUs: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(a.ID, "sb-") || len(a.ID) != 15 || a.State != api.StateRunning || a.Name != "alpha" {
		t.Fatalf("created %+v", a)
	}
	if a.URL != "http://alpha--default.localhost:7070" {
		t.Errorf("url %q", a.URL)
	}
	if a.Resources.MemoryMiB != 256 || a.Template != "busybox" {
		t.Errorf("resources/template %+v %q", a.Resources, a.Template)
	}

	t.Run("big env", func(t *testing.T) {
		if out := d.Run("alpha", "sh", "-c", "echo ${#BIG}"); out != "100000\n" {
			t.Errorf("BIG has %q characters", out)
		}
	})
	t.Run("stdout stderr exit", func(t *testing.T) {
		var out, errb bytes.Buffer
		code, err := c.Exec(ctx, "alpha", client.ExecOptions{
			Cmd:    []string{"sh", "-c", "echo out; echo err >&2; exit 3"},
			Stdout: &out, Stderr: &errb,
		})
		if err != nil || code != 3 || out.String() != "out\n" || errb.String() != "err\n" {
			t.Fatalf("code %d err %v out %q stderr %q", code, err, out.String(), errb.String())
		}
	})
	t.Run("stdin", func(t *testing.T) {
		var out bytes.Buffer
		code, err := c.Exec(ctx, a.ID, client.ExecOptions{
			Cmd: []string{"sh", "-c", "tr a-z A-Z; echo done"}, Stdin: strings.NewReader("piped in\n"), Stdout: &out,
		})
		if err != nil || code != 0 || out.String() != "PIPED IN\ndone\n" {
			t.Fatalf("code %d err %v out %q", code, err, out.String())
		}
	})
	t.Run("hostname", func(t *testing.T) {
		got := d.Run("alpha", "sh", "-c", "hostname; cat /etc/hostname; grep -c alpha /etc/hosts; grep -c '^nameserver 169.254.53.53$' /etc/resolv.conf || true")
		if got != "alpha\nalpha\n1\n1\n" { // resolv.conf names the daemon's resolver
			t.Fatalf("got %q", got)
		}
	})
	t.Run("user env dir", func(t *testing.T) {
		got := d.Run("alpha", "sh", "-c", `echo "$(id -u) $HOME $GREETING $(pwd)"`)
		if got != "1000 /home/loam hello /home/loam\n" {
			t.Fatalf("got %q", got)
		}
		var out bytes.Buffer
		code, err := c.Exec(ctx, "alpha", client.ExecOptions{
			Cmd: []string{"sh", "-c", `echo "$(id -u) $GREETING $(pwd)"`}, User: "root", Dir: "/tmp",
			Env: map[string]string{"GREETING": "override"}, Stdout: &out,
		})
		if err != nil || code != 0 || out.String() != "0 override /tmp\n" {
			t.Fatalf("code %d err %v out %q", code, err, out.String())
		}
	})
	t.Run("not found", func(t *testing.T) {
		_, err := c.Exec(ctx, "alpha", client.ExecOptions{Cmd: []string{"no-such-command"}})
		if !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("tty", func(t *testing.T) {
		var out bytes.Buffer
		code, err := c.Exec(ctx, "alpha", client.ExecOptions{
			Cmd: []string{"sh", "-c", "tty; stty size; echo e >&2"}, TTY: true, Rows: 33, Cols: 101, Stdout: &out,
		})
		got := strings.ReplaceAll(out.String(), "\r", "")
		if err != nil || code != 0 || !strings.HasPrefix(got, "/dev/pts/") || !strings.Contains(got, "33 101\ne\n") {
			t.Fatalf("code %d err %v out %q", code, err, got)
		}
	})
	t.Run("detached process survives", func(t *testing.T) {
		// nohup's way (busybox has no nohup): ignore SIGHUP, then run on.
		d.Run("alpha", "sh", "-c", "(trap '' HUP; exec sleep 1000) >/dev/null 2>&1 &")
		d.Run("alpha", "sh", "-c", "setsid sleep 1001 >/dev/null 2>&1 < /dev/null &")
		both := func() error {
			ps := d.Run("alpha", "ps")
			if strings.Contains(ps, "sleep 1000") && strings.Contains(ps, "sleep 1001") {
				return nil
			}
			return fmt.Errorf("ps:\n%s", ps)
		}
		// Their shells have exited (the execs returned); the sleeps are
		// seen once they run, and are still there an exec later.
		harness.Eventually(t, 20*time.Second, "the detached sleeps run", both)
		if both() != nil {
			t.Fatalf("detached sleeps gone:\n%s", d.Run("alpha", "ps"))
		}
	})
	t.Run("hang up on close", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			c.Exec(cctx, "alpha", client.ExecOptions{Cmd: []string{"sleep", "2000"}})
			close(done)
		}()
		waitFor(t, func() bool { return strings.Contains(d.Run("alpha", "ps"), "sleep 2000") })
		cancel()
		<-done
		waitFor(t, func() bool { return !strings.Contains(d.Run("alpha", "ps"), "sleep 2000") })
	})

	b, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "beta", Labels: map[string]string{"team": "blue"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("isolation", func(t *testing.T) {
		d.Run("alpha", "sh", "-c", "echo secret > /home/loam/mine; sleep 3000 >/dev/null 2>&1 &")
		if out := d.Run("beta", "sh", "-c", "ls /home/loam; ps"); strings.Contains(out, "mine") || strings.Contains(out, "sleep 3000") {
			t.Fatalf("beta sees alpha's things:\n%s", out)
		}
	})
	t.Run("labels filter", func(t *testing.T) {
		red, err := c.ListSandboxes(ctx, client.ListOptions{Labels: map[string]string{"team": "red"}})
		if err != nil || len(red) != 1 || red[0].Name != "alpha" {
			t.Fatalf("%v %+v", err, red)
		}
		all, err := c.ListSandboxes(ctx, client.ListOptions{})
		if err != nil || len(all) != 2 || all[0].Name != "alpha" || all[1].Name != "beta" {
			t.Fatalf("%v %+v", err, all)
		}
	})
	t.Run("delete frees everything", func(t *testing.T) {
		vol := filepath.Join(d.DataDir, "disk", "mnt", "volumes", b.ID)
		if _, err := os.Stat(vol); err != nil {
			t.Fatalf("volume of beta: %v", err)
		}
		if err := c.DeleteSandbox(ctx, "beta"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.GetSandbox(ctx, "beta"); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("get after delete: %v", err)
		}
		if _, err := os.Stat(vol); !os.IsNotExist(err) {
			t.Errorf("volume still there: %v", err)
		}
		if err := exec.Command("ip", "netns", "pids", "loam-"+b.ID).Run(); err == nil {
			t.Errorf("netns of beta still there")
		}
		out, _ := exec.Command(harness.Runsc(), "--root", filepath.Join(d.DataDir, "runsc"), "list", "-q").Output()
		if strings.Contains(string(out), b.ID) {
			t.Errorf("container of beta still there: %s", out)
		}
		if err := c.DeleteSandbox(ctx, "beta"); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("second delete: %v", err)
		}
	})
}

// pidOf finds the pid of the process whose command line is cmd, with ps
// (busybox has no pgrep).
func pidOf(t *testing.T, d *harness.Daemon, sb, cmd string) string {
	t.Helper()
	// A process just started in the background may not have exec'd its
	// command yet (ps shows setsid or sh for a moment): look again.
	var pid string
	harness.Eventually(t, 10*time.Second, fmt.Sprintf("process %q in %s", cmd, sb), func() error {
		out := d.Run(sb, "ps", "-o", "pid,args")
		for _, line := range strings.Split(out, "\n") {
			p, args, _ := strings.Cut(strings.TrimSpace(line), " ")
			if strings.TrimSpace(args) == cmd {
				pid = p
				return nil
			}
		}
		return fmt.Errorf("ps:\n%s", out)
	})
	return pid
}

// waitFor is harness.Eventually for a condition with nothing to say when
// it fails, within 20 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	harness.Eventually(t, 20*time.Second, "condition", func() error {
		if cond() {
			return nil
		}
		return errors.New("it does not hold")
	})
}

// TestAPIErrors checks auth and bad input, over plain HTTP as curl sends it.
func TestAPIErrors(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "taken"}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, method, path, token, body string
		status                          int
		code                            api.Code
		msg                             string
	}{
		{"no token", "GET", "/v1/sandboxes", "-", "", 401, api.CodeUnauthorized, "token"},
		{"wrong token", "GET", "/v1/sandboxes", "nope", "", 401, api.CodeUnauthorized, "token"},
		{"unknown field", "POST", "/v1/sandboxes", "", `{"name":"x","colour":"red"}`, 400, api.CodeInvalid, "colour"},
		{"bad name", "POST", "/v1/sandboxes", "", `{"name":"Bad_Name"}`, 400, api.CodeInvalid, "name"},
		{"name in use", "POST", "/v1/sandboxes", "", `{"name":"taken"}`, 409, api.CodeConflict, "in use"},
		{"bad json", "POST", "/v1/sandboxes", "", `{"name":`, 400, api.CodeInvalid, "JSON"},
		{"wrong type", "POST", "/v1/sandboxes", "", `{"name":"ok","http_port":"80"}`, 400, api.CodeInvalid, "http_port"},
		{"big body", "POST", "/v1/sandboxes", "", `{"name":"` + strings.Repeat("a", 2<<20) + `"}`, 400, api.CodeInvalid, "larger"},
		{"no template", "POST", "/v1/sandboxes", "", `{"name":"ok","template":"nope"}`, 400, api.CodeInvalid, "template"},
		{"bad memory", "POST", "/v1/sandboxes", "", `{"name":"ok","resources":{"memory_mib":1}}`, 400, api.CodeInvalid, "memory_mib"},
		{"bad env", "POST", "/v1/sandboxes", "", `{"name":"ok","env":{"1X":"y"}}`, 400, api.CodeInvalid, "env"},
		{"bad idle", "POST", "/v1/sandboxes", "", `{"name":"ok","idle":"soon"}`, 400, api.CodeInvalid, "idle"},
		{"missing", "GET", "/v1/sandboxes/nope", "", "", 404, api.CodeNotFound, "nope"},
		{"missing delete", "DELETE", "/v1/sandboxes/nope", "", "", 404, api.CodeNotFound, "nope"},
		{"bad label filter", "GET", "/v1/sandboxes?label=x", "", "", 400, api.CodeInvalid, "label"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, d.URL+tc.path, strings.NewReader(tc.body))
			switch tc.token {
			case "":
				req.Header.Set("Authorization", "Bearer "+d.Token)
			case "-":
			default:
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			var eb api.ErrorBody
			if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil {
				t.Fatalf("status %d body %q", resp.StatusCode, body)
			}
			if resp.StatusCode != tc.status || eb.Error.Code != tc.code || !strings.Contains(eb.Error.Message, tc.msg) {
				t.Fatalf("got %d %s %q", resp.StatusCode, eb.Error.Code, eb.Error.Message)
			}
		})
	}
	resp, err := http.Get(d.URL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", err, resp)
	}
	resp.Body.Close()
	if sbs, _ := d.C.ListSandboxes(ctx, client.ListOptions{}); len(sbs) != 1 {
		t.Errorf("bad requests left sandboxes behind: %+v", sbs)
	}
}

// TestDaemonRestart: a running sandbox stays running, and usable, when the
// daemon stops and starts again; its processes are the same ones.
func TestDaemonRestart(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "keeper"}); err != nil {
		t.Fatal(err)
	}
	d.Run("keeper", "sh", "-c", "echo kept > /home/loam/f; setsid sleep 4000 >/dev/null 2>&1 </dev/null &")
	before := pidOf(t, d, "keeper", "sleep 4000")
	d.Stop()
	d.Start()
	sb, err := d.C.GetSandbox(ctx, "keeper")
	if err != nil || sb.State != api.StateRunning {
		t.Fatalf("after restart: %v %+v", err, sb)
	}
	if got := d.Run("keeper", "cat", "/home/loam/f"); got != "kept\n" {
		t.Fatalf("after restart the file holds %q", got)
	}
	if after := pidOf(t, d, "keeper", "sleep 4000"); after != before {
		t.Fatalf("after restart the sleep is pid %q, before it was %q", after, before)
	}
}

// TestCLI runs the CLI as a user would.
func TestCLI(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	out, errOut, code := d.CLI("", "create", "scratch", "--env", "A=1", "--label", "k=v", "--memory", "256Mi")
	if code != 0 || !strings.Contains(out, "name:        scratch\n") || !strings.Contains(out, "state:       running\n") {
		t.Fatalf("create: %d %q %q", code, out, errOut)
	}
	out, _, code = d.CLI("", "run", "scratch", "--", "sh", "-c", "echo $A; cat; exit 7")
	if code != 7 || out != "1\n" {
		t.Fatalf("run: %d %q", code, out)
	}
	out, _, code = d.CLI("through stdin\n", "run", "scratch", "--", "cat")
	if code != 0 || out != "through stdin\n" {
		t.Fatalf("run with stdin: %d %q", code, out)
	}
	out, _, code = d.CLI("", "ls")
	if code != 0 || !strings.Contains(out, "scratch") || !strings.HasPrefix(out, "NAME") {
		t.Fatalf("ls: %d %q", code, out)
	}
	_, errOut, code = d.CLI("", "rm", "scratch")
	if code == 0 || !strings.Contains(errOut, "--yes") {
		t.Fatalf("rm without a terminal or -y: %d %q", code, errOut)
	}
	if _, errOut, code = d.CLI("", "rm", "-y", "scratch"); code != 0 {
		t.Fatalf("rm -y: %d %q", code, errOut)
	}
	_, errOut, code = d.CLI("", "get", "scratch")
	if code != 1 || !strings.Contains(errOut, "not found") {
		t.Fatalf("get after rm: %d %q", code, errOut)
	}
}

// TestSandboxUsage: GET and the list show a running sandbox's CPU time and
// memory from its cgroup; its CPU time grows while it computes; a sleeping
// sandbox shows none.
func TestSandboxUsage(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "busy", Resources: &api.Resources{MemoryMiB: 256}}); err != nil {
		t.Fatal(err)
	}
	before, err := d.C.GetSandbox(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	if before.Usage == nil {
		t.Fatal("a running sandbox shows no usage")
	}
	if before.Usage.MemoryBytes <= 0 || before.Usage.MemoryBytes > 1<<30 {
		t.Errorf("memory in use %d bytes, want some, under its 256 MiB and gVisor's own", before.Usage.MemoryBytes)
	}
	d.Run("busy", "sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done")
	list, err := d.C.ListSandboxes(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Usage == nil {
		t.Fatalf("the list shows %+v, want busy with its usage", list)
	}
	after := list[0].Usage
	t.Logf("usage: %.3f s CPU, %d MiB before; %.3f s CPU, %d MiB after a loop",
		before.Usage.CPUSeconds, before.Usage.MemoryBytes>>20, after.CPUSeconds, after.MemoryBytes>>20)
	if after.CPUSeconds <= before.Usage.CPUSeconds {
		t.Errorf("CPU time went from %.3f s to %.3f s over a busy loop", before.Usage.CPUSeconds, after.CPUSeconds)
	}
	out, errOut, code := d.CLI("", "get", "busy")
	if code != 0 || !regexp.MustCompile(`(?m)^memory: +[0-9.]+[KMG]i used of 256Mi$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^cpus: +[0-9.]+ \([0-9.]+s CPU time used\)$`).MatchString(out) {
		t.Errorf("loam get busy: %d %q %q; want the memory and CPU time in use", code, out, errOut)
	}
	if _, err := d.C.Sleep(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
	asleep, err := d.C.GetSandbox(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	if asleep.Usage != nil {
		t.Errorf("a sleeping sandbox shows usage %+v", asleep.Usage)
	}
}
