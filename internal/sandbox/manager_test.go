package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/sandbox"
)

func TestCreate(t *testing.T) {
	e := newEnv(t)
	before := time.Now().Add(-time.Second)
	sb := e.create(api.CreateSandbox{
		Name:      "scratch",
		Env:       map[string]string{"GREETING": "hi"},
		Labels:    map[string]string{"team": "red"},
		Resources: &api.Resources{MemoryMiB: 1024},
	})

	if !strings.HasPrefix(sb.ID, "sb-") || len(sb.ID) != 15 {
		t.Errorf("id %q", sb.ID)
	}
	want := api.Sandbox{
		ID: sb.ID, Name: "scratch", State: api.StateRunning, Template: tinyTemplate,
		Resources: api.Resources{CPUs: 1, MemoryMiB: 1024, DiskMiB: 4096},
		Env:       map[string]string{"GREETING": "hi"}, Labels: map[string]string{"team": "red"},
		HTTPPort: 8080, URL: "https://scratch--acme.loam.test", CreatedAt: sb.CreatedAt,
	}
	if !equalSandbox(*sb, want) {
		t.Errorf("Create returned\n%+v\nwant\n%+v", *sb, want)
	}
	if sb.CreatedAt.Before(before) || sb.CreatedAt.After(time.Now()) {
		t.Errorf("created_at %v", sb.CreatedAt)
	}
	for _, ref := range []string{"scratch", sb.ID} {
		got, err := e.m.Get(e.ctx, ref)
		if err != nil || !equalSandbox(*got, *sb) {
			t.Errorf("Get(%s) = %+v, %v; want %+v", ref, got, err, *sb)
		}
	}

	rec := e.record(sb.ID)
	if rec.AgentGen != 0 || rec.LegacyAgentToken != "" || rec.NetIndex != 0 || rec.CheckpointSeq != 0 || rec.AutoSeq != 0 || rec.Error != "" {
		t.Errorf("record: %+v", rec)
	}

	c, ok := e.rt.Get(sb.ID)
	if !ok {
		t.Fatal("no container")
	}
	spec := c.Spec
	if spec.Hostname != "scratch" || spec.Rootfs != e.pool.VolumePath(sb.ID) ||
		spec.BundleDir != filepath.Join(e.sandboxDir(sb.ID), "bundle") ||
		spec.CPUs != 1 || spec.MemoryMiB != 1024 || spec.AgentBinary != e.cfg.AgentBinary ||
		envValue(spec.Env, agent.EnvToken) != e.token(sb.ID) || c.Status != runtime.StatusRunning || c.From != "" {
		t.Errorf("container: %+v", c)
	}
	// The sandbox's env is given to commands by the agent, per exec; the
	// container's environment holds no user variable.
	if v := envValue(spec.Env, "GREETING"); v != "" {
		t.Errorf("GREETING=%q in the container's environment", v)
	}
	if got := e.rt.CallsOf(sb.ID); !slices.Equal(got, []string{"start"}) {
		t.Errorf("runtime calls %v, want [start]", got)
	}
	if !e.nets.exists(sb.ID) {
		t.Error("no network")
	}
	e.agentAnswers(sb.ID)

	// The disk is the template's, named after the sandbox.
	if got := e.readVolume(sb.ID, "hello.txt"); got != "hello\n" {
		t.Errorf("hello.txt = %q", got)
	}
	if got := e.readVolume(sb.ID, "etc/hostname"); got != "scratch\n" {
		t.Errorf("etc/hostname = %q", got)
	}
	if fi, err := os.Lstat(filepath.Join(e.pool.VolumePath(sb.ID), "etc", "resolv.conf")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("etc/resolv.conf should replace the template's symlink: %v, %v", fi, err)
	}
	// The handle lets a restarted daemon find the sandbox.
	var h struct {
		Version   int    `json:"version"`
		ID        string `json:"id"`
		SandboxIP string `json:"sandbox_ip"`
		AgentPort int    `json:"agent_port"`
	}
	b, err := os.ReadFile(filepath.Join(e.sandboxDir(sb.ID), "handle.json"))
	if err == nil {
		err = json.Unmarshal(b, &h)
	}
	ep, _ := e.m.Endpoint(rec)
	if err != nil || h.Version != 1 || h.ID != sb.ID || h.SandboxIP != ep.SandboxIP.String() || h.AgentPort != e.cfg.AgentPort {
		t.Errorf("handle %+v, %v", h, err)
	}

	// A second sandbox, with no name: its name is its id, and it gets the
	// next address.
	other := e.create(api.CreateSandbox{Template: tinyTemplate})
	if other.Name != other.ID || other.HTTPPort != 8080 || len(other.Env) != 0 || len(other.Labels) != 0 {
		t.Errorf("sandbox without a name: %+v", other)
	}
	if i := e.record(other.ID).NetIndex; i != 1 {
		t.Errorf("second sandbox has net index %d, want 1", i)
	}
	e.agentAnswers(other.ID, e.token(sb.ID))

	all, err := e.m.List(e.ctx, nil)
	if err != nil || len(all) != 2 || all[0].ID != sb.ID || all[1].ID != other.ID {
		t.Errorf("List = %v, %v", all, err)
	}
	red, err := e.m.List(e.ctx, map[string]string{"team": "red"})
	if err != nil || len(red) != 1 || red[0].ID != sb.ID {
		t.Errorf("List(team=red) = %v, %v", red, err)
	}
}

