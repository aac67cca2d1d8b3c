package checkpoints

import (
	"context"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Cluster is what the recovery of lost nodes' sandboxes needs of this
// node's membership (cluster.Member has it).
type Cluster interface {
	// Name is this node's name; Live whether it holds its lease.
	Name() string
	Live() bool
	// Nodes are the nodes at the last reading, and the database's time.
	Nodes() ([]*store.Node, time.Time)
}

// StoredCheckpoints tells whether a checkpoint is in the object store (the
// Uploader's Stored).
type StoredCheckpoints interface {
	Stored(ctx context.Context, sandboxID, ref string) (bool, error)
}

// SleepsStored tells whether a sleeping sandbox's image is in the object
// store (the Uploader's SleepStored).
type SleepsStored interface {
	SleepStored(ctx context.Context, sb *store.Sandbox) bool
}

// Recovery brings back, on a live node, the sandboxes of a lost node whose
// policy asks for it (api.RecoverLatestCheckpoint): once their node's
// lease has been out for After, each is restored from its latest stored
// checkpoint (RestoreCheckpoint, which moves it here). Every live node
// runs one; each sandbox is one node's to bring back, picked by a hash of
// its id over the ready nodes (so that they spread, and do not race),
// and the database lets only one take it over in any case.
type Recovery struct {
	Service *Service
	Stored  StoredCheckpoints
	// Sleeps, when set, says whether a sleeping sandbox's image is
	// stored: such a sandbox is left asleep, to wake with nothing lost on
	// the node of its next use (sandbox's adopt), not brought back from
	// an older checkpoint.
	Sleeps  SleepsStored
	Cluster Cluster
	Records store.Store
	// Audit, when set, keeps a record of each sandbox brought back, as
	// of a call: no key made it, so its key is RecoveryKey and its client
	// the node that did it.
	Audit store.AuditWriter
	// After is how long a node's lease must have been out before its
	// sandboxes are brought back elsewhere: a node whose link blinks is
	// not robbed of them.
	After time.Duration
	// Every is how often it looks.
	Every time.Duration
	Log   *slog.Logger

	mu     sync.Mutex
	warned map[string]bool
}

// Run looks every Every until ctx ends.
func (r *Recovery) Run(ctx context.Context) error {
	t := time.NewTicker(r.Every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
		if r.Cluster.Live() {
			r.pass(ctx)
		}
	}
}

// pass is one look at the lost nodes' sandboxes.
func (r *Recovery) pass(ctx context.Context) {
	nodes, now := r.Cluster.Nodes()
	var ready []string
	var lost []*store.Node
	for _, n := range nodes {
		switch {
		case n.State(now) == api.NodeReady:
			if !n.Cordoned && n.Load.Role == "node" {
				ready = append(ready, n.Name)
			}
		case now.Sub(n.LeaseUntil) >= r.After:
			lost = append(lost, n)
		}
	}
	for _, n := range lost {
		sbs, err := r.Records.ListSandboxes(ctx, store.Filter{Node: n.Name})
		if err != nil {
			r.Log.Warn("listing a lost node's sandboxes", "node", n.Name, "err", err)
			continue
		}
		for _, sb := range sbs {
			if sb.Recover != api.RecoverLatestCheckpoint || sb.Pool != "" || pick(sb.ID, ready) != r.Cluster.Name() {
				continue
			}
			if sb.State == api.StateSleeping && r.Sleeps != nil && r.Sleeps.SleepStored(ctx, sb) {
				continue
			}
			r.bringBack(ctx, n, sb)
		}
	}
}

// bringBack restores sb, of lost node n, here from its latest stored
// checkpoint; one without any is left (and said once in the log).
func (r *Recovery) bringBack(ctx context.Context, n *store.Node, sb *store.Sandbox) {
	cps, err := r.Records.ListCheckpoints(ctx, sb.ID)
	if err != nil {
		r.Log.Warn("listing the checkpoints of a lost node's sandbox", "sandbox", sb.ID, "err", err)
		return
	}
	slices.SortStableFunc(cps, func(a, b *store.Checkpoint) int { return a.CreatedAt.Compare(b.CreatedAt) })
	for i := len(cps) - 1; i >= 0; i-- {
		ok, err := r.Stored.Stored(ctx, sb.ID, cps[i].ID)
		if err != nil || !ok {
			continue
		}
		start := time.Now()
		var call *store.AuditCall
		if r.Audit != nil {
			call = store.NewAuditCall(api.AuditEvent{
				Time: store.Now(), Org: sb.Org, Key: RecoveryKey, Action: "sandbox.recover",
				Target: "sandboxes/" + sb.Name + "/checkpoints/" + cps[i].ID, Client: "node " + r.Cluster.Name(),
			}, r.Audit)
		}
		v, err := r.Service.RestoreCheckpoint(store.WithAudit(ctx, call), sb.ID, cps[i].ID)
		if ferr := call.Finish(context.WithoutCancel(ctx), store.Outcome(err)); ferr != nil {
			r.Log.Error("writing the audit record of a sandbox brought back", "sandbox", sb.ID, "err", ferr)
		}
		if err != nil {
			r.Log.Error("bringing back a lost node's sandbox", "sandbox", sb.ID, "name", sb.Name, "node", n.Name, "checkpoint", cps[i].ID, "err", err)
			return
		}
		r.Log.Warn("brought back a lost node's sandbox by its recover policy", "sandbox", sb.ID, "name", sb.Name,
			"from_node", n.Name, "checkpoint", cps[i].ID, "state", v.State, "ms", time.Since(start).Milliseconds())
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.warned == nil {
		r.warned = map[string]bool{}
	}
	if !r.warned[sb.ID] {
		r.warned[sb.ID] = true
		r.Log.Error("a lost node's sandbox has no stored checkpoint to be brought back from", "sandbox", sb.ID, "name", sb.Name, "node", n.Name)
	}
}

// RecoveryKey is the key of the audit records of sandboxes brought back
// by their recover policy, which no call's key asked for.
const RecoveryKey = "recovery"

// pick is the node of nodes that brings back sandbox id: the highest hash
// of the two (rendezvous hashing), "" when there is none.
func pick(id string, nodes []string) string {
	best, top := "", uint64(0)
	for _, n := range nodes {
		h := fnv.New64a()
		h.Write([]byte(id))
		h.Write([]byte{0})
		h.Write([]byte(n))
		if s := h.Sum64(); best == "" || s > top {
			best, top = n, s
		}
	}
	return best
}
