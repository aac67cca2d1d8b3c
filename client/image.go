package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"loam.dev/loam/api"
)

// PullImage starts pulling an OCI image (a registry reference, or an
// absolute path on the daemon's host to an OCI layout directory or a
// `docker save` tarball) and returns at once with its state; GetImage
// shows the pull's progress, WaitImage waits for its end.
func (c *Client) PullImage(ctx context.Context, ref string) (*api.Image, error) {
	var im api.Image
	if err := c.do(ctx, "POST", "/v1/images", nil, api.PullImage{Ref: ref}, &im); err != nil {
		return nil, fmt.Errorf("pulling image %s: %w", ref, err)
	}
	return &im, nil
}

// GetImage gets an image by id, with the bytes its pull has read.
func (c *Client) GetImage(ctx context.Context, id string) (*api.Image, error) {
	seg, err := segment("image", id)
	if err != nil {
		return nil, err
	}
	var im api.Image
	if err := c.do(ctx, "GET", "/v1/images/"+seg, nil, nil, &im); err != nil {
		return nil, fmt.Errorf("getting image %s: %w", id, err)
	}
	return &im, nil
}

// ErrImagePull is wrapped by WaitImage's error when the pull failed; the
// image's Error says why.
var ErrImagePull = errors.New("the pull failed")

// WaitImage polls an image every interval (a quarter second when 0) until
// its pull ends, calling progress (when not nil) with each state seen. It
// returns the image once ready, or with ErrImagePull.
func (c *Client) WaitImage(ctx context.Context, id string, interval time.Duration, progress func(*api.Image)) (*api.Image, error) {
	if interval <= 0 {
		interval = 250 * time.Millisecond
	}
	for {
		im, err := c.GetImage(ctx, id)
		if err != nil {
			return nil, err
		}
		if progress != nil {
			progress(im)
		}
		switch im.State {
		case api.ImageReady:
			return im, nil
		case api.ImageError:
			return im, fmt.Errorf("pulling %s: %w: %s", im.Ref, ErrImagePull, im.Error)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(interval):
		}
	}
}

// ListImages lists the images, oldest first.
func (c *Client) ListImages(ctx context.Context) ([]api.Image, error) {
	var list api.ImageList
	if err := c.do(ctx, "GET", "/v1/images", nil, nil, &list); err != nil {
		return nil, fmt.Errorf("listing images: %w", err)
	}
	if list.Images == nil {
		list.Images = []api.Image{}
	}
	return list.Images, nil
}

// DeleteImage deletes an image by id: a conflict (api.CodeConflict) while a
// sandbox uses it.
func (c *Client) DeleteImage(ctx context.Context, id string) error {
	seg, err := segment("image", id)
	if err != nil {
		return err
	}
	if err := c.do(ctx, "DELETE", "/v1/images/"+seg, nil, nil, nil); err != nil {
		return fmt.Errorf("deleting image %s: %w", id, err)
	}
	return nil
}

// LoginRegistry stores the credentials images are pulled from registry
// (a host: ghcr.io, localhost:5000) with, encrypted by the daemon.
func (c *Client) LoginRegistry(ctx context.Context, registry, username, password string) (*api.Registry, error) {
	seg, err := segment("registry", registry)
	if err != nil {
		return nil, err
	}
	var reg api.Registry
	if err := c.do(ctx, "PUT", "/v1/registries/"+seg, nil, api.RegistryLogin{Username: username, Password: password}, &reg); err != nil {
		return nil, fmt.Errorf("logging in to %s: %w", registry, err)
	}
	return &reg, nil
}

// ListRegistries lists the registries with credentials (never a password).
func (c *Client) ListRegistries(ctx context.Context) ([]api.Registry, error) {
	var list api.RegistryList
	if err := c.do(ctx, "GET", "/v1/registries", nil, nil, &list); err != nil {
		return nil, fmt.Errorf("listing registries: %w", err)
	}
	if list.Registries == nil {
		list.Registries = []api.Registry{}
	}
	return list.Registries, nil
}

// LogoutRegistry forgets a registry's credentials.
func (c *Client) LogoutRegistry(ctx context.Context, registry string) error {
	seg, err := segment("registry", registry)
	if err != nil {
		return err
	}
	if err := c.do(ctx, "DELETE", "/v1/registries/"+seg, nil, nil, nil); err != nil {
		return fmt.Errorf("logging out of %s: %w", registry, err)
	}
	return nil
}
