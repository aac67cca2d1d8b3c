package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// PutImage stores an image record, replacing the one of its org with its
// id. Another record of the org with its ref is store.ErrExists.
func (s *Store) PutImage(ctx context.Context, im *store.Image) error {
	c, err := columns.EncodeImage(im)
	if err != nil {
		return fmt.Errorf("storing image %s: %w", im.ID, err)
	}
	_, err = s.exec(ctx, `INSERT INTO images (org, id, ref, digest, state, error, size, config, template, user_missing, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
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

const imageColumns = `org, id, ref, digest, state, error, size, config, template, user_missing, created_at`

// GetImage finds an image of org by id; store.ErrNotFound if none.
func (s *Store) GetImage(ctx context.Context, org, id string) (*store.Image, error) {
	im, err := scanImage(s.r.QueryRowContext(ctx, `SELECT `+imageColumns+` FROM images WHERE org = ? AND id = ?`, org, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("getting image %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting image %s: %w", id, err)
	}
	return im, nil
}

// ListImages lists the images of org ("" for every org's), oldest first.
func (s *Store) ListImages(ctx context.Context, org string) ([]*store.Image, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+imageColumns+` FROM images WHERE ? = '' OR org = ? ORDER BY created_at, id, org`, org, org)
	if err != nil {
		return nil, fmt.Errorf("listing images: %w", err)
	}
	defer rows.Close()
	list := []*store.Image{}
	for rows.Next() {
		im, err := scanImage(rows)
		if err != nil {
			return nil, fmt.Errorf("listing images: %w", err)
		}
		list = append(list, im)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing images: %w", err)
	}
	return list, nil
}

// DeleteImage removes an image record of org; store.ErrNotFound if none.
func (s *Store) DeleteImage(ctx context.Context, org, id string) error {
	res, err := s.exec(ctx, `DELETE FROM images WHERE org = ? AND id = ?`, org, id)
	if err != nil {
		return fmt.Errorf("deleting image %s: %w", id, err)
	}
	if err := oneRow(res); err != nil {
		return fmt.Errorf("deleting image %s: %w", id, err)
	}
	return nil
}

func scanImage(row scanner) (*store.Image, error) {
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

// RegistryCredentials is the table of sealed registry credentials, as
// secret.Records, so that internal/secret seals them as it does secrets
// while they stay out of the secrets' listing.
func (s *Store) RegistryCredentials() store.Sealed { return &Credentials{s: s} }

// Credentials is the registry credentials' table; see RegistryCredentials.
type Credentials struct{ s *Store }

// PutSecret stores a sealed credential under its name.
func (c *Credentials) PutSecret(ctx context.Context, sec *store.Secret) error {
	return c.s.putSealed(ctx, "registry_credentials", sec)
}

// GetSecret finds a sealed credential of org by name; store.ErrNotFound
// if none.
func (c *Credentials) GetSecret(ctx context.Context, org, name string) (*store.Secret, error) {
	return c.s.getSealed(ctx, "registry_credentials", org, name)
}

// ListSecrets lists the sealed credentials of org, by name.
func (c *Credentials) ListSecrets(ctx context.Context, org string) ([]*store.Secret, error) {
	return c.s.listSealed(ctx, "registry_credentials", org)
}

// DeleteSecret removes a credential of org; store.ErrNotFound if none.
func (c *Credentials) DeleteSecret(ctx context.Context, org, name string) error {
	return c.s.deleteSealed(ctx, "registry_credentials", org, name)
}
