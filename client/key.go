package client

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"loam.dev/loam/api"
)

// CreateKey makes an API key of the caller's org. The answer's Secret is
// the key itself, shown by no other call: keep it.
func (c *Client) CreateKey(ctx context.Context, req api.CreateKey) (*api.Key, error) {
	var k api.Key
	if err := c.do(ctx, "POST", "/v1/keys", nil, req, &k); err != nil {
		return nil, fmt.Errorf("making key %s: %w", req.Name, err)
	}
	return &k, nil
}

// ListKeys lists the org's API keys, oldest first, never their secrets.
func (c *Client) ListKeys(ctx context.Context) ([]api.Key, error) {
	var list api.KeyList
	if err := c.do(ctx, "GET", "/v1/keys", nil, nil, &list); err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	if list.Keys == nil {
		list.Keys = []api.Key{}
	}
	return list.Keys, nil
}

// RevokeKey revokes key id: new calls with it fail, and its open streams end.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	seg, err := segment("key", id)
	if err != nil {
		return err
	}
	if err := c.do(ctx, "DELETE", "/v1/keys/"+seg, nil, nil, nil); err != nil {
		return fmt.Errorf("revoking key %s: %w", id, err)
	}
	return nil
}

// AuditOptions narrow Audit; the zero value is the oldest page of the log.
type AuditOptions struct {
	// Since: events at or after this time. SinceSeq: events after this
	// seq (the last one a client has, to page on).
	Since    time.Time
	SinceSeq int64
	// Action: events of this action only (sandbox.create, exec.start).
	Action string
	// Org: the operator's only, one org's events.
	Org string
	// Limit: at most this many (0: the daemon's page, 1000).
	Limit int
}

// Audit reads the audit log, oldest first.
func (c *Client) Audit(ctx context.Context, o AuditOptions) ([]api.AuditEvent, error) {
	q := url.Values{}
	if !o.Since.IsZero() {
		q.Set("since", o.Since.UTC().Format(time.RFC3339Nano))
	}
	if o.SinceSeq > 0 {
		q.Set("since_seq", strconv.FormatInt(o.SinceSeq, 10))
	}
	if o.Action != "" {
		q.Set("action", o.Action)
	}
	if o.Org != "" {
		q.Set("org", o.Org)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	var list api.AuditList
	if err := c.do(ctx, "GET", "/v1/audit", q, nil, &list); err != nil {
		return nil, fmt.Errorf("reading the audit log: %w", err)
	}
	if list.Events == nil {
		list.Events = []api.AuditEvent{}
	}
	return list.Events, nil
}
