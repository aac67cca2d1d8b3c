package test

// End-to-end tests of the defects a review of the core found (issue 6): a
// second daemon on a data dir, a data dir reached by another path, the
// in-sandbox credential, a fork acting as its source, an interrupted
// restore, the data dir's modes and secrets, and limits after a crash.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/test/harness"
)

// runAs runs a command in a sandbox as user and returns its stdout, stderr
// and exit code.
func runAs(d *harness.Daemon, user, sb string, cmd ...string) (string, string, int) {
	d.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var o, e bytes.Buffer
	code, err := d.C.Exec(ctx, sb, client.ExecOptions{Cmd: cmd, User: user, Stdout: &o, Stderr: &e})
	if err != nil {
		d.T.Fatalf("run %v as %s in %s: %v", cmd, user, sb, err)
	}
	return o.String(), e.String(), code
}

// sandboxIP is the address of a sandbox's end of its network, from the
// handle the daemon keeps.
func sandboxIP(d *harness.Daemon, id string) string {
	d.T.Helper()
	b, err := os.ReadFile(filepath.Join(d.DataDir, "sandboxes", id, "handle.json"))
	if err != nil {
		d.T.Fatal(err)
	}
	var h struct {
		SandboxIP string `json:"sandbox_ip"`
	}
	if err := json.Unmarshal(b, &h); err != nil {
		d.T.Fatal(err)
	}
	return h.SandboxIP
}

// TestSecondDaemonOnADataDir: a second `loam serve` on a data dir in use
// fails at once, naming the first's pid, and touches nothing of it.
func TestSecondDaemonOnADataDir(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "first"}); err != nil {
		t.Fatal(err)
	}
	d.Run("first", "sh", "-c", "echo kept > /home/loam/f")
	// On another port, so that only the lock can stop it.
	cmd := exec.Command(harness.DaemonBin, "serve", "--listen", "127.0.0.1:0", "--data-dir", d.DataDir,
		"--subnet", d.Subnet, "--runsc", harness.Runsc(), "--default-template", "busybox",
		"--template-cache", harness.TemplateCache(), "--disk-size-gib", "8")
	cmd.Env = append(os.Environ(), "LOAM_TOKEN=")
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("a second daemon on the same data dir kept running:\n%s", out)
	}
	want := fmt.Sprintf("used by another loam daemon (pid %d)", d.Cmd.Process.Pid)
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("second daemon: %v\n%s\nwant an error saying %q", err, out, want)
	}
	sb, err := d.C.GetSandbox(ctx, "first")
	if err != nil || sb.State != api.StateRunning {
		t.Fatalf("the first daemon's sandbox after the second daemon: %v %+v", err, sb)
	}
	if got := d.Run("first", "cat", "/home/loam/f"); got != "kept\n" {
		t.Errorf("file %q", got)
	}
	if _, err := d.C.CreateCheckpoint(ctx, "first", api.CreateCheckpoint{}); err != nil {
		t.Errorf("checkpoint after the second daemon: %v", err)
	}

	// A daemon on a data dir of its own but the first's port fails on the
	// port before it opens or recovers anything there.
	other := t.TempDir()
	port := strings.TrimPrefix(d.URL, "http://")
	out, err = exec.Command(harness.DaemonBin, "serve", "--listen", port, "--data-dir", other,
		"--subnet", harness.Subnet(251), "--runsc", harness.Runsc(), "--default-template", "busybox",
		"--template-cache", harness.TemplateCache(), "--disk-size-gib", "8").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "listening on "+port) {
		t.Errorf("a daemon on a taken port: %v\n%s", err, out)
	}
	for _, name := range []string{"loam.db", "disk", "sandboxes"} {
		if _, err := os.Stat(filepath.Join(other, name)); err == nil {
			t.Errorf("a daemon that could not listen made %s", name)
		}
	}
}

