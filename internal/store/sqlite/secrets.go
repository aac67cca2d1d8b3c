package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// PutSecret stores a sealed secret under its org and name, replacing one
// of that name in the org (which keeps its creation time). It stores only what it is given:
// sealing is the caller's (internal/secret).
func (s *Store) PutSecret(ctx context.Context, sec *store.Secret) error {
	return s.putSealed(ctx, "secrets", sec)
}

// GetSecret finds a secret of org by name; store.ErrNotFound if none.
func (s *Store) GetSecret(ctx context.Context, org, name string) (*store.Secret, error) {
	return s.getSealed(ctx, "secrets", org, name)
}

// ListSecrets lists the secrets of org, by name.
func (s *Store) ListSecrets(ctx context.Context, org string) ([]*store.Secret, error) {
	return s.listSealed(ctx, "secrets", org)
}

// DeleteSecret removes a secret of org; store.ErrNotFound if none.
func (s *Store) DeleteSecret(ctx context.Context, org, name string) error {
	return s.deleteSealed(ctx, "secrets", org, name)
}

// putSealed, getSealed, listSealed and deleteSealed work on a table of
// sealed values: secrets, or registry_credentials. table is one of those
// constants, never input.
func (s *Store) putSealed(ctx context.Context, table string, sec *store.Secret) error {
	c, err := columns.EncodeSecret(sec)
	if err != nil {
		return fmt.Errorf("storing secret %s: %w", sec.Name, err)
	}
	_, err = s.exec(ctx, `INSERT INTO `+table+` (`+columns.SecretNames+`)
		VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (org, name) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at`,
		sec.Org, sec.Name, sec.Sealed, c.CreatedAt, c.UpdatedAt)
	if err != nil {
		return fmt.Errorf("storing secret %s: %w", sec.Name, err)
	}
	return nil
}

func (s *Store) getSealed(ctx context.Context, table, org, name string) (*store.Secret, error) {
	row := s.r.QueryRowContext(ctx, `SELECT `+columns.SecretNames+` FROM `+table+` WHERE org = ? AND name = ?`, org, name)
	sec, err := scanSecret(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("getting secret %s: %w", name, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting secret %s: %w", name, err)
	}
	return sec, nil
}

func (s *Store) listSealed(ctx context.Context, table, org string) ([]*store.Secret, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+columns.SecretNames+` FROM `+table+` WHERE org = ? ORDER BY name`, org)
	if err != nil {
		return nil, fmt.Errorf("listing secrets: %w", err)
	}
	defer rows.Close()
	list := []*store.Secret{}
	for rows.Next() {
		sec, err := scanSecret(rows)
		if err != nil {
			return nil, fmt.Errorf("listing secrets: %w", err)
		}
		list = append(list, sec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing secrets: %w", err)
	}
	return list, nil
}

func (s *Store) deleteSealed(ctx context.Context, table, org, name string) error {
	res, err := s.exec(ctx, `DELETE FROM `+table+` WHERE org = ? AND name = ?`, org, name)
	if err != nil {
		return fmt.Errorf("deleting secret %s: %w", name, err)
	}
	if err := oneRow(res); err != nil {
		return fmt.Errorf("deleting secret %s: %w", name, err)
	}
	return nil
}

func scanSecret(row scanner) (*store.Secret, error) {
	var (
		sec store.Secret
		c   columns.Secret
	)
	if err := row.Scan(&sec.Org, &sec.Name, &sec.Sealed, &c.CreatedAt, &c.UpdatedAt); err != nil {
		return nil, err
	}
	if err := c.Decode(&sec); err != nil {
		return nil, err
	}
	return &sec, nil
}
