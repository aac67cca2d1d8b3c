package test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/objects/s3test"
	"loam.dev/loam/internal/store/postgres/pgtest"
	"loam.dev/loam/test/harness"
)

// TestClusterRecover: a sandbox of node b, with a memory checkpoint in the
// object store, and b killed (SIGKILL: its sandbox's machine runs on,
// its daemon gone). A restore of that checkpoint through node a brings
// the sandbox back on a: the same id, name and URL, its processes running
// as at the checkpoint, what it did after it gone, and a reason that says
// so. A checkpoint that is not stored cannot bring it back. When b starts
// again it finds the sandbox a's, destroys its own stale copy (and says
// so in its log), and a's copy runs on untouched.
func TestClusterRecover(t *testing.T) {
	t.Parallel()
	nodes := objectNodes(t, "recover/", "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := harness.Ctx(t)
	made, pid := markedSandbox(t, a, "lost", "b", "kept", api.CreateSandbox{})
	if cp, err := a.C.CreateCheckpoint(ctx, "lost", api.CreateCheckpoint{Wait: api.WaitStored}); err != nil || cp.Storage == nil || cp.Storage.State != api.StorageStored {
		t.Fatalf("a stored checkpoint of lost: %+v, %v", cp, err)
	}
	a.Run("lost", "sh", "-c", "echo late > /home/loam/late")
	// One whose policy brings it back by itself, and one whose policy
	// would but which has no stored checkpoint.
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "auto", Node: "b", Recover: api.RecoverLatestCheckpoint}); err != nil {
		t.Fatal(err)
	}
	a.Run("auto", "sh", "-c", "echo auto > /home/loam/mark")
	if _, err := a.C.CreateCheckpoint(ctx, "auto", api.CreateCheckpoint{Wait: api.WaitStored}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "bare", Node: "b", Recover: api.RecoverLatestCheckpoint}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "bad", Recover: "best-effort"}); harness.APICode(err) != api.CodeInvalid {
		t.Errorf("a create with a recover policy that is none: %v, want invalid", err)
	}

	b.Kill()
	harness.Eventually(t, 20*time.Second, "b seen gone", func() error {
		if sb, err := a.C.GetSandbox(ctx, "lost"); err != nil || sb.State != api.StateUnknown {
			return fmt.Errorf("lost: %+v, %v", sb, err)
		}
		return nil
	})
	// A checkpoint that is none brings nothing back, and changes nothing.
	if _, err := a.C.RestoreCheckpoint(ctx, "lost", "v7"); harness.APICode(err) != api.CodeNotFound {
		t.Errorf("a restore of a checkpoint that is none: %v, want not_found", err)
	}
	start := time.Now()
	back, err := a.C.RestoreCheckpoint(ctx, "lost", "v1")
	if err != nil {
		t.Fatalf("a restore of lost's stored checkpoint through a, b gone: %v", err)
	}
	t.Logf("brought back on a in %v", time.Since(start).Round(time.Millisecond))
	if back.ID != made.ID || back.Name != "lost" || back.URL != made.URL || back.Node != "a" || back.State != api.StateRunning {
		t.Errorf("brought back: id %s name %s url %s node %s state %s; want %s lost %s a running",
			back.ID, back.Name, back.URL, back.Node, back.State, made.ID, made.URL)
	}
	for _, want := range []string{"brought back on node a from checkpoint v1", "node b stopped answering", "lost"} {
		if !strings.Contains(back.Reason, want) {
			t.Errorf("its reason %q does not say %q", back.Reason, want)
		}
	}
	if got := a.Run("lost", "sh", "-c", "cat /home/loam/mark; pidof sleep; cat /home/loam/late 2>/dev/null || true"); got != "kept\n"+pid+"\n" {
		t.Errorf("lost on a: %q, want its mark and its sleep (pid %s) as at the checkpoint, and not what came after", got, pid)
	}
	if cps, err := a.C.ListCheckpoints(ctx, "lost"); err != nil || len(cps) != 1 || cps[0].ID != "v1" {
		t.Errorf("lost's checkpoints once brought back: %+v, %v; want v1 alone", cps, err)
	}
	// auto is brought back by its policy, on a (the one node left).
	harness.Eventually(t, time.Minute, "auto brought back by its policy", func() error {
		sb, err := a.C.GetSandbox(ctx, "auto")
		if err != nil || sb.Node != "a" || sb.State != api.StateRunning {
			return fmt.Errorf("auto: %+v, %v", sb, err)
		}
		if !strings.Contains(sb.Reason, "from checkpoint v1") {
			return fmt.Errorf("auto's reason: %q", sb.Reason)
		}
		return nil
	})
	if got := strings.TrimSpace(a.Run("auto", "cat", "/home/loam/mark")); got != "auto" {
		t.Errorf("auto brought back: mark %q", got)
	}
	// The audit log says so, as of a call no key made.
	evs, err := a.C.Audit(ctx, client.AuditOptions{Action: "sandbox.recover"})
	if err != nil || len(evs) != 1 || evs[0].Key != "recovery" || evs[0].Target != "sandboxes/auto/checkpoints/v1" || evs[0].Outcome != "ok" || evs[0].Client != "node a" {
		t.Errorf("the audit log's sandbox.recover records: %+v, %v; want one of auto's v1 by key recovery from node a, ok", evs, err)
	}
	if !strings.Contains(a.Log.String(), "has no stored checkpoint to be brought back from") {
		t.Errorf("a's log does not say that bare has no stored checkpoint")
	}
	if sb, err := a.C.GetSandbox(ctx, "bare"); err != nil || sb.State != api.StateUnknown {
		t.Errorf("bare, with no stored checkpoint: %+v, %v; want it left unknown", sb, err)
	}
	// It is a's now: a checkpoint through a is taken on a.
	if _, err := a.C.CreateCheckpoint(ctx, "lost", api.CreateCheckpoint{Comment: "on a"}); err != nil {
		t.Errorf("a checkpoint of lost once on a: %v", err)
	}

	b.Start(b.args...)
	harness.Eventually(t, time.Minute, "b destroying its stale copy", func() error {
		if !strings.Contains(b.Log.String(), "destroying the stale copy of a sandbox another node owns now") {
			return fmt.Errorf("not in b's log yet")
		}
		return nil
	})
	if got := a.Run("lost", "sh", "-c", "cat /home/loam/mark; pidof sleep"); got != "kept\n"+pid+"\n" {
		t.Errorf("lost on a once b is back: %q, want it untouched", got)
	}
	if sb, err := b.C.GetSandbox(ctx, "lost"); err != nil || sb.Node != "a" || sb.State != api.StateRunning {
		t.Errorf("lost through b once it is back: %+v, %v; want a's, running", sb, err)
	}
	if got, _, _, err := b.C.Output(ctx, "lost", "cat", "/home/loam/mark"); err != nil || strings.TrimSpace(string(got)) != "kept" {
		t.Errorf("an exec in lost through b: %q, %v; want it passed to a", got, err)
	}
	for _, name := range []string{"lost", "auto", "bare"} {
		if err := b.C.DeleteSandbox(ctx, name); err != nil {
			t.Errorf("deleting %s through b: %v", name, err)
		}
	}
}