// TestDataDirThroughAnotherPath: a daemon started on its data dir through a
// symlink, then on the real path once the link is gone, keeps every
// checkpoint, and they restore; so does one whose data dir was moved while
// the host was down (its containers gone, its disk unmounted).
func TestDataDirThroughAnotherPath(t *testing.T) {
	t.Parallel()
	real, err := os.MkdirTemp("", "loam-e2e-moved-")
	if err != nil {
		t.Fatal(err)
	}
	link := real + ".link"
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(link)
	d := &harness.Daemon{T: t, DataDir: link, Subnet: harness.NextSubnet()}
	d.Start()
	t.Cleanup(func() { d.DataDir = real; d.Destroy() })
	d.DataDir = link
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "mover"}); err != nil {
		t.Fatal(err)
	}
	d.Run("mover", "sh", "-c", "echo one > /home/loam/f")
	mustCheckpoint(t, d, "mover", true)
	mustCheckpoint(t, d, "mover", false)
	d.Stop()
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	d.DataDir = real
	d.Start()
	cps, err := d.C.ListCheckpoints(ctx, "mover")
	if err != nil || len(cps) != 2 {
		t.Fatalf("checkpoints after the data dir moved: %v %+v\n%s", err, cps, d.Log.String())
	}
	restoreBoth := func(when string) {
		d.Run("mover", "sh", "-c", "echo two > /home/loam/f")
		for _, id := range []string{"v1", "v2"} {
			if _, err := d.C.RestoreCheckpoint(ctx, "mover", id); err != nil {
				t.Fatalf("%s: restoring %s: %v", when, id, err)
			}
			if got := d.Run("mover", "cat", "/home/loam/f"); got != "one\n" {
				t.Errorf("%s: after restoring %s: %q", when, id, got)
			}
		}
	}
	restoreBoth("through the real path")

	// The host goes down; the data dir moves.
	d.Stop()
	harness.DeleteContainers(filepath.Join(d.DataDir, "runsc"))
	harness.UnmountUnder(d.DataDir)
	moved := real + ".moved"
	if err := os.Rename(real, moved); err != nil {
		t.Fatal(err)
	}
	real = moved
	d.DataDir = moved
	d.Start()
	cps, err = d.C.ListCheckpoints(ctx, "mover")
	if err != nil || len(cps) != 4 { // v1, v2 and the autos of the two restores
		t.Fatalf("checkpoints after the data dir moved: %v %+v\n%s", err, cps, d.Log.String())
	}
	if got, err := d.C.GetSandbox(ctx, "mover"); err != nil || got.State != api.StateRunning {
		t.Fatalf("after the move: %v %+v", err, got)
	}
	restoreBoth("after the move")
}

func mustCheckpoint(t *testing.T, d *harness.Daemon, sb string, memory bool) *api.Checkpoint {
	t.Helper()
	cp, err := d.C.CreateCheckpoint(harness.Ctx(t), sb, api.CreateCheckpoint{Memory: &memory})
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// TestInsideCredential: the in-sandbox token is root's; the sandbox's user
// reaches its API through the agent, other users not at all; from inside,
// only checkpoints taken from inside can be deleted, never the owner's nor
// an automatic one.
func TestInsideCredential(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "guard"}); err != nil {
		t.Fatal(err)
	}
	owners := mustCheckpoint(t, d, "guard", false)
	if _, err := d.C.RestoreCheckpoint(ctx, "guard", owners.ID); err != nil { // makes auto-1
		t.Fatal(err)
	}
	if out, _, _ := runAs(d, "root", "guard", "stat", "-c", "%a %u", "/var/lib/loam/token"); out != "600 0\n" {
		t.Errorf("token file mode and owner %q, want 600 0", out)
	}
	if _, _, code := runAs(d, "loam", "guard", "cat", "/var/lib/loam/token"); code == 0 {
		t.Error("the sandbox's user can read the token")
	}
	if out, errOut, code := runAs(d, "loam", "guard", "loam", "checkpoint", "create", "--disk-only", "--comment", "mine"); code != 0 || out != "v2\n" {
		t.Fatalf("checkpoint from inside as the sandbox's user: %d %q %q", code, out, errOut)
	}
	for _, id := range []string{owners.ID, "auto-1"} {
		_, errOut, code := runAs(d, "loam", "guard", "loam", "checkpoint", "rm", "-y", id)
		if code == 0 || !strings.Contains(errOut, "inside the sandbox") {
			t.Errorf("deleting %s from inside: %d %q", id, code, errOut)
		}
		_, errOut, code = runAs(d, "root", "guard", "loam", "checkpoint", "rm", "-y", id)
		if code == 0 || !strings.Contains(errOut, "inside the sandbox") {
			t.Errorf("deleting %s from inside as root: %d %q", id, code, errOut)
		}
	}
	// Another user of the sandbox (a web server's, say) gets nothing.
	if _, errOut, code := runAs(d, "root", "guard", "sh", "-c", "echo 'www:x:33:33:www:/:/bin/sh' >> /etc/passwd"); code != 0 {
		t.Fatalf("adding a user: %q", errOut)
	}
	_, errOut, code := runAs(d, "www", "guard", "loam", "checkpoint", "ls")
	if code == 0 || !strings.Contains(errOut, "only root and the sandbox's user") {
		t.Errorf("checkpoint ls as uid 65534: %d %q", code, errOut)
	}
	if _, errOut, code := runAs(d, "loam", "guard", "loam", "checkpoint", "rm", "-y", "v2"); code != 0 {
		t.Errorf("deleting its own checkpoint from inside: %d %q", code, errOut)
	}
	cps, err := d.C.ListCheckpoints(ctx, "guard")
	if err != nil || len(cps) != 2 || cps[0].ID != owners.ID || cps[1].ID != "auto-1" {
		t.Errorf("checkpoints after all that: %v %+v", err, cps)
	}
}