func equalSandbox(a, b api.Sandbox) bool {
	eqFrom := (a.From == nil) == (b.From == nil) && (a.From == nil || *a.From == *b.From)
	return a.ID == b.ID && a.Name == b.Name && a.State == b.State && a.Template == b.Template &&
		a.Image == b.Image && a.Resources == b.Resources && maps.Equal(a.Env, b.Env) &&
		maps.Equal(a.Labels, b.Labels) && a.Idle == b.Idle && a.HTTPPort == b.HTTPPort &&
		a.URL == b.URL && eqFrom && a.CreatedAt.Equal(b.CreatedAt)
}

func TestCreateInvalid(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		req  api.CreateSandbox
	}{
		{"upper-case name", api.CreateSandbox{Name: "Scratch"}},
		{"name with --", api.CreateSandbox{Name: "a--b"}},
		{"name ending with -", api.CreateSandbox{Name: "a-"}},
		{"unknown template", api.CreateSandbox{Template: "nope"}},
		{"image", api.CreateSandbox{Image: "debian:12"}},
		{"too many cpus", api.CreateSandbox{Resources: &api.Resources{CPUs: 100}}},
		{"too little memory", api.CreateSandbox{Resources: &api.Resources{MemoryMiB: 10}}},
		{"too little disk", api.CreateSandbox{Resources: &api.Resources{DiskMiB: 1}}},
		{"reserved env", api.CreateSandbox{Env: map[string]string{"LOAM_AGENT_TOKEN": "x"}}},
		{"bad env name", api.CreateSandbox{Env: map[string]string{"1X": "x"}}},
		{"bad label", api.CreateSandbox{Labels: map[string]string{"-x": "y"}}},
		{"short idle", api.CreateSandbox{Idle: "10s"}},
		{"port out of range", api.CreateSandbox{HTTPPort: 70000}},
		{"the agent's port", api.CreateSandbox{HTTPPort: e.cfg.AgentPort}},
		{"fork without a checkpoint", api.CreateSandbox{From: &api.ForkSource{Sandbox: "x"}}},
		{"fork without a sandbox", api.CreateSandbox{From: &api.ForkSource{Checkpoint: "v1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.m.Create(e.ctx, tc.req)
			if !errors.Is(err, api.ErrInvalid) {
				t.Errorf("Create: %v, want invalid", err)
			}
		})
	}
	all, err := e.m.List(e.ctx, nil)
	if err != nil || len(all) != 0 {
		t.Errorf("List = %v, %v; want nothing", all, err)
	}
	if ids := e.rt.IDs(); len(ids) != 0 {
		t.Errorf("containers %v", ids)
	}
	if v := e.volumes(); len(v) != 0 {
		t.Errorf("volumes %v", v)
	}
}

