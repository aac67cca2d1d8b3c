package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// CreateSandbox adds sb; store.ErrExists if its id is taken, or its name
// within its org. A fenced store (SetFence) adds only records of its node.
func (s *Store) CreateSandbox(ctx context.Context, sb *store.Sandbox) error {
	if f := s.fence.Load(); f != nil && sb.Node != f.node {
		return fmt.Errorf("creating sandbox %s: its record names node %q, and this store writes for node %s only", sb.ID, sb.Node, f.node)
	}
	args, err := sandboxArgs(sb)
	if err != nil {
		return fmt.Errorf("creating sandbox %s: %w", sb.ID, err)
	}
	_, err = s.execOwned(ctx, "", `INSERT INTO sandboxes (`+columns.SandboxNames+`)
		VALUES (@id, @name, @state, @template, @image, @resources, @env, @labels, @idle,
			@http_port, @url, @from_source, @created_at, @net_index, @agent_token,
			@checkpoint_seq, @auto_seq, @error, @agent_gen, @restore_target, @secrets, @secret_files, @public, @network, @pool, @org,
			1, @node, @recover, @handover)`, args)
	if isUniqueViolation(err) {
		return fmt.Errorf("creating sandbox %s named %q: %w", sb.ID, sb.Name, store.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("creating sandbox %s: %w", sb.ID, err)
	}
	sb.Version = 1
	return nil
}

// GetSandbox finds a sandbox of org by id or name; store.ErrNotFound if
// none. When ref is one sandbox's id and another's name, the id wins. An
// org of "" finds one of any org.
func (s *Store) GetSandbox(ctx context.Context, org, ref string) (*store.Sandbox, error) {
	row := s.pool.QueryRow(ctx, `SELECT `+columns.SandboxNames+` FROM sandboxes
		WHERE (id = @ref OR name = @ref) AND (@org = '' OR org = @org)
		ORDER BY id = @ref DESC LIMIT 1`, pgx.NamedArgs{"ref": ref, "org": org})
	sb, err := scanSandbox(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("getting sandbox %s: %w", ref, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting sandbox %s: %w", ref, unavailable(err))
	}
	return sb, nil
}

// ListSandboxes lists the sandboxes of f's org (any org for "") that have
// every label of f, oldest first (by creation time, then id).
func (s *Store) ListSandboxes(ctx context.Context, f store.Filter) ([]*store.Sandbox, error) {
	labels, err := columns.MarshalMap(f.Labels)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	// @> compares keys and values as data, so a key with dots or quotes
	// in it needs no escaping.
	rows, err := s.pool.Query(ctx, `SELECT `+columns.SandboxNames+` FROM sandboxes
		WHERE (@org = '' OR org = @org) AND (@node = '' OR node = @node) AND labels @> @labels::jsonb
		ORDER BY created_at COLLATE "C", id COLLATE "C"`, pgx.NamedArgs{"org": f.Org, "node": f.Node, "labels": labels})
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", unavailable(err))
	}
	list, err := collect(rows, scanSandbox)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	return list, nil
}

// UpdateSandbox replaces the record with sb's id and version, and bumps
// sb.Version; store.ErrNotFound if none, store.ErrStale if the record has
// another version, store.ErrExists if sb's name is another sandbox's of
// its org. The sandbox's checkpoints are kept.
func (s *Store) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return fmt.Errorf("updating sandbox %s: %w", sb.ID, err)
	}
	tag, err := s.execOwned(ctx, sb.ID, `UPDATE sandboxes SET
		name = @name, state = @state, template = @template, image = @image,
		resources = @resources, env = @env, labels = @labels, idle = @idle,
		http_port = @http_port, url = @url, from_source = @from_source,
		created_at = @created_at, net_index = @net_index, agent_token = @agent_token,
		checkpoint_seq = @checkpoint_seq, auto_seq = @auto_seq, error = @error,
		agent_gen = @agent_gen, restore_target = @restore_target,
		secrets = @secrets, secret_files = @secret_files, public = @public, network = @network,
		pool = @pool, org = @org, node = @node, recover = @recover, handover = @handover, version = version + 1
		WHERE id = @id AND version = @version`, args)
	if isUniqueViolation(err) {
		return fmt.Errorf("updating sandbox %s to name %q: %w", sb.ID, sb.Name, store.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("updating sandbox %s: %w", sb.ID, err)
	}
	if err := oneRow(tag); err != nil {
		return fmt.Errorf("updating sandbox %s: %w", sb.ID, s.whyNotUpdated(ctx, sb.ID))
	}
	sb.Version++
	return nil
}

