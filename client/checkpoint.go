package client

import (
	"context"
	"fmt"

	"loam.dev/loam/api"
)

// CreateCheckpoint takes a checkpoint of sandbox. A memory checkpoint (the
// default: req.Memory nil or true) pauses the sandbox while it is taken and
// ends every exec stream on it; a disk-only one does neither.
func (c *Client) CreateCheckpoint(ctx context.Context, sandbox string, req api.CreateCheckpoint) (*api.Checkpoint, error) {
	var cp api.Checkpoint
	if err := c.sandboxCall(ctx, "POST", sandbox, "/checkpoints", req, &cp); err != nil {
		return nil, fmt.Errorf("checkpointing %s: %w", sandbox, err)
	}
	return &cp, nil
}

// ListCheckpoints lists sandbox's checkpoints, oldest first.
func (c *Client) ListCheckpoints(ctx context.Context, sandbox string) ([]api.Checkpoint, error) {
	var list api.CheckpointList
	if err := c.sandboxCall(ctx, "GET", sandbox, "/checkpoints", nil, &list); err != nil {
		return nil, fmt.Errorf("listing checkpoints of %s: %w", sandbox, err)
	}
	if list.Checkpoints == nil {
		list.Checkpoints = []api.Checkpoint{}
	}
	return list.Checkpoints, nil
}

// GetCheckpoint returns the checkpoint ref (an id such as v1, or a name) of sandbox.
func (c *Client) GetCheckpoint(ctx context.Context, sandbox, ref string) (*api.Checkpoint, error) {
	var cp api.Checkpoint
	if err := c.checkpointCall(ctx, "GET", sandbox, ref, "", &cp); err != nil {
		return nil, fmt.Errorf("getting checkpoint %s of %s: %w", ref, sandbox, err)
	}
	return &cp, nil
}

// DeleteCheckpoint deletes the checkpoint ref of sandbox. Forks made from it
// are independent of it and carry on.
func (c *Client) DeleteCheckpoint(ctx context.Context, sandbox, ref string) error {
	if err := c.checkpointCall(ctx, "DELETE", sandbox, ref, "", nil); err != nil {
		return fmt.Errorf("deleting checkpoint %s of %s: %w", ref, sandbox, err)
	}
	return nil
}

// RestoreCheckpoint rolls sandbox back to the checkpoint ref and returns the
// sandbox as it is after the restore. The daemon first keeps the current state
// as an automatic checkpoint (auto-N), so a restore can be undone. Every exec
// stream on the sandbox ends.
func (c *Client) RestoreCheckpoint(ctx context.Context, sandbox, ref string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.checkpointCall(ctx, "POST", sandbox, ref, "/restore", &sb); err != nil {
		return nil, fmt.Errorf("restoring %s to %s: %w", sandbox, ref, err)
	}
	return &sb, nil
}

// Fork makes a new, independent sandbox called name from the checkpoint of
// sandbox; an empty name lets the daemon choose one. Use ForkWith to give the
// fork its own env, labels, idle timeout and so on.
func (c *Client) Fork(ctx context.Context, sandbox, checkpoint, name string) (*api.Sandbox, error) {
	return c.ForkWith(ctx, sandbox, checkpoint, api.CreateSandbox{Name: name})
}

// ForkWith makes a new sandbox from the checkpoint of sandbox, as described by
// req: req.From is set from sandbox and checkpoint, and req may not give a
// template, image or resources (they come from the checkpoint).
func (c *Client) ForkWith(ctx context.Context, sandbox, checkpoint string, req api.CreateSandbox) (*api.Sandbox, error) {
	if sandbox == "" || checkpoint == "" {
		return nil, api.Errorf(api.CodeInvalid, "a fork needs a sandbox and a checkpoint")
	}
	req.From = &api.ForkSource{Sandbox: sandbox, Checkpoint: checkpoint}
	var sb api.Sandbox
	if err := c.do(ctx, "POST", "/v1/sandboxes", nil, req, &sb); err != nil {
		return nil, fmt.Errorf("forking %s at %s: %w", sandbox, checkpoint, err)
	}
	return &sb, nil
}

// ForkMany makes req.Count forks (1 to api.MaxForkCount) of the checkpoint
// of sandbox at once, as ForkWith makes one: named NAME-1 … NAME-N after
// req.Name, or by the daemon without one. The list holds every fork in
// order, each with its sandbox or its own error (in a cluster, each fork
// is placed on its own). When no fork was made the error is the first
// one's, an *api.Error as for one fork.
func (c *Client) ForkMany(ctx context.Context, sandbox, checkpoint string, req api.CreateSandbox) (*api.ForkList, error) {
	if sandbox == "" || checkpoint == "" {
		return nil, api.Errorf(api.CodeInvalid, "a fork needs a sandbox and a checkpoint")
	}
	if req.Count < 1 {
		return nil, api.Errorf(api.CodeInvalid, "count: %d; a create makes 1 to %d forks at once", req.Count, api.MaxForkCount)
	}
	req.From = &api.ForkSource{Sandbox: sandbox, Checkpoint: checkpoint}
	var list api.ForkList
	if err := c.do(ctx, "POST", "/v1/sandboxes", nil, req, &list); err != nil {
		return nil, fmt.Errorf("forking %s at %s %d times: %w", sandbox, checkpoint, req.Count, err)
	}
	return &list, nil
}

func (c *Client) checkpointCall(ctx context.Context, method, sandbox, ref, rest string, out any) error {
	seg, err := segment("checkpoint", ref)
	if err != nil {
		return err
	}
	return c.sandboxCall(ctx, method, sandbox, "/checkpoints/"+seg+rest, nil, out)
}
