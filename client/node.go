package client

import (
	"context"
	"fmt"
	"net/url"

	"loam.dev/loam/api"
)

// ListNodes lists the nodes of the daemon's cluster, by name (empty for a
// daemon that runs alone). Only the operator may.
func (c *Client) ListNodes(ctx context.Context) ([]api.Node, error) {
	var list api.NodeList
	if err := c.do(ctx, "GET", "/v1/nodes", nil, nil, &list); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	if list.Nodes == nil {
		list.Nodes = []api.Node{}
	}
	return list.Nodes, nil
}

// CordonNode stops (on) or resumes placements on node, and returns it.
// Only the operator may.
func (c *Client) CordonNode(ctx context.Context, node string, on bool) (*api.Node, error) {
	seg, err := segment("node", node)
	if err != nil {
		return nil, err
	}
	verb := "uncordon"
	if on {
		verb = "cordon"
	}
	var n api.Node
	if err := c.do(ctx, "POST", "/v1/nodes/"+seg+"/"+verb, nil, nil, &n); err != nil {
		return nil, fmt.Errorf("%sing node %s: %w", verb, node, err)
	}
	return &n, nil
}

// RemoveNode declares node gone for good: its sandboxes are then in state
// error ("node removed"). It returns how many. Only the operator may, and
// only once the node stopped renewing its lease.
func (c *Client) RemoveNode(ctx context.Context, node string) (int, error) {
	seg, err := segment("node", node)
	if err != nil {
		return 0, err
	}
	var out api.NodeRemoved
	if err := c.do(ctx, "DELETE", "/v1/nodes/"+seg, url.Values{"force": {"true"}}, nil, &out); err != nil {
		return 0, fmt.Errorf("removing node %s: %w", node, err)
	}
	return out.Sandboxes, nil
}
