package postgres

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/storetest"
)

// twoNodes opens two stores on one new database, as two nodes' daemons.
func twoNodes(t *testing.T) (a, b *Store) {
	t.Helper()
	a = openNew(t)
	t.Cleanup(func() { a.Close() })
	b = openAgain(t, a)
	t.Cleanup(func() { b.Close() })
	return a, b
}

func join(t *testing.T, st *Store, name, addr string, lease time.Duration) int64 {
	t.Helper()
	epoch, err := st.Nodes().JoinNode(t.Context(), store.Node{Name: name, Address: addr,
		Load: api.NodeLoad{Role: "node", CPUs: 2, MemoryMiB: 24 << 10, Templates: []string{"base"}}}, lease)
	if err != nil {
		t.Fatalf("JoinNode(%s): %v", name, err)
	}
	st.SetFence(name, epoch)
	return epoch
}

func nodeSandbox(id, node string) *store.Sandbox {
	return &store.Sandbox{Sandbox: api.Sandbox{ID: id, Name: id, State: api.StateRunning, Node: node,
		CreatedAt: store.Now()}, Org: "default"}
}

func nodeStates(t *testing.T, st *Store) map[string]string {
	t.Helper()
	list, now, err := st.Nodes().ListNodes(t.Context())
	if err != nil {
		t.Fatalf("ListNodes: %v", err)
	}
	got := map[string]string{}
	for _, n := range list {
		got[n.Name] = fmt.Sprintf("%s cordoned=%v", n.State(now), n.Cordoned)
	}
	return got
}

