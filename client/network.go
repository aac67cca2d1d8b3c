package client

import (
	"context"
	"fmt"

	"loam.dev/loam/api"
)

// SetNetwork replaces the network policy of a sandbox and returns the
// sandbox. A running sandbox gets the policy at once: its connections that
// the new policy forbids are cut.
func (c *Client) SetNetwork(ctx context.Context, sandbox string, p api.NetworkPolicy) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.sandboxCall(ctx, "PUT", sandbox, "/network", p, &sb); err != nil {
		return nil, fmt.Errorf("setting the network of %s: %w", sandbox, err)
	}
	return &sb, nil
}
