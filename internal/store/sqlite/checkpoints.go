package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

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
	// dir, a column of schema version 1, is written empty: a checkpoint's
	// data is found from its ids.
	_, err = s.exec(ctx, `INSERT INTO checkpoints (`+columns.CheckpointNames+`, dir)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '')`,
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
	row := s.r.QueryRowContext(ctx, `SELECT `+columns.CheckpointNames+` FROM checkpoints
		WHERE sandbox_id = :sandbox AND (id = :ref OR name = :ref)
		ORDER BY id = :ref DESC LIMIT 1`,
		sql.Named("sandbox", sandboxID), sql.Named("ref", ref))
	cp, err := scanCheckpoint(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("getting checkpoint %s of sandbox %s: %w", ref, sandboxID, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting checkpoint %s of sandbox %s: %w", ref, sandboxID, err)
	}
	return cp, nil
}

// ListCheckpoints lists the checkpoints of the sandbox with id sandboxID in
// the order they were created; store.ErrNotFound if there is no such
// sandbox, so a name passed for an id is caught rather than listing nothing.
func (s *Store) ListCheckpoints(ctx context.Context, sandboxID string) ([]*store.Checkpoint, error) {
	// One read transaction, so the sandbox cannot vanish between the check
	// and the list.
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints of sandbox %s: %w", sandboxID, err)
	}
	defer tx.Rollback()

	var one int
	err = tx.QueryRowContext(ctx, `SELECT 1 FROM sandboxes WHERE id = ?`, sandboxID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("listing checkpoints of sandbox %s: %w", sandboxID, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints of sandbox %s: %w", sandboxID, err)
	}

	rows, err := tx.QueryContext(ctx, `SELECT `+columns.CheckpointNames+` FROM checkpoints
		WHERE sandbox_id = ? ORDER BY seq`, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints of sandbox %s: %w", sandboxID, err)
	}
	defer rows.Close()
	list := []*store.Checkpoint{}
	for rows.Next() {
		cp, err := scanCheckpoint(rows)
		if err != nil {
			return nil, fmt.Errorf("listing checkpoints of sandbox %s: %w", sandboxID, err)
		}
		list = append(list, cp)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing checkpoints of sandbox %s: %w", sandboxID, err)
	}
	return list, nil
}

// DeleteCheckpoint removes the checkpoint with that id (not name) from the
// sandbox; store.ErrNotFound if none.
func (s *Store) DeleteCheckpoint(ctx context.Context, sandboxID, id string) error {
	res, err := s.exec(ctx, `DELETE FROM checkpoints WHERE sandbox_id = ? AND id = ?`, sandboxID, id)
	if err != nil {
		return fmt.Errorf("deleting checkpoint %s of sandbox %s: %w", id, sandboxID, err)
	}
	if err := oneRow(res); err != nil {
		return fmt.Errorf("deleting checkpoint %s of sandbox %s: %w", id, sandboxID, err)
	}
	return nil
}

// scanCheckpoint reads one row of columns.CheckpointNames into a new record.
func scanCheckpoint(row scanner) (*store.Checkpoint, error) {
	var (
		cp   store.Checkpoint
		c    columns.Checkpoint
		name sql.NullString
	)
	err := row.Scan(&cp.Sandbox, &cp.ID, &name, &cp.Comment, &cp.Memory, &cp.Auto, &c.CreatedAt,
		&cp.SandboxName, &cp.Template, &cp.Image, &c.Resources, &cp.LegacyAgentToken, &cp.AgentGen, &cp.Inside)
	if err != nil {
		return nil, err
	}
	if name.Valid {
		c.Name = &name.String
	}
	if err := c.Decode(&cp); err != nil {
		return nil, err
	}
	return &cp, nil
}
