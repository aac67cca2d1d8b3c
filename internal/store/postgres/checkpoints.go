package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// CreateCheckpoint adds cp to the sandbox cp.Sandbox. It fails with
// store.ErrExists if that sandbox has a checkpoint with cp's id or name, and
// with store.ErrNotFound if the sandbox does not exist. The record is on
// disk when it returns.
func (s *Store) CreateCheckpoint(ctx context.Context, cp *store.Checkpoint) error {
	c, err := columns.EncodeCheckpoint(cp)
	if err != nil {
		return fmt.Errorf("creating checkpoint %s of sandbox %s: %w", cp.ID, cp.Sandbox, err)
	}
	_, err = s.execOwned(ctx, cp.Sandbox, `INSERT INTO checkpoints (`+columns.CheckpointNames+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		cp.Sandbox, cp.ID, c.Name, cp.Comment, cp.Memory, cp.Auto, c.CreatedAt,
		cp.SandboxName, cp.Template, cp.Image, c.Resources, cp.LegacyAgentToken, cp.AgentGen, cp.Inside)
	switch {
	case isUniqueViolation(err):
		return fmt.Errorf("creating checkpoint %s named %q of sandbox %s: %w", cp.ID, cp.Name, cp.Sandbox, store.ErrExists)
	case isForeignKeyViolation(err):
		return fmt.Errorf("creating checkpoint %s: sandbox %s: %w", cp.ID, cp.Sandbox, store.ErrNotFound)
	case err != nil:
		return fmt.Errorf("creating checkpoint %s of sandbox %s: %w", cp.ID, cp.Sandbox, err)
	}
	return nil
}

// GetCheckpoint finds a checkpoint of the sandbox with id sandboxID by the
// checkpoint's id or name; store.ErrNotFound if none. When ref is one
// checkpoint's id and another's name, the id wins.
func (s *Store) GetCheckpoint(ctx context.Context, sandboxID, ref string) (*store.Checkpoint, error) {
	row := s.pool.QueryRow(ctx, `SELECT `+columns.CheckpointNames+` FROM checkpoints
		WHERE sandbox_id = @sandbox AND (id = @ref OR name = @ref)
		ORDER BY id = @ref DESC LIMIT 1`, pgx.NamedArgs{"sandbox": sandboxID, "ref": ref})
	cp, err := scanCheckpoint(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("getting checkpoint %s of sandbox %s: %w", ref, sandboxID, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting checkpoint %s of sandbox %s: %w", ref, sandboxID, unavailable(err))
	}
	return cp, nil
}

// ListCheckpoints lists the checkpoints of the sandbox with id sandboxID in
// the order they were created; store.ErrNotFound if there is no such
// sandbox, so a name passed for an id is caught rather than listing nothing.
func (s *Store) ListCheckpoints(ctx context.Context, sandboxID string) ([]*store.Checkpoint, error) {
	// One snapshot (repeatable read), so the sandbox cannot vanish between
	// the check and the list.
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints of sandbox %s: %w", sandboxID, unavailable(err))
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var one int
	err = tx.QueryRow(ctx, `SELECT 1 FROM sandboxes WHERE id = $1`, sandboxID).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("listing checkpoints of sandbox %s: %w", sandboxID, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints of sandbox %s: %w", sandboxID, unavailable(err))
	}
	rows, err := tx.Query(ctx, `SELECT `+columns.CheckpointNames+` FROM checkpoints
		WHERE sandbox_id = $1 ORDER BY seq`, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints of sandbox %s: %w", sandboxID, unavailable(err))
	}
	list, err := collect(rows, scanCheckpoint)
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints of sandbox %s: %w", sandboxID, err)
	}
	return list, nil
}

// DeleteCheckpoint removes the checkpoint with that id (not name) from the
// sandbox; store.ErrNotFound if none.
func (s *Store) DeleteCheckpoint(ctx context.Context, sandboxID, id string) error {
	tag, err := s.execOwned(ctx, sandboxID, `DELETE FROM checkpoints WHERE sandbox_id = $1 AND id = $2`, sandboxID, id)
	if err != nil {
		return fmt.Errorf("deleting checkpoint %s of sandbox %s: %w", id, sandboxID, err)
	}
	if err := oneRow(tag); err != nil {
		return fmt.Errorf("deleting checkpoint %s of sandbox %s: %w", id, sandboxID, err)
	}
	return nil
}

// scanCheckpoint reads one row of columns.CheckpointNames into a new record.
func scanCheckpoint(row pgx.Row) (*store.Checkpoint, error) {
	var (
		cp store.Checkpoint
		c  columns.Checkpoint
	)
	err := row.Scan(&cp.Sandbox, &cp.ID, &c.Name, &cp.Comment, &cp.Memory, &cp.Auto, &c.CreatedAt,
		&cp.SandboxName, &cp.Template, &cp.Image, &c.Resources, &cp.LegacyAgentToken, &cp.AgentGen, &cp.Inside)
	if err != nil {
		return nil, err
	}
	if err := c.Decode(&cp); err != nil {
		return nil, err
	}
	return &cp, nil
}
