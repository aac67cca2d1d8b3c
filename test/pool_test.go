package test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// TestWarmPool is a checkpoint's warm pool on real sandboxes: members are
// restored ahead of time and not listed; a fork claims one, which then is
// the fork in every way (its name as hostname, its env and labels, its own
// in-sandbox API, the checkpoint's processes and memory); a name in use
// gives the member back; the pool refills; deleting the checkpoint drains
// it and leaves nothing behind.
func TestWarmPool(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src"}); err != nil {
		t.Fatal(err)
	}
	d.Run("src", "sh", "-c", "echo 41 > /dev/shm/n")
	if _, err := d.C.CreateSession(ctx, "src", api.ExecRequest{Cmd: []string{"sleep", "3600"}, Detachable: true}); err != nil {
		t.Fatal(err)
	}
	cp := mustCheckpoint(t, d, "src", true)

	if _, err := d.C.SetCheckpointPool(ctx, "src", cp.ID, api.MaxPoolSize+1); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("a pool of %d: %v, want invalid", api.MaxPoolSize+1, err)
	}
	p, err := d.C.SetCheckpointPool(ctx, "src", cp.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	if p.Size != 2 || p.From == nil || p.From.Checkpoint != cp.ID {
		t.Errorf("the pool set: %+v", p)
	}
	waitPool(t, func() (*api.Pool, error) { return d.C.CheckpointPool(ctx, "src", cp.ID) }, 2)
	if out, errOut, code := d.CLI("", "checkpoint", "pool", "src", cp.ID); code != 0 || !strings.HasPrefix(out, "2 of 2 ready, 0 starting, ") {
		t.Errorf("loam checkpoint pool: %d %q %q", code, out, errOut)
	}
	if p, _ := d.C.CheckpointPool(ctx, "src", cp.ID); p.MemoryBytes <= 0 {
		t.Errorf("a pool of 2 ready members holds %d bytes of memory", p.MemoryBytes)
	}
	if list, err := d.C.ListSandboxes(ctx, client.ListOptions{}); err != nil || len(list) != 1 {
		t.Errorf("sandboxes listed with a pool of 2: %v, %v; want src alone", names(list), err)
	}
	members := sandboxIDs(t, d)

	start := time.Now()
	f, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "f1", Labels: map[string]string{"team": "a"},
		Env: map[string]string{"GREETING": "hi"}, From: &api.ForkSource{Sandbox: "src", Checkpoint: cp.ID}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork from the pool answered in %v", time.Since(start))
	if f.Name != "f1" || f.Labels["team"] != "a" || f.State != api.StateRunning || f.From == nil || f.From.Checkpoint != cp.ID {
		t.Errorf("the fork from the pool: %+v", f)
	}
	if got := d.Run("f1", "sh", "-c", `echo "$(hostname) $GREETING $(cat /dev/shm/n) $(cat /var/lib/loam/sandbox_name)"`); got != "f1 hi 41 f1\n" {
		t.Errorf("in the fork: %q, want its name, its env, the checkpoint's memory", got)
	}
	if ss, err := d.C.ListSessions(ctx, "f1"); err != nil || !slices.ContainsFunc(ss, func(s api.Session) bool {
		return s.State == "running" && strings.Join(s.Cmd, " ") == "sleep 3600"
	}) {
		t.Errorf("the fork's sessions: %v %v; want the checkpoint's sleep running", ss, err)
	}
	// The in-sandbox API acts on the fork, not on a member or the source.
	if got := d.Run("f1", "loam", "checkpoint", "create", "--disk-only"); got != "v1\n" {
		t.Errorf("a checkpoint from inside the fork: %q", got)
	}
	if cps, err := d.C.ListCheckpoints(ctx, "f1"); err != nil || len(cps) != 1 {
		t.Errorf("the fork's checkpoints: %v %v", cps, err)
	}
	if p, _ := d.C.CheckpointPool(ctx, "src", cp.ID); p.Claimed != 1 {
		t.Errorf("claimed %d, want 1", p.Claimed)
	}
	if !members[f.ID] {
		t.Errorf("the fork %s is none of the sandboxes there were before it (%v): it took no member", f.ID, members)
	}

	// A name in use is a conflict, and the member goes back.
	waitPool(t, func() (*api.Pool, error) { return d.C.CheckpointPool(ctx, "src", cp.ID) }, 2)
	_, err = d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "f1", From: &api.ForkSource{Sandbox: "src", Checkpoint: cp.ID}})
	if !errors.Is(err, api.ErrConflict) {
		t.Errorf("a fork named as another sandbox: %v, want conflict", err)
	}
	if p, _ := d.C.CheckpointPool(ctx, "src", cp.ID); p.Ready+p.Starting != 2 || p.Claimed != 1 {
		t.Errorf("after a conflict: %+v, want the member back", p)
	}

	// Deleting the checkpoint drains the pool; the fork lives on.
	if err := d.C.DeleteCheckpoint(ctx, "src", cp.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CheckpointPool(ctx, "src", cp.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("the pool of a deleted checkpoint: %v, want not found", err)
	}
	waitFor(t, func() bool { return sandboxDirs(t, d) == 2 })
	if got := d.Run("f1", "cat", "/dev/shm/n"); got != "41\n" {
		t.Errorf("the fork after its pool was drained: %q", got)
	}
}

