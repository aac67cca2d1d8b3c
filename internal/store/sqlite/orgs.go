package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// EnsureOrg makes org if there is none by that name (with no quota), and
// gives it every sandbox, secret and registry credential that has no org
// yet: those of a data dir older than orgs, which belong to the daemon's
// own org.
func (s *Store) EnsureOrg(ctx context.Context, org string) error {
	c, err := columns.EncodeOrg(&store.Org{Name: org, CreatedAt: store.Now()})
	if err != nil {
		return err
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("making org %s: %w", org, storageError(err))
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orgs (`+columns.OrgNames+`) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING`, org, c.Quota, c.CreatedAt); err != nil {
		return fmt.Errorf("making org %s: %w", org, storageError(err))
	}
	for _, table := range []string{"sandboxes", "secrets", "registry_credentials", "images"} {
		if _, err := tx.ExecContext(ctx, `UPDATE `+table+` SET org = ? WHERE org = ''`, org); err != nil {
			return fmt.Errorf("giving org %s its %s: %w", org, table, storageError(err))
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("making org %s: %w", org, storageError(err))
	}
	return nil
}

// CreateOrg makes org, with no quota; store.ErrExists if there is one by
// that name. The call's audit record is written with it.
func (s *Store) CreateOrg(ctx context.Context, org string) error {
	c, err := columns.EncodeOrg(&store.Org{Name: org, CreatedAt: store.Now()})
	if err != nil {
		return err
	}
	_, err = s.exec(ctx, `INSERT INTO orgs (`+columns.OrgNames+`) VALUES (?, ?, ?)`, org, c.Quota, c.CreatedAt)
	if isUniqueViolation(err) {
		return fmt.Errorf("making org %s: %w", org, store.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("making org %s: %w", org, err)
	}
	return nil
}

// DeleteOrg deletes org, its API keys, secrets and registry credentials,
// in one transaction with the call's audit record; store.ErrNotFound if
// there is no such org. While any sandbox is still its, or (unless
// secrets is set) any secret, it deletes nothing: a *store.NotEmptyError.
// Members of its warm pools are no sandboxes of the API: the caller
// deletes them after.
func (s *Store) DeleteOrg(ctx context.Context, org string, secrets bool) error {
	err := s.execTx(ctx, func(tx *sql.Tx) (bool, error) {
		var in store.NotEmptyError
		if err := tx.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM sandboxes WHERE org = ? AND pool = ''), (SELECT count(*) FROM secrets WHERE org = ?)`,
			org, org).Scan(&in.Sandboxes, &in.Secrets); err != nil {
			return false, err
		}
		if secrets {
			in.Secrets = 0
		}
		if in.Sandboxes > 0 || in.Secrets > 0 {
			return false, &in
		}
		for _, table := range []string{"api_keys", "secrets", "registry_credentials", "images"} {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE org = ?`, org); err != nil {
				return false, err
			}
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM orgs WHERE name = ?`, org)
		if err != nil {
			return false, err
		}
		if err := oneRow(res); err != nil {
			return false, err
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("deleting org %s: %w", org, err)
	}
	return nil
}

// GetOrg finds an org by name; store.ErrNotFound if none.
func (s *Store) GetOrg(ctx context.Context, name string) (*store.Org, error) {
	o, err := scanOrg(s.r.QueryRowContext(ctx, `SELECT `+columns.OrgNames+` FROM orgs WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("getting org %s: %w", name, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting org %s: %w", name, err)
	}
	return o, nil
}

// ListOrgs lists the orgs by name.
func (s *Store) ListOrgs(ctx context.Context) ([]*store.Org, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+columns.OrgNames+` FROM orgs ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("listing orgs: %w", err)
	}
	defer rows.Close()
	out := []*store.Org{}
	for rows.Next() {
		o, err := scanOrg(rows)
		if err != nil {
			return nil, fmt.Errorf("listing orgs: %w", err)
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing orgs: %w", err)
	}
	return out, nil
}

// SetQuota replaces org's quota; store.ErrNotFound if there is no such
// org. The call's audit record is written with it.
func (s *Store) SetQuota(ctx context.Context, org string, q api.Quota) error {
	quota, err := columns.MarshalQuota(q)
	if err != nil {
		return fmt.Errorf("setting the quota of %s: %w", org, err)
	}
	res, err := s.exec(ctx, `UPDATE orgs SET quota = ? WHERE name = ?`, quota, org)
	if err != nil {
		return fmt.Errorf("setting the quota of %s: %w", org, err)
	}
	if err := oneRow(res); err != nil {
		return fmt.Errorf("setting the quota of %s: %w", org, err)
	}
	return nil
}

// CheckpointUse is how many checkpoints the sandboxes of org have, and
// the memory (MiB) their memory checkpoints' images were taken of.
func (s *Store) CheckpointUse(ctx context.Context, org string) (count, memoryMiB int, err error) {
	err = s.r.QueryRowContext(ctx, `SELECT count(*),
		coalesce(sum(CASE WHEN c.memory THEN coalesce(json_extract(c.resources, '$.memory_mib'), 0) ELSE 0 END), 0)
		FROM checkpoints c JOIN sandboxes s ON s.id = c.sandbox_id WHERE s.org = ?`, org).Scan(&count, &memoryMiB)
	if err != nil {
		return 0, 0, fmt.Errorf("counting the checkpoints of %s: %w", org, err)
	}
	return count, memoryMiB, nil
}

func scanOrg(row scanner) (*store.Org, error) {
	var (
		o store.Org
		c columns.Org
	)
	if err := row.Scan(&o.Name, &c.Quota, &c.CreatedAt); err != nil {
		return nil, err
	}
	if err := c.Decode(&o); err != nil {
		return nil, err
	}
	return &o, nil
}