// TestNodes: nodes join and renew leases read on the database's clock;
// cordon; a lease that runs out makes the node unreachable and fences its
// writes (nothing lands) until it renews; a later start of a node fences
// the earlier one's process for good; a node never changes another's
// sandbox; a removed node's sandboxes are in error, and it can neither
// renew nor join again.
func TestNodes(t *testing.T) {
	ctx := t.Context()
	a, b := twoNodes(t)
	const lease = 1500 * time.Millisecond
	epochA := join(t, a, "n1", "http://10.0.0.1:8080", time.Minute)
	join(t, b, "n2", "http://10.0.0.2:8080", lease)
	if got := nodeStates(t, a); got["n1"] != "ready cordoned=false" || got["n2"] != "ready cordoned=false" || len(got) != 2 {
		t.Fatalf("nodes = %v, want n1 and n2 ready", got)
	}
	list, _, _ := a.Nodes().ListNodes(ctx)
	if l := list[0].Load; l.CPUs != 2 || l.MemoryMiB != 24<<10 || len(l.Templates) != 1 || list[0].Address != "http://10.0.0.1:8080" {
		t.Errorf("n1's record = %+v", list[0])
	}

	// Each writes its own sandboxes, never the other's.
	mustCreate := func(st *Store, sb *store.Sandbox) {
		t.Helper()
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatalf("CreateSandbox(%s): %v", sb.ID, err)
		}
	}
	mustCreate(a, nodeSandbox("sb-a", "n1"))
	mustCreate(b, nodeSandbox("sb-b", "n2"))
	if err := a.CreateSandbox(ctx, nodeSandbox("sb-x", "n2")); err == nil {
		t.Error("n1 created a sandbox record of n2's")
	}
	onB, err := a.GetSandbox(ctx, "", "sb-b")
	if err != nil {
		t.Fatal(err)
	}
	onB.State = api.StateStopped
	wantFenced(t, "n1 updating n2's sandbox", a.UpdateSandbox(ctx, onB))
	wantFenced(t, "n1 deleting n2's sandbox", a.DeleteSandbox(ctx, "sb-b"))
	cp := &store.Checkpoint{Checkpoint: api.Checkpoint{ID: "v1", Sandbox: "sb-b", CreatedAt: store.Now()}}
	wantFenced(t, "n1 checkpointing n2's sandbox", a.CreateCheckpoint(ctx, cp))
	if err := b.CreateCheckpoint(ctx, cp); err != nil {
		t.Fatalf("n2 checkpointing its sandbox: %v", err)
	}
	wantFenced(t, "n1 deleting n2's checkpoint", a.DeleteCheckpoint(ctx, "sb-b", "v1"))

	// Cordon and uncordon.
	if err := a.Nodes().CordonNode(ctx, "n2", true); err != nil {
		t.Fatal(err)
	}
	if got := nodeStates(t, b)["n2"]; got != "ready cordoned=true" {
		t.Errorf("n2 after cordon: %s", got)
	}
	if err := a.Nodes().CordonNode(ctx, "n2", false); err != nil {
		t.Fatal(err)
	}
	if err := a.Nodes().CordonNode(ctx, "n9", true); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("CordonNode(n9) = %v, want not found", err)
	}

	// n2's lease runs out: it is unreachable, and its writes land nowhere.
	time.Sleep(lease + 300*time.Millisecond)
	if got := nodeStates(t, a)["n2"]; got != "unreachable cordoned=false" {
		t.Errorf("n2 after its lease: %s", got)
	}
	sb, _ := b.GetSandbox(ctx, "", "sb-b")
	sb.State = api.StateSleeping
	wantFenced(t, "n2 updating its sandbox after its lease", b.UpdateSandbox(ctx, sb))
	wantFenced(t, "n2 creating a sandbox after its lease", b.CreateSandbox(ctx, nodeSandbox("sb-b2", "n2")))
	if got, _ := a.GetSandbox(ctx, "", "sb-b"); got.State != api.StateStopped && got.State != api.StateRunning || got.Version != 1 {
		t.Errorf("after n2's fenced update, sb-b is %s at version %d; want it unchanged", got.State, got.Version)
	}
	// It renews (its link is back): its writes land again.
	epochB := b.fence.Load().epoch
	if err := b.Nodes().RenewNode(ctx, "n2", epochB, time.Minute, api.NodeLoad{Role: "node", Sandboxes: 1}); err != nil {
		t.Fatalf("RenewNode after a lapse: %v", err)
	}
	if err := b.UpdateSandbox(ctx, sb); err != nil {
		t.Fatalf("n2 updating its sandbox after renewing: %v", err)
	}

	// A later start of n1 (a new epoch) fences the earlier process.
	c := openAgain(t, a)
	defer c.Close()
	if epoch := join(t, c, "n1", "http://10.0.0.1:8080", time.Minute); epoch != epochA+1 {
		t.Errorf("n1's second join has epoch %d, want %d", epoch, epochA+1)
	}
	old, _ := a.GetSandbox(ctx, "", "sb-a")
	old.State = api.StateStopped
	wantFenced(t, "n1's earlier process updating after a restart", a.UpdateSandbox(ctx, old))
	if err := a.Nodes().RenewNode(ctx, "n1", epochA, time.Minute, api.NodeLoad{}); !errors.Is(err, ErrFenced) {
		t.Errorf("the earlier process renewing: %v, want ErrFenced", err)
	}
	if err := c.UpdateSandbox(ctx, old); err != nil {
		t.Errorf("n1's new process updating its sandbox: %v", err)
	}
	// Another daemon at another address cannot take n1's name while its
	// lease runs.
	if _, err := b.Nodes().JoinNode(ctx, store.Node{Name: "n1", Address: "http://10.0.0.9:8080"}, time.Minute); !errors.Is(err, ErrNodeTaken) {
		t.Errorf("joining as n1 from elsewhere: %v, want ErrNodeTaken", err)
	}

	// n2 removed for good.
	n, err := a.Nodes().RemoveNode(ctx, "n2")
	if err != nil || n != 1 {
		t.Fatalf("RemoveNode(n2) = %d, %v; want 1 sandbox marked", n, err)
	}
	got, _ := a.GetSandbox(ctx, "", "sb-b")
	if got.State != api.StateError || got.Error != RemoveNodeReason {
		t.Errorf("n2's sandbox after the removal: %s %q", got.State, got.Error)
	}
	if cps, _ := a.ListCheckpoints(ctx, "sb-b"); len(cps) != 1 {
		t.Errorf("n2's sandbox's checkpoints after the removal: %d, want 1 (kept)", len(cps))
	}
	if _, ok := nodeStates(t, a)["n2"]; ok {
		t.Error("a removed node is listed")
	}
	if err := b.Nodes().RenewNode(ctx, "n2", epochB, time.Minute, api.NodeLoad{}); !errors.Is(err, ErrFenced) {
		t.Errorf("a removed node renewing: %v, want ErrFenced", err)
	}
	if _, err := b.Nodes().JoinNode(ctx, store.Node{Name: "n2", Address: "http://10.0.0.2:8080"}, time.Minute); !errors.Is(err, ErrNodeRemoved) {
		t.Errorf("a removed node joining again: %v, want ErrNodeRemoved", err)
	}
	if _, err := a.Nodes().RemoveNode(ctx, "n2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("removing n2 twice: %v, want not found", err)
	}
}

