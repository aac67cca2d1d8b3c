package client

import (
	"context"
	"fmt"
	"net/url"

	"loam.dev/loam/api"
)

// PutSecret stores value as the secret name (encrypted at rest by the
// daemon), replacing any value it had. Sandboxes that have the secret get
// the new value at their next boot, restore or fork. No call returns a
// secret's value.
func (c *Client) PutSecret(ctx context.Context, name, value string) (*api.Secret, error) {
	seg, err := segment("secret", name)
	if err != nil {
		return nil, err
	}
	var sec api.Secret
	if err := c.do(ctx, "PUT", "/v1/secrets/"+seg, nil, api.PutSecret{Value: value}, &sec); err != nil {
		return nil, fmt.Errorf("storing secret %s: %w", name, err)
	}
	return &sec, nil
}

// ListSecrets lists the secrets: names and times, never values.
func (c *Client) ListSecrets(ctx context.Context) ([]api.Secret, error) {
	var list api.SecretList
	if err := c.do(ctx, "GET", "/v1/secrets", nil, nil, &list); err != nil {
		return nil, fmt.Errorf("listing secrets: %w", err)
	}
	if list.Secrets == nil {
		list.Secrets = []api.Secret{}
	}
	return list.Secrets, nil
}

// DeleteSecret deletes the secret name. A secret that a sandbox has is a
// conflict (api.CodeConflict) unless force; with force the sandboxes keep
// running, and go without it from their next boot, restore or fork.
func (c *Client) DeleteSecret(ctx context.Context, name string, force bool) error {
	seg, err := segment("secret", name)
	if err != nil {
		return err
	}
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	if err := c.do(ctx, "DELETE", "/v1/secrets/"+seg, q, nil, nil); err != nil {
		return fmt.Errorf("deleting secret %s: %w", name, err)
	}
	return nil
}
