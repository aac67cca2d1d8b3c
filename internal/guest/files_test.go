package guest

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/store"
)

// TestFileError: only the statuses of the files protocol become the user's
// errors, in loam's words with the agent's quoted; whatever else an agent
// answers is its own failure, whatever class it claims.
func TestFileError(t *testing.T) {
	g := &Guest{log: slog.New(slog.DiscardHandler)}
	sb := &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-1", Name: "box"}}
	tests := []struct {
		name string
		err  error
		code api.Code
		msg  string
	}{
		{"400", &agent.Error{Status: 400, Code: "invalid", Message: "/x: not a directory"}, api.CodeInvalid, `reading /x in sandbox box: refused (the sandbox says "/x: not a directory")`},
		{"403", &agent.Error{Status: 403, Code: "forbidden", Message: "/x: permission denied"}, api.CodeForbidden, "permission denied"},
		{"404", &agent.Error{Status: 404, Code: "not_found", Message: "/x: no such file"}, api.CodeNotFound, "not found"},
		{"409", &agent.Error{Status: 409, Code: "conflict", Message: "/x: not empty"}, api.CodeConflict, "in conflict with what is there"},
		{"401 is not the user's", &agent.Error{Status: 401, Code: "unauthorized"}, api.CodeInternal, "the sandbox's agent failed"},
		{"500 claiming not_found", &agent.Error{Status: 500, Code: "not_found", Message: "x"}, api.CodeInternal, "the sandbox's agent failed"},
		{"no answer", errors.New("connection refused"), api.CodeUnavailable, "does not answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := g.callError(context.Background(), "", sb, "reading", "/x", tt.err)
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != tt.code || !strings.Contains(ae.Message, tt.msg) {
				t.Errorf("got %v, want %s containing %q", err, tt.code, tt.msg)
			}
		})
	}

	// A call the core cut says why, whatever the agent's side saw.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := g.callError(ctx, "the sandbox is being checkpointed", sb, "reading", "/x", context.Canceled)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable || !strings.Contains(ae.Message, "cut short: the sandbox is being checkpointed") {
		t.Errorf("cut call: %v", err)
	}
}
