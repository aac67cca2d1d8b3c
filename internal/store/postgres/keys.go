package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// CreateKey adds an API key; store.ErrExists if its id or hash is taken.
// It is stored unused, whatever k.LastUsedAt says (TouchKey records uses).
func (s *Store) CreateKey(ctx context.Context, k *store.Key) error {
	c, err := columns.EncodeKey(k)
	if err != nil {
		return fmt.Errorf("creating key %s: %w", k.ID, err)
	}
	_, err = s.exec(ctx, `INSERT INTO api_keys (`+columns.KeyNames+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, NULL)`,
		k.ID, k.Org, k.Name, string(k.Scope), c.Labels, k.Hash, k.CreatedBy, c.CreatedAt, c.ExpiresAt)
	if isUniqueViolation(err) {
		return fmt.Errorf("creating key %s: %w", k.ID, store.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("creating key %s: %w", k.ID, err)
	}
	return nil
}

// KeyByHash finds the key whose secret has hash, of any org;
// store.ErrNotFound if none.
func (s *Store) KeyByHash(ctx context.Context, hash []byte) (*store.Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `SELECT `+columns.KeyNames+` FROM api_keys WHERE hash = $1`, hash))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("finding key: %w", store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("finding key: %w", unavailable(err))
	}
	return k, nil
}

// GetKey finds a key of org by id; store.ErrNotFound if none.
func (s *Store) GetKey(ctx context.Context, org, id string) (*store.Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `SELECT `+columns.KeyNames+` FROM api_keys WHERE org = $1 AND id = $2`, org, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("getting key %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting key %s: %w", id, unavailable(err))
	}
	return k, nil
}

// ListKeys lists the keys of org, oldest first (by creation time, then id).
func (s *Store) ListKeys(ctx context.Context, org string) ([]*store.Key, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+columns.KeyNames+` FROM api_keys WHERE org = $1 ORDER BY created_at COLLATE "C", id COLLATE "C"`, org)
	if err != nil {
		return nil, fmt.Errorf("listing keys: %w", unavailable(err))
	}
	list, err := collect(rows, scanKey)
	if err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	return list, nil
}

// DeleteKey removes a key of org; store.ErrNotFound if none.
func (s *Store) DeleteKey(ctx context.Context, org, id string) error {
	tag, err := s.exec(ctx, `DELETE FROM api_keys WHERE org = $1 AND id = $2`, org, id)
	if err != nil {
		return fmt.Errorf("deleting key %s: %w", id, err)
	}
	if err := oneRow(tag); err != nil {
		return fmt.Errorf("deleting key %s: %w", id, err)
	}
	return nil
}

// TouchKey records that key id was used at t; a key that is gone is no
// error. It is no API call's change, so it runs on the pool, outside
// exec, and writes no audit record even under a call's context.
func (s *Store) TouchKey(ctx context.Context, id string, t time.Time) error {
	at, err := columns.FormatTime(t)
	if err != nil {
		return fmt.Errorf("touching key %s: %w", id, err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE api_keys SET last_used_at = $1 WHERE id = $2`, at, id); err != nil {
		return fmt.Errorf("touching key %s: %w", id, unavailable(err))
	}
	return nil
}

func scanKey(row pgx.Row) (*store.Key, error) {
	var (
		k     store.Key
		scope string
		c     columns.Key
	)
	if err := row.Scan(&k.ID, &k.Org, &k.Name, &scope, &c.Labels, &k.Hash, &k.CreatedBy, &c.CreatedAt, &c.ExpiresAt, &c.LastUsedAt); err != nil {
		return nil, err
	}
	k.Scope = api.Scope(scope)
	if err := c.Decode(&k); err != nil {
		return nil, err
	}
	return &k, nil
}