// TestClusterRecoverCutOff: node b's link dropped while its process and
// its sandbox run on. Its sandbox is brought back on a from its stored
// checkpoint; while b is cut off it cannot act on it (its lease is gone).
// When the link returns, b finds the sandbox a's, destroys its stale copy
// without touching a's, and one copy alone answers at the sandbox's URL:
// a's.
func TestClusterRecoverCutOff(t *testing.T) {
	t.Parallel()
	cn := newClusterNet(t)
	// The object store on the host's end of the links, reached from
	// every node's namespace, as the database is.
	s3 := s3test.NewServer(t, net.JoinHostPort(cn.links.Host().String(), "7480"))
	bucket := s3.NewBucket(t, "cut/")
	a := cn.node(t, "a", "", "--objects", bucket)
	b := cn.node(t, "b", a.Token, "--objects", bucket)
	ctx := harness.Ctx(t)
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "split", Node: "b", HTTPPort: 8080}); err != nil {
		t.Fatal(err)
	}
	a.Run("split", "sh", "-c", "mkdir -p /tmp/www && echo one > /tmp/www/index.html && (httpd -p 8080 -h /tmp/www &)")
	if _, err := a.C.CreateCheckpoint(ctx, "split", api.CreateCheckpoint{Wait: api.WaitStored}); err != nil {
		t.Fatal(err)
	}

	b.link.Cut()
	harness.Eventually(t, 30*time.Second, "split unknown through a", func() error {
		if sb, err := a.C.GetSandbox(ctx, "split"); err != nil || sb.State != api.StateUnknown {
			return fmt.Errorf("split: %+v, %v", sb, err)
		}
		return nil
	})
	back, err := a.C.RestoreCheckpoint(ctx, "split", "v1")
	if err != nil {
		t.Fatalf("bringing split back on a while b is cut off: %v", err)
	}
	if back.Node != "a" || back.State != api.StateRunning {
		t.Errorf("split brought back: node %s state %s", back.Node, back.State)
	}
	a.Run("split", "sh", "-c", "echo two > /tmp/www/index.html")

	b.link.Heal()
	harness.Eventually(t, time.Minute, "b destroying its stale copy", func() error {
		if !strings.Contains(b.Log.String(), "destroying the stale copy of a sandbox another node owns now") {
			return fmt.Errorf("not in b's log yet")
		}
		return nil
	})
	if got := strings.TrimSpace(a.Run("split", "cat", "/tmp/www/index.html")); got != "two" {
		t.Errorf("split on a once b is back: %q, want a's own change", got)
	}
	// Its URL, through either node, answers from a's copy alone.
	tok, err := a.C.AccessToken(ctx, "split")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []*clusterNode{a, b} {
		harness.Eventually(t, 20*time.Second, "split's URL through "+n.name, func() error {
			return n.Served(ctx, tok, "two")
		})
	}
	if out, err := b.C.ListSandboxes(ctx, client.ListOptions{}); err != nil || len(out) != 1 || out[0].Node != "a" {
		t.Errorf("the sandboxes through b once it is back: %+v, %v", out, err)
	}
}

