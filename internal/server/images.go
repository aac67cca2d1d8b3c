package server

import (
	"context"
	"net/http"

	"loam.dev/loam/api"
)

// Images is what the server needs of the image service (image.Service
// has it).
type Images interface {
	// Pull starts pulling an image; the answer is its state now.
	Pull(ctx context.Context, ref string) (*api.Image, error)
	Get(ctx context.Context, id string) (*api.Image, error)
	List(ctx context.Context) ([]api.Image, error)
	// Delete forgets an image; a conflict while a sandbox uses it.
	Delete(ctx context.Context, id string) error
}

// Registries keeps the credentials images are pulled with
// (image.Credentials has it). No route returns a registry's password.
type Registries interface {
	Login(ctx context.Context, registry string, login api.RegistryLogin) (*api.Registry, error)
	Logout(ctx context.Context, registry string) error
	List(ctx context.Context) ([]api.Registry, error)
}

// WithImages serves the images and registries routes from images and
// registries; without it they answer unavailable (and lists are empty).
func WithImages(images Images, registries Registries) Option {
	return func(s *Server) { s.images, s.registries = images, registries }
}

// errNoImages answers the image routes of a server without images.
var errNoImages = api.Errorf(api.CodeUnavailable, "this daemon has no image support")

// imageRoutes serves the images sandboxes are made from, and the registry
// credentials they are pulled with.
type imageRoutes struct {
	// images and registries are nil on a server without image support
	// (see WithImages).
	images     Images
	registries Registries
}

// register adds the image and registry routes with v1.
func (ir *imageRoutes) register(v1 addRoute) {
	v1("POST /v1/images", api.ScopeWrite, "image.pull", ir.pullImage)
	v1("GET /v1/images", api.ScopeRead, "", ir.listImages)
	v1("GET /v1/images/{image}", api.ScopeRead, "", ir.getImage)
	v1("DELETE /v1/images/{image}", api.ScopeWrite, "image.delete", ir.deleteImage)
	v1("PUT /v1/registries/{registry}", api.ScopeWrite, "registry.login", ir.loginRegistry)
	v1("GET /v1/registries", api.ScopeRead, "", ir.listRegistries)
	v1("DELETE /v1/registries/{registry}", api.ScopeWrite, "registry.logout", ir.logoutRegistry)
}

func (ir *imageRoutes) pullImage(w http.ResponseWriter, r *http.Request) error {
	var req api.PullImage
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if ir.images == nil {
		return errNoImages
	}
	im, err := ir.images.Pull(r.Context(), req.Ref)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusAccepted, im)
	return nil
}

func (ir *imageRoutes) listImages(w http.ResponseWriter, r *http.Request) error {
	list := []api.Image{}
	var err error
	if ir.images != nil {
		list, err = ir.images.List(r.Context())
	}
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.ImageList{Images: list})
	return nil
}

func (ir *imageRoutes) getImage(w http.ResponseWriter, r *http.Request) error {
	if ir.images == nil {
		return errNoImages
	}
	im, err := ir.images.Get(r.Context(), r.PathValue("image"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, im)
	return nil
}

func (ir *imageRoutes) deleteImage(w http.ResponseWriter, r *http.Request) error {
	if ir.images == nil {
		return errNoImages
	}
	if err := ir.images.Delete(r.Context(), r.PathValue("image")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// errLoginBody never quotes the body: it holds a password.
var errLoginBody = api.Errorf(api.CodeInvalid, `body: must be a JSON object {"username":"…","password":"…"}`)

func (ir *imageRoutes) loginRegistry(w http.ResponseWriter, r *http.Request) error {
	var req api.RegistryLogin
	if err := decodeJSON(http.MaxBytesReader(w, r.Body, maxBody), &req); err != nil {
		return errLoginBody
	}
	if ir.registries == nil {
		return errNoImages
	}
	reg, err := ir.registries.Login(r.Context(), r.PathValue("registry"), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, reg)
	return nil
}

func (ir *imageRoutes) listRegistries(w http.ResponseWriter, r *http.Request) error {
	list := []api.Registry{}
	var err error
	if ir.registries != nil {
		list, err = ir.registries.List(r.Context())
	}
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.RegistryList{Registries: list})
	return nil
}

func (ir *imageRoutes) logoutRegistry(w http.ResponseWriter, r *http.Request) error {
	if ir.registries == nil {
		return errNoImages
	}
	if err := ir.registries.Logout(r.Context(), r.PathValue("registry")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
