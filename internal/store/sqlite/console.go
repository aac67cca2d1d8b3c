package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// PutConsoleSession stores a console session, replacing one with its key.
func (s *Store) PutConsoleSession(ctx context.Context, cs *store.ConsoleSession) error {
	expires, err := formatTime(cs.ExpiresAt)
	if err != nil {
		return fmt.Errorf("storing a console session: %w", err)
	}
	_, err = s.exec(ctx, `INSERT INTO console_sessions (`+columns.ConsoleSessionNames+`) VALUES (?, ?, ?, ?, ?)
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
	at, err := formatTime(now)
	if err != nil {
		return nil, fmt.Errorf("listing console sessions: %w", err)
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+columns.ConsoleSessionNames+` FROM console_sessions
		WHERE expires_at > ? ORDER BY expires_at, key`, at)
	if err != nil {
		return nil, fmt.Errorf("listing console sessions: %w", err)
	}
	defer rows.Close()
	var out []*store.ConsoleSession
	for rows.Next() {
		var cs store.ConsoleSession
		var expires string
		if err := rows.Scan(&cs.Key, &cs.CSRFToken, &expires, &cs.Org, &cs.APIKey); err != nil {
			return nil, fmt.Errorf("listing console sessions: %w", err)
		}
		if cs.ExpiresAt, err = parseTime(expires); err != nil {
			return nil, fmt.Errorf("listing console sessions: session expiry %q: %w", expires, err)
		}
		out = append(out, &cs)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing console sessions: %w", err)
	}
	return out, nil
}

// GetConsoleSession finds the console session of key that has not
// expired at now; store.ErrNotFound if none.
func (s *Store) GetConsoleSession(ctx context.Context, key string, now time.Time) (*store.ConsoleSession, error) {
	at, err := formatTime(now)
	if err != nil {
		return nil, fmt.Errorf("reading a console session: %w", err)
	}
	var cs store.ConsoleSession
	var expires string
	err = s.r.QueryRowContext(ctx, `SELECT `+columns.ConsoleSessionNames+` FROM console_sessions
		WHERE key = ? AND expires_at > ?`, key, at).Scan(&cs.Key, &cs.CSRFToken, &expires, &cs.Org, &cs.APIKey)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading a console session: %w", err)
	}
	if cs.ExpiresAt, err = parseTime(expires); err != nil {
		return nil, fmt.Errorf("reading a console session: session expiry %q: %w", expires, err)
	}
	return &cs, nil
}

// DeleteConsoleSessions removes the console sessions with the given keys,
// and every one that has expired at now. A key that is not there is no
// error: a session ends once, whoever ends it.
func (s *Store) DeleteConsoleSessions(ctx context.Context, now time.Time, keys ...string) error {
	at, err := formatTime(now)
	if err != nil {
		return fmt.Errorf("deleting console sessions: %w", err)
	}
	q := `DELETE FROM console_sessions WHERE expires_at <= ?`
	args := []any{at}
	if len(keys) > 0 {
		q += ` OR key IN (?` + strings.Repeat(`, ?`, len(keys)-1) + `)`
		for _, k := range keys {
			args = append(args, k)
		}
	}
	if _, err := s.exec(ctx, q, args...); err != nil {
		return fmt.Errorf("deleting console sessions: %w", err)
	}
	return nil
}
