package client

import (
	"context"
	"fmt"

	"loam.dev/loam/api"
)

// Org is the caller's org: its quota and what it uses now.
func (c *Client) Org(ctx context.Context) (*api.Org, error) {
	var o api.Org
	if err := c.do(ctx, "GET", "/v1/org", nil, nil, &o); err != nil {
		return nil, fmt.Errorf("getting the org: %w", err)
	}
	return &o, nil
}

// ListOrgs lists every org with its quota and use. Only the operator (the
// admin token of loam serve) may.
func (c *Client) ListOrgs(ctx context.Context) ([]api.Org, error) {
	var list api.OrgList
	if err := c.do(ctx, "GET", "/v1/orgs", nil, nil, &list); err != nil {
		return nil, fmt.Errorf("listing orgs: %w", err)
	}
	if list.Orgs == nil {
		list.Orgs = []api.Org{}
	}
	return list.Orgs, nil
}

// SetQuota replaces org's quota (a nil field is unlimited) and returns
// the org with it. Only the operator may. A call that would take the org
// past its quota then fails with api.CodeLimit.
func (c *Client) SetQuota(ctx context.Context, org string, q api.Quota) (*api.Org, error) {
	seg, err := segment("org", org)
	if err != nil {
		return nil, err
	}
	var o api.Org
	if err := c.do(ctx, "PUT", "/v1/orgs/"+seg+"/quota", nil, q, &o); err != nil {
		return nil, fmt.Errorf("setting the quota of %s: %w", org, err)
	}
	return &o, nil
}
