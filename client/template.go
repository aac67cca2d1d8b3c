package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"loam.dev/loam/api"
)

// TemplateOption sets more of a CreateTemplate request.
type TemplateOption func(*api.CreateTemplate)

// WithPool keeps a warm pool of size sandboxes of the new template (see
// SetTemplatePool).
func WithPool(size int) TemplateOption {
	return func(r *api.CreateTemplate) { r.Pool = size }
}

// CreateTemplate keeps checkpoint cp of sandbox sb as template name, memory
// included when the checkpoint has it. The template outlives the sandbox
// and the checkpoint; sandboxes are made from it with Template: name.
func (c *Client) CreateTemplate(ctx context.Context, name, sb, cp string, opts ...TemplateOption) (*api.Template, error) {
	var tpl api.Template
	req := api.CreateTemplate{Name: name, From: &api.ForkSource{Sandbox: sb, Checkpoint: cp}}
	for _, o := range opts {
		o(&req)
	}
	if err := c.do(ctx, http.MethodPost, "/v1/templates", nil, req, &tpl); err != nil {
		return nil, fmt.Errorf("making template %s from %s/%s: %w", name, sb, cp, err)
	}
	return &tpl, nil
}

// DeleteTemplate deletes a template made from a checkpoint. One that a
// sandbox uses is a conflict; a built-in one is forbidden.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	seg, err := segment("template", name)
	if err != nil {
		return err
	}
	if err := c.do(ctx, http.MethodDelete, "/v1/templates/"+seg, nil, nil, nil); err != nil {
		return fmt.Errorf("deleting template %s: %w", name, err)
	}
	return nil
}

// ExportTemplate writes template name to w as one archive (a zstd-compressed
// tar of its disk and memory image, with a manifest and checksums), which
// ImportTemplate loads on another daemon. It returns the bytes written.
func (c *Client) ExportTemplate(ctx context.Context, name string, w io.Writer) (int64, error) {
	seg, err := segment("template", name)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/templates/"+seg+"/export", nil)
	if err != nil {
		return 0, fmt.Errorf("exporting template %s: %w", name, err)
	}
	c.authorize(req.Header)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, c.transportError(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("exporting template %s: %w", name, decodeError(resp))
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("exporting template %s: %w", name, err)
	}
	return n, nil
}

// ImportTemplate makes template name from an archive written by
// ExportTemplate. A damaged archive is refused (invalid) and leaves nothing.
func (c *Client) ImportTemplate(ctx context.Context, name string, r io.Reader) (*api.Template, error) {
	seg, err := segment("template", name)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.base+"/v1/templates/"+seg+"/import", r)
	if err != nil {
		return nil, fmt.Errorf("importing template %s: %w", name, err)
	}
	c.authorize(req.Header)
	req.Header.Set("Content-Type", "application/zstd")
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.transportError(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("importing template %s: %w", name, decodeError(resp))
	}
	var tpl api.Template
	if err := json.NewDecoder(resp.Body).Decode(&tpl); err != nil {
		return nil, fmt.Errorf("importing template %s: %w", name, err)
	}
	return &tpl, nil
}
