package sandbox_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/sandbox"
)

// setQuota sets the env's org's quota, as PUT /v1/orgs/{org}/quota does.
func (e *env) setQuota(q api.Quota) *sandbox.Orgs {
	e.t.Helper()
	orgs := sandbox.NewOrgs(e.m)
	if _, err := orgs.SetQuota(e.ctx, e.cfg.Org, q); err != nil {
		e.t.Fatal(err)
	}
	return orgs
}

// use is what the env's org uses now.
func (e *env) use(orgs *sandbox.Orgs) api.OrgUse {
	e.t.Helper()
	o, err := orgs.Get(e.ctx, e.cfg.Org)
	if err != nil {
		e.t.Fatal(err)
	}
	return o.Use
}

// TestQuotaRace: 50 creates racing at the edge of a quota of 5 running
// sandboxes make exactly 5; the others are refused with limit before
// anything is made.
func TestQuotaRace(t *testing.T) {
	e := newEnv(t)
	orgs := e.setQuota(api.Quota{Sandboxes: ptr(5)})
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		made    int
		refused int
	)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.m.Create(e.ctx, api.CreateSandbox{Name: fmt.Sprintf("race-%d", i)})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				made++
			case errors.Is(err, api.ErrLimit) && strings.Contains(err.Error(), "its quota is 5"):
				refused++
			default:
				t.Errorf("create %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if made != 5 || refused != 45 {
		t.Errorf("%d made, %d refused; want 5 and 45", made, refused)
	}
	if list, _ := e.m.List(e.ctx, nil); len(list) != 5 {
		t.Errorf("%d sandboxes listed, want 5", len(list))
	}
	if got := e.use(orgs).Sandboxes; got != 5 {
		t.Errorf("use: %d sandboxes, want 5", got)
	}
	if n := len(e.volumes()); n != 5 {
		t.Errorf("%d volumes, want 5: a refused create made one", n)
	}
}

