package client

import (
	"context"
	"fmt"
	"net/url"

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

// CreateOrg makes an org, with no quota and no keys (CreateOrgKey makes
// its first). Only the operator may.
func (c *Client) CreateOrg(ctx context.Context, name string) (*api.Org, error) {
	var o api.Org
	if err := c.do(ctx, "POST", "/v1/orgs", nil, api.CreateOrg{Name: name}, &o); err != nil {
		return nil, fmt.Errorf("making org %s: %w", name, err)
	}
	return &o, nil
}

// DeleteOrg deletes an org and its keys. An org that still has sandboxes
// fails with api.CodeConflict unless all is set: then everything in it
// is deleted too. Only the operator may.
func (c *Client) DeleteOrg(ctx context.Context, org string, all bool) error {
	seg, err := segment("org", org)
	if err != nil {
		return err
	}
	var q url.Values
	if all {
		q = url.Values{"all": {"true"}}
	}
	if err := c.do(ctx, "DELETE", "/v1/orgs/"+seg, q, nil, nil); err != nil {
		return fmt.Errorf("deleting org %s: %w", org, err)
	}
	return nil
}

// CreateOrgKey makes a key of org, as CreateKey makes one of the caller's;
// the answer holds its secret, which nothing shows again. Only the
// operator may.
func (c *Client) CreateOrgKey(ctx context.Context, org string, req api.CreateKey) (*api.Key, error) {
	seg, err := segment("org", org)
	if err != nil {
		return nil, err
	}
	var k api.Key
	if err := c.do(ctx, "POST", "/v1/orgs/"+seg+"/keys", nil, req, &k); err != nil {
		return nil, fmt.Errorf("making key %s of org %s: %w", req.Name, org, err)
	}
	return &k, nil
}
