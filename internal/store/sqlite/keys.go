package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// CreateKey adds an API key; store.ErrExists if its id or hash is taken.
func (s *Store) CreateKey(ctx context.Context, k *store.Key) error {
	c, err := columns.EncodeKey(k)
	if err != nil {
		return fmt.Errorf("creating key %s: %w", k.ID, err)
	}
	_, err = s.exec(ctx, `INSERT INTO api_keys (`+columns.KeyNames+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)`,
		k.ID, k.Org, k.Name, string(k.Scope), c.Labels, k.Hash, k.CreatedBy, c.CreatedAt, c.ExpiresAt)
	if isUniqueViolation(err) {
		return fmt.Errorf("creating key %s: %w", k.ID, store.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("creating key %s: %w", k.ID, err)
	}
	return nil
}

// KeyByHash finds the key whose secret has hash; store.ErrNotFound if none.
func (s *Store) KeyByHash(ctx context.Context, hash []byte) (*store.Key, error) {
	k, err := scanKey(s.r.QueryRowContext(ctx, `SELECT `+columns.KeyNames+` FROM api_keys WHERE hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("finding key: %w", store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("finding key: %w", err)
	}
	return k, nil
}

// GetKey finds a key of org by id; store.ErrNotFound if none.
func (s *Store) GetKey(ctx context.Context, org, id string) (*store.Key, error) {
	k, err := scanKey(s.r.QueryRowContext(ctx, `SELECT `+columns.KeyNames+` FROM api_keys WHERE org = ? AND id = ?`, org, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("getting key %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting key %s: %w", id, err)
	}
	return k, nil
}

// ListKeys lists the keys of org, oldest first.
func (s *Store) ListKeys(ctx context.Context, org string) ([]*store.Key, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+columns.KeyNames+` FROM api_keys WHERE org = ? ORDER BY created_at, id`, org)
	if err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	defer rows.Close()
	list := []*store.Key{}
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("listing keys: %w", err)
		}
		list = append(list, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	return list, nil
}

// DeleteKey removes a key of org; store.ErrNotFound if none.
func (s *Store) DeleteKey(ctx context.Context, org, id string) error {
	res, err := s.exec(ctx, `DELETE FROM api_keys WHERE org = ? AND id = ?`, org, id)
	if err != nil {
		return fmt.Errorf("deleting key %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("deleting key %s: %w", id, err)
	} else if n == 0 {
		return fmt.Errorf("deleting key %s: %w", id, store.ErrNotFound)
	}
	return nil
}

// TouchKey records that key id was used at t. It is no API call's change,
// so it writes no audit record even under a call's context.
func (s *Store) TouchKey(ctx context.Context, id string, t time.Time) error {
	at, err := formatTime(t)
	if err != nil {
		return fmt.Errorf("touching key %s: %w", id, err)
	}
	if _, err := s.w.ExecContext(ctx, `UPDATE api_keys SET last_used_at = ? WHERE id = ?`, at, id); err != nil {
		return fmt.Errorf("touching key %s: %w", id, storageError(err))
	}
	return nil
}

func scanKey(row scanner) (*store.Key, error) {
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
