package client

import (
	"context"
	"fmt"
	"net/url"
	"sort"

	"loam.dev/loam/api"
)

// ListOptions filters ListSandboxes.
type ListOptions struct {
	// Labels keeps only sandboxes that carry every one of these labels with
	// these values.
	Labels map[string]string
}

// CreateSandbox creates a sandbox and returns it once the daemon has made it.
// With req.From set it makes a fork; Fork and ForkWith say that more plainly.
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandbox) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.do(ctx, "POST", "/v1/sandboxes", nil, req, &sb); err != nil {
		if req.Name != "" {
			return nil, fmt.Errorf("creating sandbox %s: %w", req.Name, err)
		}
		return nil, fmt.Errorf("creating a sandbox: %w", err)
	}
	return &sb, nil
}

// ListSandboxes lists the sandboxes, filtered by opts.
func (c *Client) ListSandboxes(ctx context.Context, opts ListOptions) ([]api.Sandbox, error) {
	var q url.Values
	if len(opts.Labels) > 0 {
		keys := make([]string, 0, len(opts.Labels))
		for k := range opts.Labels {
			keys = append(keys, k)
		}
		// Sorted so the same filter always makes the same URL.
		sort.Strings(keys)
		q = url.Values{}
		for _, k := range keys {
			q.Add("label", k+"="+opts.Labels[k])
		}
	}
	var list api.SandboxList
	if err := c.do(ctx, "GET", "/v1/sandboxes", q, nil, &list); err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	if list.Sandboxes == nil {
		list.Sandboxes = []api.Sandbox{}
	}
	return list.Sandboxes, nil
}

// GetSandbox returns the sandbox ref names (a name or an id).
func (c *Client) GetSandbox(ctx context.Context, ref string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.sandboxCall(ctx, "GET", ref, "", nil, &sb); err != nil {
		return nil, fmt.Errorf("getting sandbox %s: %w", ref, err)
	}
	return &sb, nil
}

// UpdateSandbox changes the settings of a sandbox that may change while it
// lives: its labels (replaced as a whole), idle time, http_port and public.
// Fields left nil stay as they are. It neither wakes nor touches a
// sandbox; each change takes effect at once.
func (c *Client) UpdateSandbox(ctx context.Context, ref string, req api.UpdateSandbox) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.sandboxCall(ctx, "PATCH", ref, "", req, &sb); err != nil {
		return nil, fmt.Errorf("updating sandbox %s: %w", ref, err)
	}
	return &sb, nil
}

// OpenURL is a sandbox's URL with its access token in the query
// (?loam_token=), which a browser's first visit turns into a cookie.
func OpenURL(sandboxURL, token string) string {
	u, err := url.Parse(sandboxURL)
	if err != nil {
		return sandboxURL
	}
	if u.Path == "" {
		u.Path = "/"
	}
	u.RawQuery = url.Values{"loam_token": {token}}.Encode()
	return u.String()
}

// AccessToken returns a sandbox's URL and the token that opens it when the
// sandbox is not public: send it as the header X-Loam-Access-Token, or once
// as ?loam_token= in a browser, which then keeps it in a cookie.
func (c *Client) AccessToken(ctx context.Context, ref string) (*api.AccessToken, error) {
	var at api.AccessToken
	if err := c.sandboxCall(ctx, "GET", ref, "/access-token", nil, &at); err != nil {
		return nil, fmt.Errorf("getting the access token of sandbox %s: %w", ref, err)
	}
	return &at, nil
}

// DeleteSandbox deletes the sandbox ref names, and its checkpoints with it.
func (c *Client) DeleteSandbox(ctx context.Context, ref string) error {
	if err := c.sandboxCall(ctx, "DELETE", ref, "", nil, nil); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", ref, err)
	}
	return nil
}

// Templates lists the templates sandboxes can be made from.
func (c *Client) Templates(ctx context.Context) ([]api.Template, error) {
	var list api.TemplateList
	if err := c.do(ctx, "GET", "/v1/templates", nil, nil, &list); err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	if list.Templates == nil {
		list.Templates = []api.Template{}
	}
	return list.Templates, nil
}

// sandboxCall sends a request to /v1/sandboxes/{ref}{rest}; rest is already
// escaped.
func (c *Client) sandboxCall(ctx context.Context, method, ref, rest string, in, out any) error {
	seg, err := segment("sandbox", ref)
	if err != nil {
		return err
	}
	return c.do(ctx, method, "/v1/sandboxes/"+seg+rest, nil, in, out)
}

// Sleep puts sandbox ref to sleep now: its memory and disk are kept and it
// uses no CPU or memory until it is woken. It returns the sandbox, sleeping.
func (c *Client) Sleep(ctx context.Context, ref string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.sandboxCall(ctx, "POST", ref, "/sleep", nil, &sb); err != nil {
		return nil, fmt.Errorf("putting %s to sleep: %w", ref, err)
	}
	return &sb, nil
}

// Wake wakes sandbox ref where it was, with its processes, and returns it
// running. Every call that needs a sandbox running wakes it too. A sandbox
// in state error (its Reason says why) is booted again on its disk: its
// files are kept, its processes start afresh; only Wake does that.
func (c *Client) Wake(ctx context.Context, ref string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := c.sandboxCall(ctx, "POST", ref, "/wake", nil, &sb); err != nil {
		return nil, fmt.Errorf("waking %s: %w", ref, err)
	}
	return &sb, nil
}
