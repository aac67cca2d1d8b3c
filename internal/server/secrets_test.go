package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/secret"
)

// fakeSecrets is the secret keeper.
type fakeSecrets struct{}

func (fakeSecrets) Put(ctx context.Context, org, name string, value secret.Value) (*api.Secret, error) {
	if err := secret.CheckName(name); err != nil {
		return nil, err
	}
	return &api.Secret{Name: name}, nil
}

func (fakeSecrets) List(ctx context.Context, org string) ([]api.Secret, error) {
	return []api.Secret{}, nil
}

func (fakeSecrets) Delete(ctx context.Context, org, name string, force bool) error {
	if !force {
		return api.Errorf(api.CodeConflict, "secret %q is used by sandbox box", name)
	}
	return nil
}

// TestSecretBodyNotEchoed: a malformed body's error never quotes it, since
// the body is the value.
func TestSecretBodyNotEchoed(t *testing.T) {
	srv := httptest.NewServer(New(newFake(), "tok", discardLog(), fakeServices(newFake())...))
	defer srv.Close()
	for _, body := range []string{`{"value":hunter2}`, `{"value":"hunter2","x":1}`, `{"value":["hunter2"]}`, `hunter2`} {
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/v1/secrets/db", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(b), "hunter") || strings.Contains(string(b), "'h'") {
			t.Errorf("%s: %d %s", body, resp.StatusCode, b)
		}
	}
	for _, tc := range []struct {
		q    string
		want int
	}{{"", http.StatusConflict}, {"?force=true", http.StatusNoContent}, {"?force=maybe", http.StatusBadRequest}} {
		req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/v1/secrets/db"+tc.q, nil)
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("DELETE%s: %d, want %d", tc.q, resp.StatusCode, tc.want)
		}
	}
}
