package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// CreateSandbox adds sb; store.ErrExists if its id is taken, or its name
// within its org.
func (s *Store) CreateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return fmt.Errorf("creating sandbox %s: %w", sb.ID, err)
	}
	_, err = s.exec(ctx, `INSERT INTO sandboxes (`+columns.SandboxNames+`)
		VALUES (:id, :name, :state, :template, :image, :resources, :env, :labels, :idle,
			:http_port, :url, :from_source, :created_at, :net_index, :agent_token,
			:checkpoint_seq, :auto_seq, :error, :agent_gen, :restore_target, :secrets, :secret_files, :public, :network, :pool, :org,
			1, :node, :recover, :handover)`, args...)
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
	row := s.r.QueryRowContext(ctx, `SELECT `+columns.SandboxNames+` FROM sandboxes
		WHERE (id = :ref OR name = :ref) AND (:org = '' OR org = :org)
		ORDER BY id = :ref DESC LIMIT 1`, sql.Named("ref", ref), sql.Named("org", org))
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("getting sandbox %s: %w", ref, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting sandbox %s: %w", ref, err)
	}
	return sb, nil
}

// ListSandboxes lists the sandboxes that have every label of f, oldest
// first (by creation time, then id).
func (s *Store) ListSandboxes(ctx context.Context, f store.Filter) ([]*store.Sandbox, error) {
	var b strings.Builder
	b.WriteString(`SELECT ` + columns.SandboxNames + ` FROM sandboxes`)
	// json_each compares keys as data, so a key with dots or quotes in it
	// needs no escaping, unlike a json_extract path.
	var (
		args  []any
		conds []string
	)
	if f.Org != "" {
		conds = append(conds, `org = ?`)
		args = append(args, f.Org)
	}
	if f.Node != "" {
		conds = append(conds, `node = ?`)
		args = append(args, f.Node)
	}
	for _, k := range slices.Sorted(maps.Keys(f.Labels)) {
		conds = append(conds, `EXISTS (SELECT 1 FROM json_each(sandboxes.labels) WHERE key = ? AND value = ?)`)
		args = append(args, k, f.Labels[k])
	}
	if len(conds) > 0 {
		b.WriteString(" WHERE " + strings.Join(conds, " AND "))
	}
	b.WriteString(" ORDER BY created_at, id")

	rows, err := s.r.QueryContext(ctx, b.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	defer rows.Close()
	list := []*store.Sandbox{}
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("listing sandboxes: %w", err)
		}
		list = append(list, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	return list, nil
}

// UpdateSandbox replaces the record with sb's id and version, and bumps
// sb.Version; store.ErrNotFound if none, store.ErrStale if the record has
// another version, store.ErrExists if sb's name is another sandbox's. The
// sandbox's checkpoints are kept.
func (s *Store) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return fmt.Errorf("updating sandbox %s: %w", sb.ID, err)
	}
	// An UPDATE, never INSERT OR REPLACE: REPLACE deletes the old row
	// first, and the delete would cascade to the checkpoints.
	res, err := s.exec(ctx, `UPDATE sandboxes SET
		name = :name, state = :state, template = :template, image = :image,
		resources = :resources, env = :env, labels = :labels, idle = :idle,
		http_port = :http_port, url = :url, from_source = :from_source,
		created_at = :created_at, net_index = :net_index, agent_token = :agent_token,
		checkpoint_seq = :checkpoint_seq, auto_seq = :auto_seq, error = :error,
		agent_gen = :agent_gen, restore_target = :restore_target,
		secrets = :secrets, secret_files = :secret_files, public = :public, network = :network,
		pool = :pool, org = :org, node = :node, recover = :recover, handover = :handover, version = version + 1
		WHERE id = :id AND version = :version`, args...)
	if isUniqueViolation(err) {
		return fmt.Errorf("updating sandbox %s to name %q: %w", sb.ID, sb.Name, store.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("updating sandbox %s: %w", sb.ID, err)
	}
	if err := oneRow(res); err != nil {
		return fmt.Errorf("updating sandbox %s: %w", sb.ID, s.whyNotUpdated(ctx, sb.ID))
	}
	sb.Version++
	return nil
}

