package server

import (
	"context"
	"net/http"

	"loam.dev/loam/api"
)

// Images is what the server needs for OCI images and the registries they
// come from. No route returns a registry's password.
type Images interface {
	PullImage(ctx context.Context, ref string) (*api.Image, error)
	GetImage(ctx context.Context, id string) (*api.Image, error)
	ListImages(ctx context.Context) ([]api.Image, error)
	DeleteImage(ctx context.Context, id string) error
	LoginRegistry(ctx context.Context, registry string, login api.RegistryLogin) (*api.Registry, error)
	LogoutRegistry(ctx context.Context, registry string) error
	ListRegistries(ctx context.Context) ([]api.Registry, error)
}

func (s *Server) imageRoutes(v1 func(string, func(http.ResponseWriter, *http.Request) error)) {
	v1("POST /v1/images", s.pullImage)
	v1("GET /v1/images", s.listImages)
	v1("GET /v1/images/{image}", s.getImage)
	v1("DELETE /v1/images/{image}", s.deleteImage)
	v1("PUT /v1/registries/{registry}", s.loginRegistry)
	v1("GET /v1/registries", s.listRegistries)
	v1("DELETE /v1/registries/{registry}", s.logoutRegistry)
}

func (s *Server) pullImage(w http.ResponseWriter, r *http.Request) error {
	var req api.PullImage
	if err := decode(w, r, &req); err != nil {
		return err
	}
	im, err := s.sandboxes.PullImage(r.Context(), req.Ref)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusAccepted, im)
	return nil
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) error {
	list, err := s.sandboxes.ListImages(r.Context())
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.ImageList{Images: list})
	return nil
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request) error {
	im, err := s.sandboxes.GetImage(r.Context(), r.PathValue("image"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, im)
	return nil
}

func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request) error {
	if err := s.sandboxes.DeleteImage(r.Context(), r.PathValue("image")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// errLoginBody never quotes the body: it holds a password.
var errLoginBody = api.Errorf(api.CodeInvalid, `body: must be a JSON object {"username":"…","password":"…"}`)

func (s *Server) loginRegistry(w http.ResponseWriter, r *http.Request) error {
	var req api.RegistryLogin
	if err := decodeJSON(http.MaxBytesReader(w, r.Body, maxBody), &req); err != nil {
		return errLoginBody
	}
	reg, err := s.sandboxes.LoginRegistry(r.Context(), r.PathValue("registry"), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, reg)
	return nil
}

func (s *Server) listRegistries(w http.ResponseWriter, r *http.Request) error {
	list, err := s.sandboxes.ListRegistries(r.Context())
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.RegistryList{Registries: list})
	return nil
}

func (s *Server) logoutRegistry(w http.ResponseWriter, r *http.Request) error {
	if err := s.sandboxes.LogoutRegistry(r.Context(), r.PathValue("registry")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
