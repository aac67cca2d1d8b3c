package sandbox_test

import (
	"os"
	"strings"
	"testing"

	"loam.dev/loam/internal/runtime/fake"
)

// TestMain lets the fake runtime run this test binary as its containers'
// agent (see fake.RunAgentIfChild).
func TestMain(m *testing.M) {
	fake.RunAgentIfChild()
	os.Exit(m.Run())
}

// envValue is key's value in env (KEY=VALUE), "" when it is not set.
func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}
