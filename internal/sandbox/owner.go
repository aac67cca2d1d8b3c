package sandbox

import (
	"context"
	"fmt"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Leases tells whether a node of the cluster stopped answering: its lease
// ran out, at since (internal/cluster keeps them).
type Leases interface {
	Lapsed(node string) (since time.Time, lapsed bool)
}

// ownership is which sandboxes this daemon acts on: in a cluster, those
// whose record names its node; on one machine (node ""), all of them.
type ownership struct {
	node   string
	leases Leases // nil on one machine
}

// filter narrows a listing to the sandboxes of this daemon's node: a node
// recovers, sweeps and counts its own sandboxes alone.
func (o ownership) filter() store.Filter {
	return store.Filter{Node: o.node}
}

// lapsed tells whether sb's node, another than this one, stopped
// answering (since when). A removed node's sandbox says so itself.
func (o ownership) lapsed(sb *store.Sandbox) (time.Time, bool) {
	if o.leases == nil || sb.Node == "" || sb.Node == o.node || removedNode(sb) {
		return time.Time{}, false
	}
	return o.leases.Lapsed(sb.Node)
}

// refuse is nil for a sandbox of this node, else unavailable naming the
// node that owns it: only a sandbox's owner acts on its runtime, disk and
// network. A call for it is passed to its owner before it reaches the
// Manager (see internal/cluster); this is the guard.
func (o ownership) refuse(sb *store.Sandbox) error {
	if sb.Node == o.node {
		return nil
	}
	if since, lapsed := o.lapsed(sb); lapsed {
		return api.Errorf(api.CodeUnavailable, "sandbox %s is on node %s, which stopped answering at %s: try again when it is back",
			sb.Name, sb.Node, since.UTC().Format(time.RFC3339))
	}
	return api.Errorf(api.CodeUnavailable, "sandbox %s is on node %s, and this node (%s) does not act on it", sb.Name, sb.Node, o.node)
}

// removedNode tells whether sb's node was removed for good: its record is
// all that is left, in state error.
func removedNode(sb *store.Sandbox) bool {
	return sb.State == api.StateError && sb.Error == api.NodeRemovedReason
}

// nodeSilent is the reason of a sandbox whose node stopped answering.
func nodeSilent(node string, since time.Time) string {
	return fmt.Sprintf("node %s stopped answering at %s", node, since.UTC().Format(time.RFC3339))
}

// lookupOwn finds a sandbox to act on, as m.lookup does, and refuses one
// another node owns (ownership.refuse).
func lookupOwn(ctx context.Context, m *Manager, ref string) (*store.Sandbox, error) {
	sb, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := m.owner.refuse(sb); err != nil {
		return nil, err
	}
	return sb, nil
}
