package client

import (
	"context"
	"fmt"
	"net/http"

	"loam.dev/loam/api"
)

// SetCheckpointPool keeps a warm pool of size forks of checkpoint ref of
// sandbox: restored ahead of time, so that a fork of the checkpoint claims
// one and answers at once. 0 drains the pool.
func (c *Client) SetCheckpointPool(ctx context.Context, sandbox, ref string, size int) (*api.Pool, error) {
	var p api.Pool
	seg, err := segment("checkpoint", ref)
	if err != nil {
		return nil, err
	}
	if err := c.sandboxCall(ctx, http.MethodPut, sandbox, "/checkpoints/"+seg+"/pool", api.SetPool{Size: size}, &p); err != nil {
		return nil, fmt.Errorf("setting the pool of checkpoint %s of %s: %w", ref, sandbox, err)
	}
	return &p, nil
}

// CheckpointPool reports the warm pool of checkpoint ref of sandbox (size 0
// when it has none).
func (c *Client) CheckpointPool(ctx context.Context, sandbox, ref string) (*api.Pool, error) {
	var p api.Pool
	if err := c.checkpointCall(ctx, http.MethodGet, sandbox, ref, "/pool", &p); err != nil {
		return nil, fmt.Errorf("getting the pool of checkpoint %s of %s: %w", ref, sandbox, err)
	}
	return &p, nil
}

// SetTemplatePool keeps a warm pool of size sandboxes of template name (a
// built-in or a checkpoint template), so that a create of it that asks for
// no other resources claims one. 0 drains the pool.
func (c *Client) SetTemplatePool(ctx context.Context, name string, size int) (*api.Pool, error) {
	seg, err := segment("template", name)
	if err != nil {
		return nil, err
	}
	var p api.Pool
	if err := c.do(ctx, http.MethodPut, "/v1/templates/"+seg+"/pool", nil, api.SetPool{Size: size}, &p); err != nil {
		return nil, fmt.Errorf("setting the pool of template %s: %w", name, err)
	}
	return &p, nil
}

// TemplatePool reports the warm pool of template name (size 0 when it has
// none).
func (c *Client) TemplatePool(ctx context.Context, name string) (*api.Pool, error) {
	seg, err := segment("template", name)
	if err != nil {
		return nil, err
	}
	var p api.Pool
	if err := c.do(ctx, http.MethodGet, "/v1/templates/"+seg+"/pool", nil, nil, &p); err != nil {
		return nil, fmt.Errorf("getting the pool of template %s: %w", name, err)
	}
	return &p, nil
}