// wantFenced checks err is the fence's: ErrFenced, the API's unavailable.
func wantFenced(t *testing.T, what string, err error) {
	t.Helper()
	var ae *api.Error
	if !errors.Is(err, ErrFenced) || !errors.As(err, &ae) || ae.Code != api.CodeUnavailable {
		t.Errorf("%s: %v; want ErrFenced, unavailable", what, err)
	}
}

// TestClusterSecret: nodes asking for a secret at once all get the one
// kept value, made once.
func TestClusterSecret(t *testing.T) {
	a, b := twoNodes(t)
	var wg sync.WaitGroup
	got := make([][]byte, 8)
	for i := range got {
		st := []*Store{a, b}[i%2]
		wg.Go(func() {
			v, err := st.Nodes().ClusterSecret(t.Context(), "node-credential", func() ([]byte, error) { return []byte(fmt.Sprint("made by ", i)), nil })
			if err != nil {
				t.Errorf("ClusterSecret: %v", err)
			}
			got[i] = v
		})
	}
	wg.Wait()
	for i := range got {
		if string(got[i]) != string(got[0]) || len(got[0]) == 0 {
			t.Fatalf("the nodes got %q", got)
		}
	}
	v, _ := a.Nodes().ClusterSecret(t.Context(), "node-credential", func() ([]byte, error) { return nil, errors.New("made again") })
	if string(v) != string(got[0]) {
		t.Errorf("later: %q, want %q", v, got[0])
	}
}

// TestStoreFenced: the store suite on the store of a node holding its
// lease (the suite's records are node-a's): the fence changes nothing
// for the owner's writes.
func TestStoreFenced(t *testing.T) {
	fenced := func(t *testing.T) store.Store {
		st := openNew(t)
		join(t, st, "node-a", "http://127.0.0.1:1", time.Hour)
		return st
	}
	storetest.Run(t, fenced, storetest.WithPeer(func(t *testing.T, st store.Store) store.Store {
		p := openAgain(t, st.(*Store))
		p.SetFence("node-a", st.(*Store).fence.Load().epoch)
		return p
	}))
}