// objectNodes starts nodes of one cluster (the first one's token for the
// rest) sharing a new database and a bucket of the shared S3 server; one
// named front… is a front end (--role api).
func objectNodes(t testing.TB, prefix string, names ...string) []*clusterNode {
	t.Helper()
	bucket := s3test.NewBucket(t, prefix)
	db := pgtest.NewDatabase(t)
	var nodes []*clusterNode
	for _, name := range names {
		token := ""
		if len(nodes) > 0 {
			token = nodes[0].Token
		}
		extra := []string{"--objects", bucket}
		if strings.HasPrefix(name, "front") {
			extra = append(extra, "--role", "api")
		}
		nodes = append(nodes, startNode(t, db, name, token, extra...))
	}
	return nodes
}

// markedSandbox makes sandbox name on node through via, with a file saying
// mark and a sleep running, and answers it and the sleep's pid.
func markedSandbox(t *testing.T, via *clusterNode, name, node, mark string, extra api.CreateSandbox) (*api.Sandbox, string) {
	t.Helper()
	extra.Name, extra.Node = name, node
	sb, err := via.C.CreateSandbox(harness.Ctx(t), extra)
	if err != nil {
		t.Fatal(err)
	}
	via.Run(name, "sh", "-c", "echo "+mark+" > /home/loam/mark; (sleep 100000 &)")
	pid := strings.TrimSpace(via.Run(name, "pidof", "sleep"))
	if pid == "" {
		t.Fatalf("no sleep in %s", name)
	}
	return sb, pid
}
