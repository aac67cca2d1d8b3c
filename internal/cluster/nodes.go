package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// NodeRecords are the nodes' records an operator changes.
type NodeRecords interface {
	ListNodes(ctx context.Context) ([]*store.Node, time.Time, error)
	CordonNode(ctx context.Context, name string, on bool) error
	RemoveNode(ctx context.Context, name string) (int, error)
}

// Nodes answers the operator's calls about the cluster's nodes (GET
// /v1/nodes and the rest), from any node.
type Nodes struct {
	recs NodeRecords
}

// NewNodes serves the nodes recs keeps.
func NewNodes(recs NodeRecords) *Nodes {
	return &Nodes{recs: recs}
}

// View is n as the API shows it, at the database's time now.
func View(n *store.Node, now time.Time) api.Node {
	return api.Node{
		Name: n.Name, Address: n.Address, State: n.State(now), Cordoned: n.Cordoned, NodeLoad: n.Load,
		JoinedAt: n.JoinedAt.UTC(), RenewedAt: n.RenewedAt.UTC(), LeaseUntil: n.LeaseUntil.UTC(),
	}
}

// List lists the nodes not removed, by name.
func (ns *Nodes) List(ctx context.Context) ([]api.Node, error) {
	list, now, err := ns.recs.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Node, 0, len(list))
	for _, n := range list {
		out = append(out, View(n, now))
	}
	return out, nil
}

// get is node name as the API shows it.
func (ns *Nodes) get(ctx context.Context, name string) (*api.Node, error) {
	list, now, err := ns.recs.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range list {
		if n.Name == name {
			v := View(n, now)
			return &v, nil
		}
	}
	return nil, notFound(name)
}

func notFound(name string) error {
	return api.Errorf(api.CodeNotFound, "node %q not found (loam nodes lists them)", name)
}

// Cordon stops (on) or resumes placements on node name; its sandboxes
// run on either way.
func (ns *Nodes) Cordon(ctx context.Context, name string, on bool) (*api.Node, error) {
	if err := ns.recs.CordonNode(ctx, name, on); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, notFound(name)
		}
		return nil, err
	}
	return ns.get(ctx, name)
}

// Remove declares node name gone for good: each of its sandboxes is in
// state error ("node removed"), and the node can never join again under
// that name. A node that still renews its lease is refused: stop its
// daemon first (a node removed while it runs stops itself).
func (ns *Nodes) Remove(ctx context.Context, name string) (int, error) {
	n, err := ns.get(ctx, name)
	if err != nil {
		return 0, err
	}
	if n.State == api.NodeReady {
		return 0, api.Errorf(api.CodeConflict, "node %s is ready (its lease runs until %s): stop its daemon first, or cordon it to place nothing new there",
			name, n.LeaseUntil.Format(time.RFC3339))
	}
	marked, err := ns.recs.RemoveNode(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return 0, notFound(name)
	}
	if err != nil {
		return 0, fmt.Errorf("removing node %s: %w", name, err)
	}
	return marked, nil
}