// TestForkCannotActAsItsSource: a memory fork wakes up with its source's
// memory, and so with the token its source's agent held. On a host that
// forwards packets (as Docker and Kubernetes hosts do), that token must not
// let root in the fork reach its source's agent: the source was given a new
// token after the checkpoint, the firewall drops traffic between sandboxes,
// and an agent serves only its own link.
func TestForkCannotActAsItsSource(t *testing.T) {
	// Not parallel: it sets ip_forward, a machine-wide sysctl, and puts it back after.
	const forward = "/proc/sys/net/ipv4/ip_forward"
	was, err := os.ReadFile(forward)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(forward, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(forward, was, 0o644) })

	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	src, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "source"})
	if err != nil {
		t.Fatal(err)
	}
	mustCheckpoint(t, d, "source", true)
	if _, err := d.C.Fork(ctx, "source", "v1", "fork"); err != nil {
		t.Fatal(err)
	}
	// What root in the fork can read: the token its agent was started with.
	environ, _, code := runAs(d, "root", "fork", "cat", "/proc/1/environ")
	var leaked string
	for _, kv := range strings.Split(environ, "\x00") {
		if v, ok := strings.CutPrefix(kv, "LOAM_AGENT_TOKEN="); ok {
			leaked = v
		}
	}
	if code != 0 || leaked == "" {
		t.Fatalf("no agent token in the fork's /proc/1/environ (%d)", code)
	}
	srcAgent := "http://" + sandboxIP(d, src.ID) + ":" + strconv.Itoa(agent.DefaultPort) + "/healthz"

	// From the host, where the daemon talks to agents from: the source
	// refuses the token its checkpoint holds.
	req, _ := http.NewRequestWithContext(ctx, "GET", srcAgent, nil)
	req.Header.Set("Authorization", "Bearer "+leaked)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("reaching the source's agent from the host: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the source's agent answered the token of its checkpoint with %d, want 401", resp.StatusCode)
	}
	// From the fork: nothing gets through.
	out, errOut, code := runAs(d, "root", "fork", "timeout", "5", "wget", "-q", "-O-", "-T", "3",
		"--header", "Authorization: Bearer "+leaked, srcAgent)
	if code == 0 {
		t.Errorf("root in the fork reached its source's agent: %q", out)
	}
	t.Logf("from the fork: %d %q", code, errOut)
	// Nor the daemon's API on the host.
	if _, _, code := runAs(d, "root", "fork", "timeout", "5", "wget", "-q", "-O-", "-T", "3", d.URL+"/healthz"); code == 0 {
		t.Error("a sandbox reached the daemon's API")
	}
	// The source still works, with its own token.
	if got := d.Run("source", "echo", "ok"); got != "ok\n" {
		t.Errorf("source: %q", got)
	}
}

