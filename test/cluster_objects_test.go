package test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/objects/s3test"
	"loam.dev/loam/internal/store/postgres/pgtest"
	"loam.dev/loam/test/harness"
)

// TestClusterForkAnywhere: two nodes sharing one PostgreSQL and one object
// store (a real S3 server). A memory checkpoint of a sandbox on node b,
// stored (wait), outlives b: with b killed, a fork through a is placed on
// a, which fetches the checkpoint from the store, and the fork has the
// source's file and its process, running; a second fork there fetches
// nothing again. A checkpoint that is not stored still needs its node.
func TestClusterForkAnywhere(t *testing.T) {
	t.Parallel()
	bucket := s3test.NewBucket(t, "cluster/") // its credentials are in the environment the nodes inherit
	db := pgtest.NewDatabase(t)
	a := startNode(t, db, "a", "", "--objects", bucket)
	b := startNode(t, db, "b", a.Token, "--objects", bucket)
	ctx := harness.Ctx(t)
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src", Node: "b"}); err != nil {
		t.Fatal(err)
	}
	a.Run("src", "sh", "-c", "echo from-b > /home/loam/mark; (sleep 100000 &)")
	pid := strings.TrimSpace(a.Run("src", "pidof", "sleep"))
	if pid == "" {
		t.Fatal("no sleep in src")
	}
	if cp, err := a.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Wait: api.WaitStored}); err != nil || cp.Storage == nil || cp.Storage.State != api.StorageStored {
		t.Fatalf("a stored checkpoint of src through a: %+v, %v", cp, err)
	}
	no := false
	if _, err := a.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Memory: &no}); err != nil {
		t.Fatal(err)
	}

	b.Kill()
	harness.Eventually(t, 20*time.Second, "b seen gone", func() error {
		if sb, err := a.C.GetSandbox(ctx, "src"); err != nil || sb.State != api.StateUnknown {
			return fmt.Errorf("src: %+v, %v", sb, err)
		}
		return nil
	})
	// Its node gone, the object store says it is stored.
	if cp, err := a.C.GetCheckpoint(ctx, "src", "v1"); err != nil || cp.Storage == nil || cp.Storage.State != api.StorageStored {
		t.Errorf("v1 through a while b is gone: %+v, %v; want stored", cp, err)
	}
	fork, err := a.C.Fork(ctx, "src", "v1", "far")
	if err != nil {
		t.Fatalf("a fork of the stored checkpoint of a node gone: %v", err)
	}
	if fork.Node != "a" {
		t.Errorf("the fork: node %q, want a", fork.Node)
	}
	if got := a.Run("far", "sh", "-c", "cat /home/loam/mark; pidof sleep"); got != "from-b\n"+pid+"\n" {
		t.Errorf("the fork made on a: %q, want b's mark and its sleep (pid %s), running", got, pid)
	}
	if _, err := a.C.Fork(ctx, "src", "v1", "far-2"); err != nil {
		t.Fatalf("a second fork on a: %v", err)
	}
	if n := strings.Count(a.Log.String(), "fetched a checkpoint"); n != 1 {
		t.Errorf("a fetched the checkpoint %d times for two forks, want once", n)
	}
	if !strings.Contains(a.Log.String(), "its checkpoint is stored and its node b stopped answering") {
		t.Errorf("a's placement log does not say why the fork went to a:\n%s", a.Log.String())
	}
	// A checkpoint that is none is not found, its node gone or not.
	if _, err := a.C.Fork(ctx, "src", "v9", "nowhere"); harness.APICode(err) != api.CodeNotFound {
		t.Errorf("a fork of a checkpoint that is none: %v, want not_found", err)
	}
	for _, sb := range []string{"far", "far-2"} {
		if err := a.C.DeleteSandbox(ctx, sb); err != nil {
			t.Errorf("deleting %s: %v", sb, err)
		}
	}
}

// TestClusterForkCount: a count of forks of a stored checkpoint, through a
// node that does not hold it, makes each fork as a create of its own,
// placed on its own: the forks spread over both nodes (both report the
// same machine's memory, so only what placement counts of its own
// placements tells them apart), each running the source's process, and
// each node records the forks it made.
func TestClusterForkCount(t *testing.T) {
	t.Parallel()
	bucket := s3test.NewBucket(t, "count/")
	db := pgtest.NewDatabase(t)
	a := startNode(t, db, "a", "", "--objects", bucket)
	startNode(t, db, "b", a.Token, "--objects", bucket)
	ctx := harness.Ctx(t)
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src", Node: "b"}); err != nil {
		t.Fatal(err)
	}
	a.Run("src", "sh", "-c", "(sleep 100000 &)")
	pid := strings.TrimSpace(a.Run("src", "pidof", "sleep"))
	if _, err := a.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Wait: api.WaitStored}); err != nil {
		t.Fatal(err)
	}
	list, err := a.C.ForkMany(ctx, "src", "v1", api.CreateSandbox{Name: "w", Count: 4})
	if err != nil {
		t.Fatalf("4 forks through a: %v", err)
	}
	on := map[string]int{}
	for _, f := range list.Forks {
		if f.Sandbox == nil {
			t.Errorf("%s: %v", f.Name, f.Error)
			continue
		}
		on[f.Sandbox.Node]++
		if got := strings.TrimSpace(a.Run(f.Name, "pidof", "sleep")); got != pid {
			t.Errorf("%s on %s runs sleep %q, want the source's (%s)", f.Name, f.Sandbox.Node, got, pid)
		}
	}
	t.Logf("the forks went to %v", on)
	if on["a"] == 0 || on["b"] == 0 {
		t.Errorf("the forks went to %v, want both nodes", on)
	}
	// Each fork has one record, written by the node that made it (a node
	// that passes a call on records none), and the call its own.
	events, err := a.C.Audit(ctx, client.AuditOptions{Action: "sandbox.fork"})
	if err != nil {
		t.Fatal(err)
	}
	records := map[string]int{}
	for _, ev := range events {
		records[ev.Target+" "+ev.Outcome]++
	}
	for _, want := range []string{"sandboxes/w-1 ok", "sandboxes/w-2 ok", "sandboxes/w-3 ok", "sandboxes/w-4 ok", "sandboxes ok"} {
		if records[want] != 1 {
			t.Errorf("%d audit records %q, want 1 (all: %v)", records[want], want, records)
		}
	}
	for _, f := range list.Forks {
		if f.Sandbox != nil {
			if err := a.C.DeleteSandbox(ctx, f.Sandbox.Name); err != nil {
				t.Errorf("deleting %s: %v", f.Name, err)
			}
		}
	}
	if err := a.C.DeleteSandbox(ctx, "src"); err != nil {
		t.Error(err)
	}
}
