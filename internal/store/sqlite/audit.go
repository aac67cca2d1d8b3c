package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// insertAudit writes ev in tx; its seq.
func insertAudit(ctx context.Context, tx *sql.Tx, ev api.AuditEvent) (int64, error) {
	at, err := formatTime(ev.Time)
	if err != nil {
		return 0, fmt.Errorf("writing audit record: %w", err)
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO audit (time, org, key, action, target, outcome, client) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		at, ev.Org, ev.Key, ev.Action, ev.Target, ev.Outcome, ev.Client)
	if err != nil {
		return 0, fmt.Errorf("writing audit record: %w", err)
	}
	return res.LastInsertId()
}

// AppendAudit writes one audit record on its own: a call that changed
// nothing the store keeps (an exec, a file write), or failed.
func (s *Store) AppendAudit(ctx context.Context, ev api.AuditEvent) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("writing audit record: %w", storageError(err))
	}
	defer tx.Rollback()
	if _, err := insertAudit(ctx, tx, ev); err != nil {
		return storageError(err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("writing audit record: %w", storageError(err))
	}
	return nil
}

// SetAuditOutcome sets the outcome of the record seq (a call that failed
// after its first change).
func (s *Store) SetAuditOutcome(ctx context.Context, seq int64, outcome string) error {
	if _, err := s.w.ExecContext(ctx, `UPDATE audit SET outcome = ? WHERE seq = ?`, outcome, seq); err != nil {
		return fmt.Errorf("setting audit outcome: %w", storageError(err))
	}
	return nil
}

// ListAudit lists the records f selects, oldest first.
func (s *Store) ListAudit(ctx context.Context, f store.AuditFilter) ([]api.AuditEvent, error) {
	q, args, err := columns.AuditQuery(f, func(int) string { return "?" })
	if err != nil {
		return nil, fmt.Errorf("listing audit records: %w", err)
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing audit records: %w", err)
	}
	defer rows.Close()
	list := []api.AuditEvent{}
	for rows.Next() {
		var ev api.AuditEvent
		var at string
		if err := rows.Scan(&ev.Seq, &at, &ev.Org, &ev.Key, &ev.Action, &ev.Target, &ev.Outcome, &ev.Client); err != nil {
			return nil, fmt.Errorf("listing audit records: %w", err)
		}
		if ev.Time, err = parseTime(at); err != nil {
			return nil, fmt.Errorf("listing audit records: seq %d: %w", ev.Seq, err)
		}
		list = append(list, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing audit records: %w", err)
	}
	return list, nil
}

// PruneAudit deletes the records older than before; how many it deleted.
func (s *Store) PruneAudit(ctx context.Context, before time.Time) (int64, error) {
	at, err := formatTime(before)
	if err != nil {
		return 0, fmt.Errorf("pruning audit records: %w", err)
	}
	res, err := s.w.ExecContext(ctx, `DELETE FROM audit WHERE time < ?`, at)
	if err != nil {
		return 0, fmt.Errorf("pruning audit records: %w", storageError(err))
	}
	return res.RowsAffected()
}
