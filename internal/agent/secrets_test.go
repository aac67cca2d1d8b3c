package agent

import (
	"maps"
	"testing"
)

// TestSecretEnv: the secrets come under the request's own env, and a
// handler without an identity, or whose identity has no secrets, adds
// nothing.
func TestSecretEnv(t *testing.T) {
	h := &handler{}
	req := map[string]string{"A": "request", "PATH": "/bin"}
	if got := h.secretEnv(req); !maps.Equal(got, req) {
		t.Errorf("no identity: %v", got)
	}
	h.identity.Store(&Identity{SandboxID: "sb", SecretEnv: map[string]string{"A": "secret", "DB": "pass"}})
	got := h.secretEnv(req)
	want := map[string]string{"A": "request", "PATH": "/bin", "DB": "pass"}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if req["DB"] != "" {
		t.Error("the request's map was changed")
	}
}