// TestWarmPoolTemplate is a built-in template's pool: a create that asks
// for no other resources claims a member, with its services; the pool's
// size outlives a restart of the daemon, which makes the members again.
func TestWarmPoolTemplate(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	tpl := func() (*api.Pool, error) { return d.C.TemplatePool(ctx, "busybox") }
	if _, err := d.C.SetTemplatePool(ctx, "nope", 1); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a pool of a template that does not exist: %v, want not found", err)
	}
	if out, errOut, code := d.CLI("", "template", "pool", "busybox", "1"); code != 0 || !strings.Contains(out, " of 1 ready") {
		t.Fatalf("loam template pool busybox 1: %d %q %q", code, out, errOut)
	}
	waitPool(t, tpl, 1)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "t1", Env: map[string]string{"X": "y"},
		Services: []api.Service{{Name: "web", Cmd: []string{"sleep", "3600"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Template != "busybox" {
		t.Errorf("template %q", sb.Template)
	}
	if got := d.Run("t1", "sh", "-c", `echo "$(hostname) $X"`); got != "t1 y\n" {
		t.Errorf("in the sandbox from the pool: %q", got)
	}
	// The agent renamed the sandbox with CAP_SYS_ADMIN, which it keeps to
	// itself: root's processes have none of it.
	if out, _, code := runAs(d, "root", "t1", "sh", "-c", "grep CapBnd /proc/self/status; hostname other"); code == 0 {
		t.Errorf("root in the sandbox renamed it (%q): CAP_SYS_ADMIN reached a user's process", out)
	}
	if svc, err := d.C.GetService(ctx, "t1", "web"); err != nil || svc.Name != "web" {
		t.Errorf("its service: %+v %v", svc, err)
	}
	if p, _ := tpl(); p.Claimed != 1 {
		t.Errorf("claimed %d, want 1", p.Claimed)
	}
	// Other resources: made the slow way, the pool untouched.
	waitPool(t, tpl, 1)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "t2", Resources: &api.Resources{MemoryMiB: 384}}); err != nil {
		t.Fatal(err)
	}
	if p, _ := tpl(); p.Claimed != 1 || p.Ready != 1 {
		t.Errorf("after a create with its own resources: %+v", p)
	}

	d.Stop()
	d.Start()
	waitPool(t, tpl, 1)
	// t1, t2 and one member: the last daemon's member was deleted.
	if got := sandboxDirs(t, d); got != 3 {
		t.Errorf("%d sandbox directories after a restart, want 3", got)
	}
	if _, err := d.C.SetTemplatePool(ctx, "busybox", 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return sandboxDirs(t, d) == 2 })
}

// waitPool waits until the pool has want members ready.
func waitPool(t *testing.T, get func() (*api.Pool, error), want int) {
	t.Helper()
	harness.Eventually(t, 2*time.Minute, fmt.Sprintf("%d members of the pool ready", want), func() error {
		p, err := get()
		if err == nil && p.Ready < want {
			err = fmt.Errorf("%+v", p)
		}
		return err
	})
}

// sandboxIDs are the ids of the sandboxes on the host, members included.
func sandboxIDs(t *testing.T, d *harness.Daemon) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(d.DataDir, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, e := range entries {
		ids[e.Name()] = true
	}
	return ids
}

// sandboxDirs counts the sandboxes on the host, members included.
func sandboxDirs(t *testing.T, d *harness.Daemon) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(d.DataDir, "sandboxes"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return len(entries)
}

func names(list []api.Sandbox) string {
	var n []string
	for _, sb := range list {
		n = append(n, sb.Name)
	}
	return strings.Join(n, ",")
}
