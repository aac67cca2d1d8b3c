package guest

import (
	"errors"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

func TestCheckAnswer(t *testing.T) {
	code := 0
	sb := &store.Sandbox{}
	sb.Name = "box"
	tests := []struct {
		name string
		s    api.Session
		ok   bool
	}{
		{"running", api.Session{ID: "s-abc123", State: api.SessionRunning}, true},
		{"exited", api.Session{ID: "s-abc123", State: api.SessionExited, ExitCode: &code}, true},
		{"bad id", api.Session{ID: "../x", State: api.SessionRunning}, false},
		{"bad state", api.Session{ID: "s-abc123", State: "sleeping"}, false},
		{"exited without a code", api.Session{ID: "s-abc123", State: api.SessionExited}, false},
		{"running with a code", api.Session{ID: "s-abc123", State: api.SessionRunning, ExitCode: &code, StartedAt: time.Now()}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkAnswer(sb, &tt.s)
			if (err == nil) != tt.ok {
				t.Fatalf("checkAnswer = %v, want ok %v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, api.ErrInternal) {
				t.Fatalf("checkAnswer = %v, want an internal error", err)
			}
		})
	}
}
