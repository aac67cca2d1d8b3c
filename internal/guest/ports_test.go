package guest

import (
	"errors"
	"fmt"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
)

// TestPortEvent: what an agent says on a port watch reaches the client
// only as a port event loam writes itself.
func TestPortEvent(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"type":"open","port":8000}`, `{"type":"open","port":8000}`},
		{`{"type":"close","port":1,"extra":"x"}`, `{"type":"close","port":1}`},
		{`{"type":"error","port":80}`, ""},
		{`{"type":"open","port":0}`, ""},
		{`{"type":"open","port":65536}`, ""},
		{`not json`, ""},
	} {
		t.Run(tc.in, func(t *testing.T) {
			if got := string(portEvent([]byte(tc.in))); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPortRefusal: an agent's refusal of a port stream becomes loam's own
// error by its status only; the agent's words never reach the client.
func TestPortRefusal(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want *api.Error // nil: the agent's failure, not a refusal
	}{
		{"nothing listens", &agent.Error{Status: 404, Code: "forbidden", Message: "lies"}, api.Errorf(api.CodeNotFound, "nothing listens on TCP port 8080 in sandbox box")},
		{"not accepting", fmt.Errorf("opening: %w", &agent.Error{Status: 503}), api.Errorf(api.CodeUnavailable, "TCP port 8080 in sandbox box does not accept connections")},
		{"the agent's own port", &agent.Error{Status: 403, Code: "not_found"}, nil},
		{"agent failure", &agent.Error{Status: 500}, nil},
		{"no answer", errors.New("connection refused"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := portRefusal("box", 8080, tc.err)
			if tc.want == nil {
				if got != nil {
					t.Fatalf("got %v, want the agent's failure", got)
				}
				return
			}
			var ae *api.Error
			if !errors.As(got, &ae) || *ae != *tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestCheckPorts: a listing passes on only what can be true, and says
// itself which ports are loopback-only.
func TestCheckPorts(t *testing.T) {
	ok := []api.Port{
		{Port: 80, Addresses: []string{"0.0.0.0", "::"}, Loopback: true},
		{Port: 9000, Addresses: []string{"127.0.0.1", "::1"}},
	}
	got, err := checkPorts(ok, agent.DefaultPort)
	if err != nil || got[0].Loopback || !got[1].Loopback {
		t.Fatalf("got %+v, %v", got, err)
	}
	for _, tc := range []struct {
		name string
		p    api.Port
	}{
		{"port 0", api.Port{Port: 0, Addresses: []string{"0.0.0.0"}}},
		{"port 65536", api.Port{Port: 65536, Addresses: []string{"0.0.0.0"}}},
		{"the agent's port", api.Port{Port: agent.DefaultPort, Addresses: []string{"0.0.0.0"}}},
		{"no address", api.Port{Port: 80}},
		{"not an address", api.Port{Port: 80, Addresses: []string{"<script>"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := checkPorts([]api.Port{tc.p}, agent.DefaultPort); !errors.Is(err, api.ErrInternal) {
				t.Fatalf("got %v, want internal", err)
			}
		})
	}
}
