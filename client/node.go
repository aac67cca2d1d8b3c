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

// DrainNode cordons node and moves every sandbox off it to other nodes
// (the operator's; a cluster with an object store), and answers each
// one's outcome.
func (c *Client) DrainNode(ctx context.Context, node string) (*api.DrainResult, error) {
	seg, err := segment("node", node)
	if err != nil {
		return nil, err
	}
	var res api.DrainResult
	if err := c.do(ctx, "POST", "/v1/nodes/"+seg+"/drain", nil, nil, &res); err != nil {
		return nil, fmt.Errorf("draining node %s: %w", node, err)
	}
	return &res, nil
}

// MoveSandbox moves a sandbox to node to ("" for the one placement picks)
// with its processes, by a memory checkpoint stored in the object store:
// same id, name and URL (the operator's). It answers the sandbox there.
func (c *Client) MoveSandbox(ctx context.Context, sandbox, to string) (*api.Sandbox, error) {
	seg, err := segment("sandbox", sandbox)
	if err != nil {
		return nil, err
	}
	var sb api.Sandbox
	if err := c.do(ctx, "POST", "/v1/sandboxes/"+seg+"/move", nil, api.MoveSandbox{To: to}, &sb); err != nil {
		return nil, fmt.Errorf("moving %s: %w", sandbox, err)
	}
	return &sb, nil
}