// TestQuotaUse follows an org's use through creates, checkpoints, sleeps,
// wakes, forks and deletes, and each quota refusing what would pass it.
func TestQuotaUse(t *testing.T) {
	e := newEnv(t)
	orgs := e.setQuota(api.Quota{})
	a := e.create(api.CreateSandbox{Name: "a"})
	e.create(api.CreateSandbox{Name: "b", Resources: &api.Resources{MemoryMiB: 1024, CPUs: 2, DiskMiB: 1024}})
	want := api.OrgUse{Sandboxes: 2, MemoryMiB: 512 + 1024, CPUs: 3, DiskMiB: 4096 + 1024}
	if got := e.use(orgs); got != want {
		t.Fatalf("use after two creates: %+v, want %+v", got, want)
	}
	e.checkpoint("a", true)
	e.checkpoint("a", false)
	want.Checkpoints, want.DiskMiB = 2, want.DiskMiB+512 // a's memory image
	if got := e.use(orgs); got != want {
		t.Fatalf("use after two checkpoints: %+v, want %+v", got, want)
	}
	if _, err := e.m.Sleep(e.ctx, "a"); err != nil {
		t.Fatal(err)
	}
	want.Sandboxes, want.MemoryMiB, want.CPUs = 1, 1024, 2
	if got := e.use(orgs); got != want {
		t.Fatalf("use with a asleep: %+v, want %+v", got, want)
	}

	// Each quota refuses the call that would pass it, with its message.
	refuse := func(what string, err error, msg string) {
		t.Helper()
		if !errors.Is(err, api.ErrLimit) || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v, want limit saying %q", what, err, msg)
		}
	}
	e.setQuota(api.Quota{Sandboxes: ptr(1)})
	_, err := e.m.Wake(e.ctx, "a")
	refuse("wake over the sandboxes quota", err, "org acme would run 2 sandboxes, its quota is 1")
	e.sleeping(a.ID)
	_, err = e.m.Create(e.ctx, api.CreateSandbox{From: &api.ForkSource{Sandbox: "a", Checkpoint: "v1"}})
	refuse("fork over the sandboxes quota", err, "org acme would run 2 sandboxes")
	_, err = e.cps.RestoreCheckpoint(e.ctx, "a", "v2")
	refuse("restore of a sleeping sandbox over the sandboxes quota", err, "org acme would run 2 sandboxes")

	e.setQuota(api.Quota{MemoryMiB: ptr(1536 - 1)})
	_, err = e.m.Wake(e.ctx, "a")
	refuse("wake over the memory quota", err, "org acme would use 1536 MiB of memory, its quota is 1535 MiB")
	e.setQuota(api.Quota{Checkpoints: ptr(2)})
	_, err = e.cps.CreateCheckpoint(e.ctx, "b", api.CreateCheckpoint{})
	refuse("checkpoint over the checkpoints quota", err, "org acme would keep 3 checkpoints, its quota is 2")
	e.setQuota(api.Quota{DiskMiB: ptr(want.DiskMiB + 4095)})
	_, err = e.m.Create(e.ctx, api.CreateSandbox{Name: "c"})
	refuse("create over the disk quota", err, "of disk, its quota is")
	if got := e.use(orgs); got != want {
		t.Fatalf("use after the refusals: %+v, want %+v", got, want)
	}

	// Room made, the same calls go through: a fork counts as what it makes.
	e.setQuota(api.Quota{Sandboxes: ptr(2), Checkpoints: ptr(2)})
	if _, err := e.m.Wake(e.ctx, "a"); err != nil {
		t.Fatalf("wake within the quota: %v", err)
	}
	if err := e.m.Delete(e.ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "fork", From: &api.ForkSource{Sandbox: "a", Checkpoint: "v1"}}); err != nil {
		t.Fatalf("fork within the quota: %v", err)
	}
	want = api.OrgUse{Sandboxes: 2, MemoryMiB: 1024, CPUs: 2, DiskMiB: 2*4096 + 512, Checkpoints: 2}
	if got := e.use(orgs); got != want {
		t.Fatalf("use after the delete and the fork: %+v, want %+v", got, want)
	}
	// A restore keeps the state before it as a checkpoint of the org's:
	// at the quota, it is refused before anything is made; with room, it
	// counts.
	before, err := e.cps.ListCheckpoints(e.ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.cps.RestoreCheckpoint(e.ctx, "a", "v1")
	refuse("restore with no room for its automatic checkpoint", err, "org acme would keep 3 checkpoints, its quota is 2")
	if after, err := e.cps.ListCheckpoints(e.ctx, "a"); err != nil || len(after) != len(before) {
		t.Errorf("checkpoints after the refused restore: %d (%v), want %d", len(after), err, len(before))
	}
	if got := e.use(orgs); got != want {
		t.Fatalf("use after the refused restore: %+v, want %+v", got, want)
	}
	e.setQuota(api.Quota{Checkpoints: ptr(3)})
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "a", "v1"); err != nil {
		t.Fatalf("restore within the quota: %v", err)
	}
	want.Checkpoints, want.DiskMiB = 3, want.DiskMiB+512 // auto-1, of a's memory
	if got := e.use(orgs); got != want {
		t.Fatalf("use after the restore: %+v, want %+v", got, want)
	}
	if _, err := orgs.SetQuota(e.ctx, "nosuch", api.Quota{}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("the quota of an org that does not exist: %v, want not_found", err)
	}
	if _, err := orgs.SetQuota(e.ctx, e.cfg.Org, api.Quota{Sandboxes: ptr(-1)}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("a negative quota: %v, want invalid", err)
	}
}

// TestOrgDeleteRacesCreates: creates in an org racing a delete of
// everything in it are each either made before (and deleted with the org)
// or refused; none is left in the org once it is gone, and the delete is
// not refused for a sandbox still being made.
func TestOrgDeleteRacesCreates(t *testing.T) {
	e := newEnv(t)
	orgs := sandbox.NewOrgs(e.m)
	if _, err := orgs.Create(e.ctx, "docs"); err != nil {
		t.Fatal(err)
	}
	docs := auth.WithPrincipal(e.ctx, auth.Principal{Org: "docs", Key: "key-docs", Scope: api.ScopeAdmin})
	if _, err := e.m.Create(docs, api.CreateSandbox{Name: "first"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.m.Create(docs, api.CreateSandbox{Name: fmt.Sprintf("racer-%d", i)})
			errs <- err
		}()
	}
	operator := auth.WithPrincipal(e.ctx, auth.Principal{Org: e.cfg.Org, Key: api.AdminKeyID, Scope: api.ScopeAdmin, Operator: true})
	if err := orgs.Delete(operator, "docs", true); err != nil {
		t.Errorf("deleting the org with everything in it: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !errors.Is(err, api.ErrConflict) && !errors.Is(err, api.ErrNotFound) {
			t.Errorf("a create racing the delete: %v", err)
		}
	}
	left, err := e.m.List(docs, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range left {
		t.Errorf("sandbox %s is left in the deleted org", sb.Name)
	}
	if _, err := e.m.Create(docs, api.CreateSandbox{Name: "late"}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a create in the deleted org: %v, want not_found", err)
	}
	if n := len(e.volumes()); n != 0 {
		t.Errorf("%d volumes left", n)
	}
}