func TestNameConflict(t *testing.T) {
	e := newEnv(t)
	first := e.create(api.CreateSandbox{Name: "dup"})
	_, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "dup"})
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), `"dup"`) {
		t.Errorf("second create: %v, want a conflict naming dup", err)
	}
	if ids := e.rt.IDs(); !slices.Equal(ids, []string{first.ID}) {
		t.Errorf("containers %v, want only %s", ids, first.ID)
	}
	if v := e.volumes(); !slices.Equal(v, []string{first.ID}) {
		t.Errorf("volumes %v", v)
	}
	if got, err := e.m.Get(e.ctx, "dup"); err != nil || got.ID != first.ID || got.State != api.StateRunning {
		t.Errorf("Get(dup) = %+v, %v", got, err)
	}
	// Once deleted, the name is free again.
	if err := e.m.Delete(e.ctx, "dup"); err != nil {
		t.Fatal(err)
	}
	again := e.create(api.CreateSandbox{Name: "dup"})
	if again.ID == first.ID {
		t.Error("a new sandbox got the old one's id")
	}
}

// TestCreateFailure checks that a create that fails leaves nothing behind:
// no record, container, disk, network or directory, and frees its address.
func TestCreateFailure(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setUp func(e *env)
		undo  func(e *env)
		// boot is the boot timeout: long enough for the fake's agent to
		// start on a loaded machine, since the create after the failure
		// needs it, and short where the failure is the agent's silence.
		boot time.Duration
	}{
		{"runtime fails to start", func(e *env) { e.rt.FailNext("start", errors.New("runsc: boom")) }, nil, 0},
		{"template fails", func(e *env) { e.tpl.failNext(errors.New("debootstrap: boom")) }, nil, 0},
		{"agent never answers", func(e *env) { e.rt.SetNoAgent(true) }, func(e *env) { e.rt.SetNoAgent(false) }, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(c *sandbox.Config) {
				if tc.boot != 0 {
					c.BootTimeout = tc.boot
				}
			})
			tc.setUp(e)
			_, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "doomed"})
			if err == nil {
				t.Fatal("Create succeeded")
			}
			if !strings.Contains(err.Error(), "creating sandbox doomed") {
				t.Errorf("error %q does not say what failed", err)
			}
			if all, err := e.m.List(e.ctx, nil); err != nil || len(all) != 0 {
				t.Errorf("List = %v, %v", all, err)
			}
			if ids := e.rt.IDs(); len(ids) != 0 {
				t.Errorf("containers %v", ids)
			}
			if v := e.volumes(); len(v) != 0 {
				t.Errorf("volumes %v", v)
			}
			if n := e.nets.count(); n != 0 {
				t.Errorf("%d networks left", n)
			}
			if entries, _ := os.ReadDir(filepath.Join(e.cfg.DataDir, "sandboxes")); len(entries) != 0 {
				t.Errorf("sandbox directories left: %v", entries)
			}
			if tc.undo != nil {
				tc.undo(e)
			}
			// The name and the address are free again.
			sb := e.create(api.CreateSandbox{Name: "doomed"})
			if i := e.record(sb.ID).NetIndex; i != 0 {
				t.Errorf("net index %d after a failed create, want 0", i)
			}
			e.agentAnswers(sb.ID)
		})
	}
}

