package postgres

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// AppendAudit writes one audit record on its own: a call that changed
// nothing the store keeps (an exec, a file write), or failed. It is the
// call's record itself, so it never joins a record ctx carries.
func (s *Store) AppendAudit(ctx context.Context, ev api.AuditEvent) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("writing audit record: %w", unavailable(err))
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := insertAudit(ctx, tx, ev); err != nil {
		return unavailable(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("writing audit record: %w", unavailable(err))
	}
	return nil
}

// SetAuditOutcome sets the outcome of the record seq (a call that failed
// after its first change).
func (s *Store) SetAuditOutcome(ctx context.Context, seq int64, outcome string) error {
	if _, err := s.pool.Exec(ctx, `UPDATE audit SET outcome = $1 WHERE seq = $2`, outcome, seq); err != nil {
		return fmt.Errorf("setting audit outcome: %w", unavailable(err))
	}
	return nil
}

// ListAudit lists the records f selects, oldest first.
func (s *Store) ListAudit(ctx context.Context, f store.AuditFilter) ([]api.AuditEvent, error) {
	q, args, err := columns.AuditQuery(f, func(i int) string { return "$" + strconv.Itoa(i) })
	if err != nil {
		return nil, fmt.Errorf("listing audit records: %w", err)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing audit records: %w", unavailable(err))
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (api.AuditEvent, error) {
		var ev api.AuditEvent
		var at string
		if err := row.Scan(&ev.Seq, &at, &ev.Org, &ev.Key, &ev.Action, &ev.Target, &ev.Outcome, &ev.Client); err != nil {
			return ev, err
		}
		var err error
		if ev.Time, err = columns.ParseTime(at); err != nil {
			return ev, fmt.Errorf("seq %d: %w", ev.Seq, err)
		}
		return ev, nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing audit records: %w", unavailable(err))
	}
	return list, nil
}

// PruneAudit deletes the records older than before; how many it deleted.
func (s *Store) PruneAudit(ctx context.Context, before time.Time) (int64, error) {
	at, err := columns.FormatTime(before)
	if err != nil {
		return 0, fmt.Errorf("pruning audit records: %w", err)
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM audit WHERE time < $1`, at)
	if err != nil {
		return 0, fmt.Errorf("pruning audit records: %w", unavailable(err))
	}
	return tag.RowsAffected(), nil
}
