// Package audit keeps the audit log to its retention. The records
// themselves are written by the store, in the transaction of the change
// they record (see store.AuditCall), and by the API server for calls that
// change nothing the store keeps.
package audit

import (
	"context"
	"log/slog"
	"time"

	"loam.dev/loam/internal/store"
)

// DefaultRetention is how long records are kept when loam serve is not
// told (--audit-retention).
const DefaultRetention = 90 * 24 * time.Hour

// pruneEvery is how often old records are deleted.
const pruneEvery = time.Hour

// Pruner is what Retention needs of the store.
type Pruner interface {
	// PruneAudit deletes the records older than before.
	PruneAudit(ctx context.Context, before time.Time) (int64, error)
}

// Retention deletes the records older than Keep, when the daemon starts
// and every hour after; Keep <= 0 keeps them all.
type Retention struct {
	Store Pruner
	Keep  time.Duration
	Log   *slog.Logger
}

// Run prunes until ctx ends.
func (r *Retention) Run(ctx context.Context) error {
	if r.Keep <= 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(pruneEvery)
	defer t.Stop()
	for {
		n, err := r.Store.PruneAudit(ctx, store.Now().Add(-r.Keep))
		switch {
		case err != nil && ctx.Err() == nil:
			r.Log.Warn("pruning the audit log", "err", err)
		case n > 0:
			r.Log.Info("pruned the audit log", "records", n, "older_than", store.Now().Add(-r.Keep).Format(time.RFC3339))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