// whyNotUpdated tells an update that matched no row apart: the record is
// gone (store.ErrNotFound) or has another version (store.ErrStale).
func (s *Store) whyNotUpdated(ctx context.Context, id string) error {
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM sandboxes WHERE id = ?`, id).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return store.ErrStale
}

// DeleteSandbox removes a sandbox and, by cascade, its checkpoints;
// store.ErrNotFound if none.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	res, err := s.exec(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	if err := oneRow(res); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	return nil
}

// UsedNetIndexes returns the NetIndex of every sandbox of node (every
// sandbox for ""), in increasing order.
func (s *Store) UsedNetIndexes(ctx context.Context, node string) ([]int, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT net_index FROM sandboxes WHERE ? = '' OR node = ? ORDER BY net_index`, node, node)
	if err != nil {
		return nil, fmt.Errorf("listing net indexes: %w", err)
	}
	defer rows.Close()
	used := []int{}
	for rows.Next() {
		var i int
		if err := rows.Scan(&i); err != nil {
			return nil, fmt.Errorf("listing net indexes: %w", err)
		}
		used = append(used, i)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing net indexes: %w", err)
	}
	return used, nil
}

// sandboxArgs are sb's columns as named arguments.
func sandboxArgs(sb *store.Sandbox) ([]any, error) {
	c, err := columns.EncodeSandbox(sb)
	if err != nil {
		return nil, err
	}
	return []any{
		sql.Named("network", c.Network),
		sql.Named("pool", sb.Pool),
		sql.Named("org", sb.Org),
		sql.Named("id", sb.ID),
		sql.Named("name", sb.Name),
		sql.Named("state", string(sb.State)),
		sql.Named("template", sb.Template),
		sql.Named("image", sb.Image),
		sql.Named("resources", c.Resources),
		sql.Named("env", c.Env),
		sql.Named("labels", c.Labels),
		sql.Named("idle", sb.Idle),
		sql.Named("http_port", sb.HTTPPort),
		sql.Named("url", sb.URL),
		sql.Named("from_source", c.From),
		sql.Named("created_at", c.CreatedAt),
		sql.Named("net_index", sb.NetIndex),
		sql.Named("agent_token", sb.LegacyAgentToken),
		sql.Named("checkpoint_seq", sb.CheckpointSeq),
		sql.Named("auto_seq", sb.AutoSeq),
		sql.Named("error", sb.Error),
		sql.Named("agent_gen", sb.AgentGen),
		sql.Named("restore_target", sb.RestoreTarget),
		sql.Named("secrets", c.Secrets),
		sql.Named("secret_files", c.SecretFiles),
		sql.Named("public", sb.Public),
		sql.Named("version", sb.Version),
		sql.Named("node", sb.Node),
		sql.Named("recover", sb.Recover),
		sql.Named("handover", sb.Handover),
	}, nil
}

// scanSandbox reads one row of columns.SandboxNames into a new record.
func scanSandbox(row scanner) (*store.Sandbox, error) {
	var (
		sb    store.Sandbox
		state string
		c     columns.Sandbox
		from  sql.NullString
	)
	err := row.Scan(&sb.ID, &sb.Name, &state, &sb.Template, &sb.Image, &c.Resources, &c.Env, &c.Labels,
		&sb.Idle, &sb.HTTPPort, &sb.URL, &from, &c.CreatedAt, &sb.NetIndex, &sb.LegacyAgentToken,
		&sb.CheckpointSeq, &sb.AutoSeq, &sb.Error, &sb.AgentGen, &sb.RestoreTarget, &c.Secrets, &c.SecretFiles, &sb.Public, &c.Network, &sb.Pool, &sb.Org,
		&sb.Version, &sb.Node, &sb.Recover, &sb.Handover)
	if err != nil {
		return nil, err
	}
	sb.State = api.State(state)
	if from.Valid {
		c.From = &from.String
	}
	if err := c.Decode(&sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// oneRow turns a statement that touched no row into store.ErrNotFound.
func oneRow(res sql.Result) error {
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}