func TestDelete(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "gone"})
	keep := e.create(api.CreateSandbox{Name: "kept"})
	e.checkpoint("gone", true)
	e.checkpoint("gone", false)
	c, _ := e.rt.Get(sb.ID)
	if len(e.snapshots()) != 2 {
		t.Fatalf("snapshots %v", e.snapshots())
	}

	if err := e.m.Delete(e.ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	e.requireGone(sb.ID)
	select {
	case <-c.Exited():
	case <-time.After(5 * time.Second):
		t.Error("the sandbox's agent still runs")
	}
	if got := e.rt.CallsOf(sb.ID); got[len(got)-1] != "delete" {
		t.Errorf("runtime calls %v, want a delete last", got)
	}
	if err := e.m.Delete(e.ctx, "gone"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("deleting again: %v, want not_found", err)
	}
	if _, err := e.cps.ListCheckpoints(e.ctx, sb.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("checkpoints of a deleted sandbox: %v, want not_found", err)
	}
	// The other sandbox is untouched.
	if got, err := e.m.Get(e.ctx, "kept"); err != nil || got.State != api.StateRunning {
		t.Errorf("Get(kept) = %+v, %v", got, err)
	}
	e.agentAnswers(keep.ID)
	// The freed address is handed out again.
	next := e.create(api.CreateSandbox{})
	if i := e.record(next.ID).NetIndex; i != 0 {
		t.Errorf("net index %d, want the freed 0", i)
	}
}

func TestConcurrentCreates(t *testing.T) {
	e := newEnv(t)
	const n = 4
	var wg sync.WaitGroup
	sbs := make([]*api.Sandbox, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { sbs[i], errs[i] = e.m.Create(e.ctx, api.CreateSandbox{}) })
	}
	wg.Wait()
	seen := map[int]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		idx := e.record(sbs[i].ID).NetIndex
		if seen[idx] {
			t.Errorf("net index %d handed out twice", idx)
		}
		seen[idx] = true
		e.agentAnswers(sbs[i].ID)
	}
}

// TestNameIsAnotherID names a sandbox with another sandbox's id.
//
// It fails today: the create succeeds, and since a reference that is one
// sandbox's id and another's name means the first (store.GetSandbox), the
// new sandbox can no longer be reached by its name, and deleting "it" by
// name deletes the other one.
func TestNameIsAnotherID(t *testing.T) {
	e := newEnv(t)
	alpha := e.create(api.CreateSandbox{Name: "alpha"})
	sb, err := e.m.Create(e.ctx, api.CreateSandbox{Name: alpha.ID})
	if err == nil {
		t.Errorf("a sandbox named %s, the id of alpha, was made", alpha.ID)
		if got, _ := e.m.Get(e.ctx, sb.Name); got.ID != sb.ID {
			t.Errorf("Get by the new sandbox's name %q finds %s (%s), not it", sb.Name, got.ID, got.Name)
		}
		return
	}
	if !errors.Is(err, api.ErrInvalid) && !errors.Is(err, api.ErrConflict) {
		t.Errorf("Create: %v, want invalid or conflict", err)
	}
}

// TestBusyDuringCreate acts on a sandbox while its create is in the
// runtime: it shows as creating, and changes to it are refused.
func TestBusyDuringCreate(t *testing.T) {
	e := newEnv(t)
	var state api.State
	var errs []error
	e.rt.SetHook(func(op, id string) {
		if op != "start" {
			return
		}
		if sb, err := e.m.Get(e.ctx, "young"); err == nil {
			state = sb.State
		}
		_, cpErr := e.cps.CreateCheckpoint(e.ctx, "young", api.CreateCheckpoint{Memory: ptr(false)})
		errs = append(errs, e.m.Delete(e.ctx, "young"), cpErr)
	})
	sb := e.create(api.CreateSandbox{Name: "young"})
	e.rt.SetHook(nil)
	if state != api.StateCreating {
		t.Errorf("state during the create: %q, want creating", state)
	}
	for _, err := range errs {
		if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "create is in progress") {
			t.Errorf("during the create: %v, want a conflict naming the create", err)
		}
	}
	if sb.State != api.StateRunning {
		t.Errorf("created sandbox is %s", sb.State)
	}
	e.agentAnswers(sb.ID)
}