// TestCrashMidRestore kills the daemon while a restore runs: the restore
// was recorded before anything changed, and the next start finishes it.
func TestCrashMidRestore(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "undo", Resources: &api.Resources{MemoryMiB: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("undo", "sh", "-c", "dd if=/dev/urandom of=/dev/shm/blob bs=1M count=256 2>/dev/null; echo one > /home/loam/f")
	d.Run("undo", "sh", "-c", "setsid sh -c 'echo $$ > /home/loam/loop.pid; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &")
	waitFor(t, func() bool {
		_, _, code := runAs(d, "loam", "undo", "test", "-s", "/home/loam/loop.pid")
		return code == 0
	})
	mustCheckpoint(t, d, "undo", true)
	d.Run("undo", "sh", "-c", "echo two > /home/loam/f; kill $(cat /home/loam/loop.pid)")

	go d.C.RestoreCheckpoint(context.Background(), "undo", "v1")
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := d.C.GetSandbox(ctx, "undo")
		if err == nil && got.State == api.StateRestoring {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never saw the sandbox restoring: %v %+v", err, got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	d.KillSettled() // runsc may still be at work, as after a real crash
	d.Start()
	got, err := d.C.GetSandbox(ctx, "undo")
	if err != nil || got.State != api.StateRunning {
		t.Fatalf("after the crash: %v %+v\n%s", err, got, d.Log.String())
	}
	if out := d.Run("undo", "cat", "/home/loam/f"); out != "one\n" {
		t.Errorf("file after the finished restore: %q", out)
	}
	if _, _, code := runAs(d, "loam", "undo", "sh", "-c", "kill -0 $(cat /home/loam/loop.pid)"); code != 0 {
		t.Errorf("the checkpoint's process is not running: %s", d.Run("undo", "ps"))
	}
	if cps, _ := d.C.ListCheckpoints(ctx, "undo"); len(cps) != 2 {
		t.Errorf("checkpoints %+v, want v1 and auto-1", cps)
	}
	_ = sb
}

// TestDataDirSecrets: the data dir is root's alone, even one that was made
// readable by all before; the database is 0600 and holds no agent token.
func TestDataDirSecrets(t *testing.T) {
	t.Parallel()
	dataDir, err := os.MkdirTemp("", "loam-e2e-modes-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	d := &harness.Daemon{T: t, DataDir: dataDir, Subnet: harness.NextSubnet()}
	d.Start()
	t.Cleanup(d.Destroy)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "secret"}); err != nil {
		t.Fatal(err)
	}
	mustCheckpoint(t, d, "secret", true)
	environ, _, _ := runAs(d, "root", "secret", "cat", "/proc/1/environ")
	for name, want := range map[string]os.FileMode{"": 0o700, "loam.db": 0o600, "loam.db-wal": 0o600, "token": 0o600, "secret": 0o600} {
		st, err := os.Stat(filepath.Join(dataDir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
		} else if st.Mode().Perm() != want {
			t.Errorf("%q has mode %v, want %v", name, st.Mode().Perm(), want)
		}
	}
	if !strings.Contains(d.Log.String(), "tightened the mode") {
		t.Error("no log line about tightening the data dir's mode")
	}
	var token string
	for _, kv := range strings.Split(environ, "\x00") {
		if v, ok := strings.CutPrefix(kv, "LOAM_AGENT_TOKEN="); ok {
			token = v
		}
	}
	for _, name := range []string{"loam.db", "loam.db-wal"} {
		b, _ := os.ReadFile(filepath.Join(dataDir, name))
		if token == "" || bytes.Contains(b, []byte(token)) {
			t.Errorf("%s holds the agent token %q", name, token)
		}
	}
}

// TestLimitsAfterACrash: a crash while the CPU quota was lifted (as a
// checkpoint lifts it) does not leave the sandbox unlimited: recovery sets
// it again.
func TestLimitsAfterACrash(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "capped", Resources: &api.Resources{CPUs: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "cpu*", "loam", sb.ID, "cpu.cfs_quota_us"))
	if len(files) == 0 {
		t.Fatalf("no CPU cgroup for %s", sb.ID)
	}
	quota := func() int {
		b, err := os.ReadFile(files[0])
		if err != nil {
			t.Fatal(err)
		}
		q, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return q
	}
	if q := quota(); q != 50000 {
		t.Fatalf("quota %d, want 50000", q)
	}
	d.Kill()
	if err := os.WriteFile(files[0], []byte("-1"), 0); err != nil { // lifted, as mid-checkpoint
		t.Fatal(err)
	}
	d.Start()
	if q := quota(); q != 50000 {
		t.Errorf("quota after recovery %d, want 50000", q)
	}
}

// TestNamesFitURLs: a name whose URL label NAME--ORG would be longer than
// DNS allows is refused.
func TestNamesFitURLs(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	long := "a" + strings.Repeat("b", 62-len("--default"))
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: long + "c"}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("a name of %d characters: %v, want invalid", len(long)+1, err)
	}
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: long})
	if err != nil {
		t.Fatalf("a name of %d characters: %v", len(long), err)
	}
	host := strings.TrimPrefix(sb.URL, "http://")
	if label, _, _ := strings.Cut(host, "."); len(label) > 63 {
		t.Errorf("URL %s: first label of %d characters", sb.URL, len(label))
	}
}
