package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

const imageColumns = `org, id, ref, digest, state, error, size, config, template, user_missing, created_at`

// PutImage stores an image record, replacing the one of its org with its
// id. Another record of the org with its ref is store.ErrExists.
func (s *Store) PutImage(ctx context.Context, im *store.Image) error {
	c, err := columns.EncodeImage(im)
	if err != nil {
		return fmt.Errorf("storing image %s: %w", im.ID, err)
	}
	_, err = s.exec(ctx, `INSERT INTO images (`+imageColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
		ON CONFLICT (org, id) DO UPDATE SET ref = excluded.ref, digest = excluded.digest, state = excluded.state,
			error = excluded.error, size = excluded.size, config = excluded.config, template = excluded.template,
			user_missing = excluded.user_missing`,
		im.Org, im.ID, im.Ref, im.Digest, string(im.State), im.Error, im.Size, c.Config, im.Template, im.UserMissing, c.CreatedAt)
	if isUniqueViolation(err) {
		return fmt.Errorf("storing image %s: ref %s: %w", im.ID, im.Ref, store.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("storing image %s: %w", im.ID, err)
	}
	return nil
}

// GetImage finds an image of org by id; store.ErrNotFound if none.
func (s *Store) GetImage(ctx context.Context, org, id string) (*store.Image, error) {
	im, err := scanImage(s.pool.QueryRow(ctx, `SELECT `+imageColumns+` FROM images WHERE org = $1 AND id = $2`, org, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("getting image %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting image %s: %w", id, unavailable(err))
	}
	return im, nil
}

// ListImages lists the images of org ("" for every org's), oldest first.
func (s *Store) ListImages(ctx context.Context, org string) ([]*store.Image, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+imageColumns+` FROM images WHERE $1 = '' OR org = $1 ORDER BY created_at COLLATE "C", id COLLATE "C", org COLLATE "C"`, org)
	if err != nil {
		return nil, fmt.Errorf("listing images: %w", unavailable(err))
	}
	list, err := collect(rows, scanImage)
	if err != nil {
		return nil, fmt.Errorf("listing images: %w", err)
	}
	return list, nil
}

// DeleteImage removes an image record of org; store.ErrNotFound if none.
func (s *Store) DeleteImage(ctx context.Context, org, id string) error {
	tag, err := s.exec(ctx, `DELETE FROM images WHERE org = $1 AND id = $2`, org, id)
	if err != nil {
		return fmt.Errorf("deleting image %s: %w", id, err)
	}
	if err := oneRow(tag); err != nil {
		return fmt.Errorf("deleting image %s: %w", id, err)
	}
	return nil
}

func scanImage(row pgx.Row) (*store.Image, error) {
	var (
		im    store.Image
		state string
		c     columns.Image
	)
	if err := row.Scan(&im.Org, &im.ID, &im.Ref, &im.Digest, &state, &im.Error, &im.Size, &c.Config, &im.Template, &im.UserMissing, &c.CreatedAt); err != nil {
		return nil, err
	}
	im.State = api.ImageState(state)
	if err := c.Decode(&im); err != nil {
		return nil, err
	}
	return &im, nil
}
