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

// EnsureOrg makes org if there is none by that name (with no quota), and
// gives it every sandbox, secret, registry credential and image that has
// no org yet: those of records older than orgs, which belong to the
// daemon's own org. It is the daemon's start, no API call's change, so it
// runs on the pool, outside execTx, and writes no audit record.
func (s *Store) EnsureOrg(ctx context.Context, org string) error {
	c, err := columns.EncodeOrg(&store.Org{Name: org, CreatedAt: store.Now()})
	if err != nil {
		return err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("making org %s: %w", org, unavailable(err))
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `INSERT INTO orgs (`+columns.OrgNames+`) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING`,
		org, c.Quota, c.CreatedAt); err != nil {
		return fmt.Errorf("making org %s: %w", org, unavailable(err))
	}
	for _, table := range []string{"sandboxes", "secrets", "registry_credentials", "images"} {
		if _, err := tx.Exec(ctx, `UPDATE `+table+` SET org = $1 WHERE org = ''`, org); err != nil {
			return fmt.Errorf("giving org %s its %s: %w", org, table, unavailable(err))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("making org %s: %w", org, unavailable(err))
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
	_, err = s.exec(ctx, `INSERT INTO orgs (`+columns.OrgNames+`) VALUES ($1, $2, $3)`, org, c.Quota, c.CreatedAt)
	if isUniqueViolation(err) {
		return fmt.Errorf("making org %s: %w", org, store.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("making org %s: %w", org, err)
	}
	return nil
}

// DeleteOrg deletes org, its API keys, secrets, registry credentials and
// images, in one transaction with the call's audit record;
// store.ErrNotFound if there is no such org. While any sandbox is still
// its, or (unless secrets is set) any secret, it deletes nothing: a
// *store.NotEmptyError. Members of its warm pools are no sandboxes of the
// API: the caller deletes them after.
func (s *Store) DeleteOrg(ctx context.Context, org string, secrets bool) error {
	err := s.execTx(ctx, func(tx pgx.Tx) (bool, error) {
		var in store.NotEmptyError
		if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM sandboxes WHERE org = $1 AND pool = ''), (SELECT count(*) FROM secrets WHERE org = $1)`,
			org).Scan(&in.Sandboxes, &in.Secrets); err != nil {
			return false, err
		}
		if secrets {
			in.Secrets = 0
		}
		if in.Sandboxes > 0 || in.Secrets > 0 {
			return false, &in
		}
		for _, table := range []string{"api_keys", "secrets", "registry_credentials", "images"} {
			if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE org = $1`, org); err != nil {
				return false, err
			}
		}
		tag, err := tx.Exec(ctx, `DELETE FROM orgs WHERE name = $1`, org)
		if err != nil {
			return false, err
		}
		if err := oneRow(tag); err != nil {
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
	o, err := scanOrg(s.pool.QueryRow(ctx, `SELECT `+columns.OrgNames+` FROM orgs WHERE name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("getting org %s: %w", name, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting org %s: %w", name, unavailable(err))
	}
	return o, nil
}

// ListOrgs lists the orgs by name.
func (s *Store) ListOrgs(ctx context.Context) ([]*store.Org, error) {
	// COLLATE "C": by the names' bytes, as SQLite's BINARY orders them,
	// whatever the database's collation.
	rows, err := s.pool.Query(ctx, `SELECT `+columns.OrgNames+` FROM orgs ORDER BY name COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("listing orgs: %w", unavailable(err))
	}
	list, err := collect(rows, scanOrg)
	if err != nil {
		return nil, fmt.Errorf("listing orgs: %w", err)
	}
	return list, nil
}

// SetQuota replaces org's quota; store.ErrNotFound if there is no such
// org. The call's audit record is written with it.
func (s *Store) SetQuota(ctx context.Context, org string, q api.Quota) error {
	quota, err := columns.MarshalQuota(q)
	if err != nil {
		return fmt.Errorf("setting the quota of %s: %w", org, err)
	}
	tag, err := s.exec(ctx, `UPDATE orgs SET quota = $1 WHERE name = $2`, quota, org)
	if err != nil {
		return fmt.Errorf("setting the quota of %s: %w", org, err)
	}
	if err := oneRow(tag); err != nil {
		return fmt.Errorf("setting the quota of %s: %w", org, err)
	}
	return nil
}

// CheckpointUse is how many checkpoints the sandboxes of org have, and
// the memory (MiB) their memory checkpoints' images were taken of: each
// one's resources.memory_mib, 0 where it has none.
func (s *Store) CheckpointUse(ctx context.Context, org string) (count, memoryMiB int, err error) {
	err = s.pool.QueryRow(ctx, `SELECT count(*),
		coalesce(sum(CASE WHEN c.memory THEN coalesce((c.resources::jsonb->>'memory_mib')::bigint, 0) ELSE 0 END), 0)
		FROM checkpoints c JOIN sandboxes s ON s.id = c.sandbox_id WHERE s.org = $1`, org).Scan(&count, &memoryMiB)
	if err != nil {
		return 0, 0, fmt.Errorf("counting the checkpoints of %s: %w", org, unavailable(err))
	}
	return count, memoryMiB, nil
}

func scanOrg(row pgx.Row) (*store.Org, error) {
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
