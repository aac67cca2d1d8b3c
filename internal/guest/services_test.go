package guest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/store"
)

func TestCheckServiceAnswer(t *testing.T) {
	sb := &store.Sandbox{}
	sb.Name = "box"
	for _, tt := range []struct {
		name string
		s    api.ServiceStatus
		ok   bool
	}{
		{"running", api.ServiceStatus{Service: api.Service{Name: "web"}, State: api.ServiceRunning, PID: 7}, true},
		{"stopped", api.ServiceStatus{Service: api.Service{Name: "web"}, State: api.ServiceStopped}, true},
		{"bad name", api.ServiceStatus{Service: api.Service{Name: "../x"}, State: api.ServiceRunning}, false},
		{"bad state", api.ServiceStatus{Service: api.Service{Name: "web"}, State: "sleeping"}, false},
		{"negative restarts", api.ServiceStatus{Service: api.Service{Name: "web"}, State: api.ServiceBackoff, Restarts: -1}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := checkServiceAnswer(sb, &tt.s)
			if (err == nil) != tt.ok {
				t.Fatalf("checkServiceAnswer = %v, want ok %v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, api.ErrInternal) {
				t.Fatalf("checkServiceAnswer = %v, want an internal error", err)
			}
		})
	}
}

// TestServiceError: the agent's answers never choose the API's error class
// by themselves; each status maps to what loam means by it.
func TestServiceError(t *testing.T) {
	g := &Guest{log: slog.New(slog.DiscardHandler)}
	sb := &store.Sandbox{}
	sb.Name, sb.ID = "box", "sb-000000000001"
	wrap := func(e *agent.Error) error { return fmt.Errorf("calling the agent: %w", e) }
	for _, tt := range []struct {
		name    string
		service string
		err     error
		want    error
		msg     string
	}{
		{"no such service", "web", wrap(&agent.Error{Status: http.StatusNotFound, Code: "not_found", Message: "anything"}), api.ErrNotFound, `no service "web"`},
		{"a definition the sandbox cannot run", "web", wrap(&agent.Error{Status: http.StatusBadRequest, Code: "invalid", Message: `user "x" does not exist`}), api.ErrInvalid, `user "x" does not exist`},
		{"a 404 about no service is the agent's failure", "", wrap(&agent.Error{Status: http.StatusNotFound, Code: "not_found"}), api.ErrInternal, "agent failed"},
		{"a class the agent may not choose", "web", wrap(&agent.Error{Status: http.StatusForbidden, Code: "forbidden", Message: "no"}), api.ErrInternal, "agent failed"},
		{"a 400 that says another class", "web", wrap(&agent.Error{Status: http.StatusBadRequest, Code: "limit_exceeded"}), api.ErrInternal, "agent failed"},
		{"no answer", "web", errors.New("connection refused"), api.ErrUnavailable, "does not answer"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := g.serviceError(context.Background(), sb, tt.service, tt.err)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("serviceError = %v, want %v about %q", err, tt.want, tt.msg)
			}
		})
	}
}
