package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"loam.dev/loam/api"
)

// fakeImages is the image service.
type fakeImages struct{}

func (fakeImages) Pull(ctx context.Context, ref string) (*api.Image, error) {
	if ref == "" {
		return nil, api.Errorf(api.CodeInvalid, "ref: give an image reference")
	}
	return &api.Image{ID: "im-1", Ref: ref, State: api.ImagePulling}, nil
}

func (fakeImages) Get(ctx context.Context, id string) (*api.Image, error) {
	if id != "im-1" {
		return nil, api.Errorf(api.CodeNotFound, "image %q not found", id)
	}
	return &api.Image{ID: id, State: api.ImageReady}, nil
}

func (fakeImages) List(ctx context.Context) ([]api.Image, error) {
	return []api.Image{}, nil
}

func (fakeImages) Delete(ctx context.Context, id string) error {
	return api.Errorf(api.CodeConflict, "image %s is used by sandbox box", id)
}

// fakeRegistries keeps registry credentials.
type fakeRegistries struct{}

func (fakeRegistries) Login(ctx context.Context, registry string, login api.RegistryLogin) (*api.Registry, error) {
	return &api.Registry{Registry: registry, Username: login.Username}, nil
}

func (fakeRegistries) Logout(ctx context.Context, registry string) error { return nil }

func (fakeRegistries) List(ctx context.Context) ([]api.Registry, error) {
	return []api.Registry{}, nil
}

// TestImageRoutes: a pull answers at once with 202; errors keep their
// classes; a login's malformed body is never quoted (it holds a password).
func TestImageRoutes(t *testing.T) {
	srv := httptest.NewServer(New(newFake(), "tok", discardLog(), fakeServices(newFake())...))
	defer srv.Close()
	for _, tc := range []struct {
		method, path, body string
		want               int
		not                string
	}{
		{"POST", "/v1/images", `{"ref":"alpine:3"}`, http.StatusAccepted, ""},
		{"POST", "/v1/images", `{}`, http.StatusBadRequest, ""},
		{"GET", "/v1/images/im-1", "", http.StatusOK, ""},
		{"GET", "/v1/images/im-2", "", http.StatusNotFound, ""},
		{"DELETE", "/v1/images/im-1", "", http.StatusConflict, ""},
		{"PUT", "/v1/registries/localhost:5000", `{"username":"a","password":hunter2}`, http.StatusBadRequest, "hunter"},
		{"PUT", "/v1/registries/localhost:5000", `{"username":"a","password":"hunter2"}`, http.StatusOK, "hunter"},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || (tc.not != "" && strings.Contains(string(b), tc.not)) {
			t.Errorf("%s %s %s: %d %s; want %d", tc.method, tc.path, tc.body, resp.StatusCode, b, tc.want)
		}
	}
}
