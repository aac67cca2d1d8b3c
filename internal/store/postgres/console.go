package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// PutConsoleSession stores a console session, replacing one with its key.
func (s *Store) PutConsoleSession(ctx context.Context, cs *store.ConsoleSession) error {
	expires, err := columns.FormatTime(cs.ExpiresAt)
	if err != nil {
		return fmt.Errorf("storing a console session: %w", err)
	}
	_, err = s.exec(ctx, `INSERT INTO console_sessions (`+columns.ConsoleSessionNames+`) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (key) DO UPDATE SET csrf_token = excluded.csrf_token, expires_at = excluded.expires_at,
			org = excluded.org, api_key = excluded.api_key`,
		cs.Key, cs.CSRFToken, expires, cs.Org, cs.APIKey)
	if err != nil {
		return fmt.Errorf("storing a console session: %w", err)
	}
	return nil
}

// ListConsoleSessions lists the console sessions that have not expired at
// now, those that end first first.
func (s *Store) ListConsoleSessions(ctx context.Context, now time.Time) ([]*store.ConsoleSession, error) {
	at, err := columns.FormatTime(now)
	if err != nil {
		return nil, fmt.Errorf("listing console sessions: %w", err)
	}
	// COLLATE "C": ties on expires_at go by the keys' bytes, as in SQLite.
	rows, err := s.pool.Query(ctx, `SELECT `+columns.ConsoleSessionNames+` FROM console_sessions
		WHERE expires_at > $1 ORDER BY expires_at, key COLLATE "C"`, at)
	if err != nil {
		return nil, fmt.Errorf("listing console sessions: %w", unavailable(err))
	}
	// Appended to nil, so none is nil, as package sqlite answers.
	list, err := pgx.AppendRows([]*store.ConsoleSession(nil), rows, func(row pgx.CollectableRow) (*store.ConsoleSession, error) {
		var cs store.ConsoleSession
		var expires string
		if err := row.Scan(&cs.Key, &cs.CSRFToken, &expires, &cs.Org, &cs.APIKey); err != nil {
			return nil, err
		}
		var err error
		if cs.ExpiresAt, err = columns.ParseTime(expires); err != nil {
			return nil, fmt.Errorf("session expiry %q: %w", expires, err)
		}
		return &cs, nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing console sessions: %w", unavailable(err))
	}
	return list, nil
}

// GetConsoleSession finds the console session of key that has not
// expired at now; store.ErrNotFound if none. Every node of a cluster
// asks here: a session one node made opens the others, and one ended on
// any node is ended on all.
func (s *Store) GetConsoleSession(ctx context.Context, key string, now time.Time) (*store.ConsoleSession, error) {
	at, err := columns.FormatTime(now)
	if err != nil {
		return nil, fmt.Errorf("reading a console session: %w", err)
	}
	var cs store.ConsoleSession
	var expires string
	err = s.pool.QueryRow(ctx, `SELECT `+columns.ConsoleSessionNames+` FROM console_sessions
		WHERE key = $1 AND expires_at > $2`, key, at).Scan(&cs.Key, &cs.CSRFToken, &expires, &cs.Org, &cs.APIKey)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading a console session: %w", unavailable(err))
	}
	if cs.ExpiresAt, err = columns.ParseTime(expires); err != nil {
		return nil, fmt.Errorf("reading a console session: session expiry %q: %w", expires, err)
	}
	return &cs, nil
}

// DeleteConsoleSessions removes the console sessions with the given keys,
// and every one that has expired at now. A key that is not there is no
// error: a session ends once, whoever ends it.
func (s *Store) DeleteConsoleSessions(ctx context.Context, now time.Time, keys ...string) error {
	at, err := columns.FormatTime(now)
	if err != nil {
		return fmt.Errorf("deleting console sessions: %w", err)
	}
	if _, err := s.exec(ctx, `DELETE FROM console_sessions WHERE expires_at <= $1 OR key = ANY($2)`, at, keys); err != nil {
		return fmt.Errorf("deleting console sessions: %w", err)
	}
	return nil
}