// whyNotUpdated tells an update that matched no row apart: the record is
// gone (store.ErrNotFound) or has another version (store.ErrStale).
func (s *Store) whyNotUpdated(ctx context.Context, id string) error {
	var found bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sandboxes WHERE id = $1)`, id).Scan(&found); err != nil {
		return unavailable(err)
	}
	if !found {
		return store.ErrNotFound
	}
	return store.ErrStale
}

// DeleteSandbox removes a sandbox and, by cascade, its checkpoints;
// store.ErrNotFound if none.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	tag, err := s.execOwned(ctx, id, `DELETE FROM sandboxes WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	if err := oneRow(tag); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	return nil
}

// UsedNetIndexes returns the NetIndex of every sandbox of node (every
// sandbox for ""), in increasing order.
func (s *Store) UsedNetIndexes(ctx context.Context, node string) ([]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT net_index FROM sandboxes WHERE $1 = '' OR node = $1 ORDER BY net_index`, node)
	if err != nil {
		return nil, fmt.Errorf("listing net indexes: %w", unavailable(err))
	}
	used, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("listing net indexes: %w", unavailable(err))
	}
	if used == nil {
		used = []int{}
	}
	return used, nil
}

// sandboxArgs are sb's columns as named arguments.
func sandboxArgs(sb *store.Sandbox) (pgx.NamedArgs, error) {
	c, err := columns.EncodeSandbox(sb)
	if err != nil {
		return nil, err
	}
	return pgx.NamedArgs{
		"network":        c.Network,
		"pool":           sb.Pool,
		"org":            sb.Org,
		"id":             sb.ID,
		"name":           sb.Name,
		"state":          string(sb.State),
		"template":       sb.Template,
		"image":          sb.Image,
		"resources":      c.Resources,
		"env":            c.Env,
		"labels":         c.Labels,
		"idle":           sb.Idle,
		"http_port":      sb.HTTPPort,
		"url":            sb.URL,
		"from_source":    c.From,
		"created_at":     c.CreatedAt,
		"net_index":      sb.NetIndex,
		"agent_token":    sb.LegacyAgentToken,
		"checkpoint_seq": sb.CheckpointSeq,
		"auto_seq":       sb.AutoSeq,
		"error":          sb.Error,
		"agent_gen":      sb.AgentGen,
		"restore_target": sb.RestoreTarget,
		"secrets":        c.Secrets,
		"secret_files":   c.SecretFiles,
		"public":         sb.Public,
		"version":        sb.Version,
		"node":           sb.Node,
		"recover":        sb.Recover,
		"handover":       sb.Handover,
	}, nil
}

// scanSandbox reads one row of columns.SandboxNames into a new record.
func scanSandbox(row pgx.Row) (*store.Sandbox, error) {
	var (
		sb    store.Sandbox
		state string
		c     columns.Sandbox
	)
	err := row.Scan(&sb.ID, &sb.Name, &state, &sb.Template, &sb.Image, &c.Resources, &c.Env, &c.Labels,
		&sb.Idle, &sb.HTTPPort, &sb.URL, &c.From, &c.CreatedAt, &sb.NetIndex, &sb.LegacyAgentToken,
		&sb.CheckpointSeq, &sb.AutoSeq, &sb.Error, &sb.AgentGen, &sb.RestoreTarget, &c.Secrets, &c.SecretFiles, &sb.Public, &c.Network, &sb.Pool, &sb.Org,
		&sb.Version, &sb.Node, &sb.Recover, &sb.Handover)
	if err != nil {
		return nil, err
	}
	sb.State = api.State(state)
	if err := c.Decode(&sb); err != nil {
		return nil, err
	}
	return &sb, nil
}
