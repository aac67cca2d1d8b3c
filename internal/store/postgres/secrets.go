package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// PutSecret stores a sealed secret under its org and name, replacing one
// of that name in the org (which keeps its creation time). It stores only
// what it is given: sealing is the caller's (internal/secret).
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

// RegistryCredentials is the table of sealed registry credentials, as
// secret.Records, so that internal/secret seals them as it does secrets
// while they stay out of the secrets' listing.
func (s *Store) RegistryCredentials() store.Sealed { return &Credentials{s: s} }

// Credentials is the registry credentials' table; see RegistryCredentials.
type Credentials struct{ s *Store }

// PutSecret stores a sealed credential under its name.
func (c *Credentials) PutSecret(ctx context.Context, sec *store.Secret) error {
	return c.s.putSealed(ctx, "registry_credentials", sec)
}

// GetSecret finds a sealed credential of org by name; store.ErrNotFound
// if none.
func (c *Credentials) GetSecret(ctx context.Context, org, name string) (*store.Secret, error) {
	return c.s.getSealed(ctx, "registry_credentials", org, name)
}

// ListSecrets lists the sealed credentials of org, by name.
func (c *Credentials) ListSecrets(ctx context.Context, org string) ([]*store.Secret, error) {
	return c.s.listSealed(ctx, "registry_credentials", org)
}

// DeleteSecret removes a credential of org; store.ErrNotFound if none.
func (c *Credentials) DeleteSecret(ctx context.Context, org, name string) error {
	return c.s.deleteSealed(ctx, "registry_credentials", org, name)
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
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (org, name) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at`,
		sec.Org, sec.Name, sec.Sealed, c.CreatedAt, c.UpdatedAt)
	if err != nil {
		return fmt.Errorf("storing secret %s: %w", sec.Name, err)
	}
	return nil
}

func (s *Store) getSealed(ctx context.Context, table, org, name string) (*store.Secret, error) {
	row := s.pool.QueryRow(ctx, `SELECT `+columns.SecretNames+` FROM `+table+` WHERE org = $1 AND name = $2`, org, name)
	sec, err := scanSecret(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("getting secret %s: %w", name, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting secret %s: %w", name, unavailable(err))
	}
	return sec, nil
}

func (s *Store) listSealed(ctx context.Context, table, org string) ([]*store.Secret, error) {
	// COLLATE "C": by the names' bytes, as SQLite orders them, whatever
	// the database's collation (en_US would put "a" before "B", and
	// ignore "-" and "_").
	rows, err := s.pool.Query(ctx, `SELECT `+columns.SecretNames+` FROM `+table+` WHERE org = $1 ORDER BY name COLLATE "C"`, org)
	if err != nil {
		return nil, fmt.Errorf("listing secrets: %w", unavailable(err))
	}
	list, err := collect(rows, scanSecret)
	if err != nil {
		return nil, fmt.Errorf("listing secrets: %w", err)
	}
	return list, nil
}

func (s *Store) deleteSealed(ctx context.Context, table, org, name string) error {
	tag, err := s.exec(ctx, `DELETE FROM `+table+` WHERE org = $1 AND name = $2`, org, name)
	if err != nil {
		return fmt.Errorf("deleting secret %s: %w", name, err)
	}
	if err := oneRow(tag); err != nil {
		return fmt.Errorf("deleting secret %s: %w", name, err)
	}
	return nil
}

func scanSecret(row pgx.Row) (*store.Secret, error) {
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