// TestTakeOverSandbox: a sandbox of a node whose lease ran out is taken
// over by a live node in one step (its record then names the new node,
// with the slot and reason given, state error); not while its node holds
// its lease; not twice (the second taker, and the first node once back,
// get stale, and the old node changes nothing of it any more).
func TestTakeOverSandbox(t *testing.T) {
	a, b := twoNodes(t)
	ctx := t.Context()
	join(t, a, "a", "http://127.0.0.1:1", time.Hour)
	join(t, b, "b", "http://127.0.0.1:2", 2*time.Second)
	sb := nodeSandbox("sb-taken", "b")
	if err := b.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Nodes().TakeOverSandbox(ctx, sb.ID, "b", "a", 7, "why"); !errors.Is(err, store.ErrStale) {
		t.Fatalf("taking over a sandbox of a node that holds its lease: %v, want stale", err)
	}
	time.Sleep(2500 * time.Millisecond) // b's lease runs out
	got, err := a.Nodes().TakeOverSandbox(ctx, sb.ID, "b", "a", 7, "brought back")
	if err != nil {
		t.Fatalf("taking over a lost node's sandbox: %v", err)
	}
	if got.Node != "a" || got.NetIndex != 7 || got.State != api.StateError || got.Error != "brought back" || got.Version != sb.Version+1 {
		t.Errorf("taken over: node %s slot %d state %s error %q version %d", got.Node, got.NetIndex, got.State, got.Error, got.Version)
	}
	if _, err := a.Nodes().TakeOverSandbox(ctx, sb.ID, "b", "a", 8, "again"); !errors.Is(err, store.ErrStale) {
		t.Errorf("taking it over a second time: %v, want stale", err)
	}
	// b, back (its lease renewed), changes nothing of it.
	if err := b.Nodes().RenewNode(ctx, "b", b.fence.Load().epoch, time.Hour, api.NodeLoad{Role: "node"}); err != nil {
		t.Fatal(err)
	}
	sb.State = api.StateStopped
	if err := b.UpdateSandbox(ctx, sb); err == nil {
		t.Errorf("b updating the sandbox a took over: no error")
	}
	if err := b.DeleteSandbox(ctx, sb.ID); err == nil {
		t.Errorf("b deleting the sandbox a took over: no error")
	}
	if now, err := a.GetSandbox(ctx, "", sb.ID); err != nil || now.Node != "a" || now.Error != "brought back" {
		t.Errorf("the record after b's tries: %+v, %v", now, err)
	}
}

// TestTakeOverSleeping: a sleeping sandbox is taken over, still asleep,
// only with the token generation its record says (a wake moves it on),
// from a node whose lease ran out, or from no node once its node let it
// go (store.AnyNode), and then by one node alone; a node with no record
// of its own left keeps none of it (the unpinned record is not adopted
// by a restart as the cluster's first node).
func TestTakeOverSleeping(t *testing.T) {
	a, b := twoNodes(t)
	ctx := t.Context()
	join(t, a, "a", "http://127.0.0.1:1", time.Hour)
	join(t, b, "b", "http://127.0.0.1:2", time.Hour)
	sb := nodeSandbox("sb-asleep", "b")
	sb.State, sb.AgentGen = api.StateSleeping, 3
	if err := b.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Nodes().TakeOverSleeping(ctx, sb.ID, "b", "a", 7, 3); !errors.Is(err, store.ErrStale) {
		t.Fatalf("taking over a sleeping sandbox of a node that holds its lease: %v, want stale", err)
	}
	// b lets it go.
	sb.Node, sb.Handover = "", store.AnyNode
	if err := b.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Nodes().AdoptSandboxes(ctx, "a"); err != nil || n != 0 {
		t.Errorf("adopting the sandboxes of no node: %d, %v; want none (the unpinned one is not)", n, err)
	}
	if _, err := a.Nodes().TakeOverSleeping(ctx, sb.ID, "", "a", 7, 2); !errors.Is(err, store.ErrStale) {
		t.Errorf("taking it over with an older generation: %v, want stale", err)
	}
	got, err := a.Nodes().TakeOverSleeping(ctx, sb.ID, "", "a", 7, 3)
	if err != nil {
		t.Fatalf("taking over a sandbox of no node: %v", err)
	}
	if got.Node != "a" || got.NetIndex != 7 || got.State != api.StateSleeping || got.Handover != "" || got.Version != sb.Version+1 {
		t.Errorf("taken over: node %s slot %d state %s handover %q version %d", got.Node, got.NetIndex, got.State, got.Handover, got.Version)
	}
	if _, err := b.Nodes().TakeOverSleeping(ctx, sb.ID, "", "b", 8, 3); !errors.Is(err, store.ErrStale) {
		t.Errorf("taking it over a second time: %v, want stale", err)
	}
}
