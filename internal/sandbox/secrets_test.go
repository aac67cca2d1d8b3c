package sandbox

import (
	"context"
	"errors"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/secret"
)

// mapSecrets is a secret.Store in memory.
type mapSecrets map[string]secret.Value

func (s mapSecrets) Put(ctx context.Context, name string, v secret.Value) (*api.Secret, error) {
	s[name] = v
	return &api.Secret{Name: name}, nil
}

func (s mapSecrets) List(ctx context.Context) ([]api.Secret, error) { return nil, nil }

func (s mapSecrets) Delete(ctx context.Context, name string) error {
	delete(s, name)
	return nil
}

func (s mapSecrets) Resolve(ctx context.Context, org string, names []string) (map[string]secret.Value, error) {
	out := map[string]secret.Value{}
	for _, n := range names {
		if v, ok := s[n]; ok {
			out[n] = v
		}
	}
	return out, nil
}

func TestCheckSecretRefs(t *testing.T) {
	m := &Manager{cfg: Config{Secrets: mapSecrets{"db": secret.NewValue("v")}}}
	tests := []struct {
		name string
		req  api.CreateSandbox
		ok   bool
	}{
		{"none", api.CreateSandbox{}, true},
		{"env and file", api.CreateSandbox{Secrets: map[string]string{"DB": "db"}, SecretFiles: map[string]string{"/run/secrets/db": "db"}}, true},
		{"missing secret", api.CreateSandbox{Secrets: map[string]string{"DB": "nope"}}, false},
		{"bad secret name", api.CreateSandbox{Secrets: map[string]string{"DB": "a/b"}}, false},
		{"bad variable", api.CreateSandbox{Secrets: map[string]string{"A=B": "db"}}, false},
		{"reserved variable", api.CreateSandbox{Secrets: map[string]string{"LOAM_SANDBOX": "db"}}, false},
		{"also in env", api.CreateSandbox{Env: map[string]string{"DB": "x"}, Secrets: map[string]string{"DB": "db"}}, false},
		{"relative path", api.CreateSandbox{SecretFiles: map[string]string{"run/db": "db"}}, false},
		{"unclean path", api.CreateSandbox{SecretFiles: map[string]string{"/run/../etc/db": "db"}}, false},
		{"root", api.CreateSandbox{SecretFiles: map[string]string{"/": "db"}}, false},
		{"agent's dir", api.CreateSandbox{SecretFiles: map[string]string{"/var/lib/loam/token": "db"}}, false},
		{"proc", api.CreateSandbox{SecretFiles: map[string]string{"/proc/x": "db"}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := m.checkSecretRefs(context.Background(), tc.req)
			if tc.ok && err != nil {
				t.Errorf("refused: %v", err)
			}
			if !tc.ok && !errors.Is(err, api.ErrInvalid) {
				t.Errorf("got %v, want invalid", err)
			}
		})
	}
	none := &Manager{}
	if err := none.checkSecretRefs(context.Background(), api.CreateSandbox{Secrets: map[string]string{"DB": "db"}}); err == nil {
		t.Error("a manager without secrets took a create that names one")
	}
}