// TestNothingPerSandboxOutlivesIt: the Manager keeps no state for a sandbox
// that is gone (a lock on its checkpoints, a client of its agent), so a
// long-lived daemon does not grow with every sandbox it ever ran.
func TestNothingPerSandboxOutlivesIt(t *testing.T) {
	e := newEnv(t)
	for i := range 3 {
		name := fmt.Sprintf("short-%d", i)
		e.create(api.CreateSandbox{Name: name})
		e.checkpoint(name, true)
		if _, err := e.m.Create(e.ctx, api.CreateSandbox{Name: name + "-fork", From: &api.ForkSource{Sandbox: name, Checkpoint: "v1"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.cps.RestoreCheckpoint(e.ctx, name, "v1"); err != nil {
			t.Fatal(err)
		}
		must(t, e.m.Delete(e.ctx, name+"-fork"))
		must(t, e.m.Delete(e.ctx, name))
	}
	if n := e.m.Lives(); n != 0 {
		t.Errorf("%d live objects (checkpoint locks, agent versions) left for deleted sandboxes", n)
	}
}

// TestLabelLimitedLookup holds the one resolver of sandbox references to
// the selector of a key limited by labels: a sandbox outside it answers
// every call exactly as one that does not exist, and stays untouched.
func TestLabelLimitedLookup(t *testing.T) {
	e := newEnv(t)
	red := e.create(api.CreateSandbox{Name: "red", Labels: map[string]string{"team": "red"}})
	blue := e.create(api.CreateSandbox{Name: "blue", Labels: map[string]string{"team": "blue"}})
	e.checkpoint("blue", false)
	limited := auth.WithPrincipal(e.ctx, auth.Principal{Org: "acme", Key: "key-test", Scope: api.ScopeWrite, Labels: map[string]string{"team": "red"}})

	if got, err := e.m.Get(limited, "red"); err != nil || got.ID != red.ID {
		t.Fatalf("Get(red) with a key for team=red: %+v, %v", got, err)
	}
	same := func(what string, err error, ref string) {
		t.Helper()
		_, none := e.m.Get(e.ctx, "nosuch")
		want := strings.ReplaceAll(none.Error(), "nosuch", ref)
		if !errors.Is(err, api.ErrNotFound) || err.Error() != want {
			t.Errorf("%s: %v, want %q as for a sandbox that does not exist", what, err, want)
		}
	}
	for _, ref := range []string{"blue", blue.ID} {
		_, err := e.m.Get(limited, ref)
		same("Get("+ref+")", err, ref)
		_, err = e.m.Sleep(limited, ref)
		same("Sleep("+ref+")", err, ref)
		_, err = e.m.Update(limited, ref, api.UpdateSandbox{Labels: &map[string]string{"team": "red"}})
		same("Update("+ref+")", err, ref)
		_, err = e.cps.CreateCheckpoint(limited, ref, api.CreateCheckpoint{})
		same("CreateCheckpoint("+ref+")", err, ref)
		_, err = e.cps.ListCheckpoints(limited, ref)
		same("ListCheckpoints("+ref+")", err, ref)
		_, err = e.m.Create(limited, api.CreateSandbox{From: &api.ForkSource{Sandbox: ref, Checkpoint: "v1"}})
		same("fork of "+ref, err, ref)
		err = e.m.Delete(limited, ref)
		same("Delete("+ref+")", err, ref)
	}
	if got, err := e.m.Get(e.ctx, "blue"); err != nil || got.State != api.StateRunning || got.Labels["team"] != "blue" {
		t.Errorf("blue after the limited key's calls: %+v, %v; want it running and unchanged", got, err)
	}
	if cps, err := e.cps.ListCheckpoints(e.ctx, "blue"); err != nil || len(cps) != 1 {
		t.Errorf("blue's checkpoints: %v, %v; want its one", cps, err)
	}
}

// TestOrgLookup holds the resolver to the caller's org: a sandbox of
// another org answers every call exactly as one that does not exist, by
// name or id, and stays untouched; the same name in two orgs is two
// sandboxes, each with its own URL; a fork takes its source from the
// caller's org only.
func TestOrgLookup(t *testing.T) {
	e := newEnv(t)
	mine := e.create(api.CreateSandbox{Name: "web"})
	e.checkpoint("web", false)
	if _, err := sandbox.NewOrgs(e.m).Create(e.ctx, "other"); err != nil {
		t.Fatal(err) // as the operator makes it before its keys
	}
	other := auth.WithPrincipal(e.ctx, auth.Principal{Org: "other", Key: "key-other", Scope: api.ScopeAdmin})
	acme := auth.WithPrincipal(e.ctx, auth.Principal{Org: "acme", Key: "key-acme", Scope: api.ScopeAdmin})

	same := func(what string, err error, ref string) {
		t.Helper()
		_, none := e.m.Get(acme, "nosuch")
		want := strings.ReplaceAll(none.Error(), "nosuch", ref)
		if !errors.Is(err, api.ErrNotFound) || err.Error() != want {
			t.Errorf("%s: %v, want %q as for a sandbox that does not exist", what, err, want)
		}
	}
	for _, ref := range []string{"web", mine.ID} {
		_, err := e.m.Get(other, ref)
		same("Get("+ref+")", err, ref)
		_, err = e.m.Sleep(other, ref)
		same("Sleep("+ref+")", err, ref)
		_, err = e.m.Update(other, ref, api.UpdateSandbox{Labels: &map[string]string{"x": "y"}})
		same("Update("+ref+")", err, ref)
		_, err = e.cps.ListCheckpoints(other, ref)
		same("ListCheckpoints("+ref+")", err, ref)
		_, err = e.m.Create(other, api.CreateSandbox{Name: "stolen", From: &api.ForkSource{Sandbox: ref, Checkpoint: "v1"}})
		same("fork of "+ref, err, ref)
		same("Delete("+ref+")", e.m.Delete(other, ref), ref)
	}
	if list, err := e.m.List(other, nil); err != nil || len(list) != 0 {
		t.Errorf("List in org other: %v, %v; want none", list, err)
	}

	// The same name in org other is its own sandbox.
	theirs, err := e.m.Create(other, api.CreateSandbox{Name: "web"})
	if err != nil {
		t.Fatalf("Create(web) in org other: %v", err)
	}
	if theirs.ID == mine.ID || theirs.URL == mine.URL || !strings.Contains(theirs.URL, "web--other.") || !strings.Contains(mine.URL, "web--acme.") {
		t.Errorf("web in two orgs: %s %s and %s %s; want two sandboxes, each with its org's URL", mine.ID, mine.URL, theirs.ID, theirs.URL)
	}
	for ctx, want := range map[context.Context]string{other: theirs.ID, acme: mine.ID} {
		if got, err := e.m.Get(ctx, "web"); err != nil || got.ID != want {
			t.Errorf("Get(web): %v, %v; want %s", got, err, want)
		}
		if list, err := e.m.List(ctx, nil); err != nil || len(list) != 1 || list[0].ID != want {
			t.Errorf("List: %v, %v; want only %s", list, err, want)
		}
	}
	if tg, err := e.m.HTTPTarget(e.ctx, "other", "web", nil); err != nil || tg.ID != theirs.ID {
		t.Errorf("HTTPTarget(other, web) = %+v, %v; want %s", tg, err, theirs.ID)
	}
	if tg, err := e.m.HTTPTarget(e.ctx, "acme", "web", nil); err != nil || tg.ID != mine.ID {
		t.Errorf("HTTPTarget(acme, web) = %+v, %v; want %s", tg, err, mine.ID)
	}
	must(t, e.m.Delete(other, "web"))
	if got, err := e.m.Get(acme, "web"); err != nil || got.ID != mine.ID || got.State != api.StateRunning {
		t.Errorf("acme's web after org other's calls: %+v, %v; want it running", got, err)
	}
	if cps, err := e.cps.ListCheckpoints(acme, "web"); err != nil || len(cps) != 1 {
		t.Errorf("acme's web's checkpoints: %v, %v; want its one", cps, err)
	}
}
