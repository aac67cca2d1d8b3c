package api

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckService(t *testing.T) {
	for _, tt := range []struct {
		name string
		s    Service
		bad  string // what the error names; "" for none
	}{
		{"minimal", Service{Name: "web", Cmd: []string{"x"}}, ""},
		{"every field", Service{Name: "a-1", Cmd: []string{"x", "y"}, Env: map[string]string{"K": "v"}, Dir: "d", User: "u", Restart: RestartOnFailure}, ""},
		{"longest name", Service{Name: "a" + strings.Repeat("b", 62), Cmd: []string{"x"}}, ""},
		{"no name", Service{Cmd: []string{"x"}}, "name"},
		{"name too long", Service{Name: "a" + strings.Repeat("b", 63), Cmd: []string{"x"}}, "name"},
		{"name with a capital", Service{Name: "Web", Cmd: []string{"x"}}, "name"},
		{"name starting with a digit", Service{Name: "1web", Cmd: []string{"x"}}, "name"},
		{"name with a dot", Service{Name: "web.json", Cmd: []string{"x"}}, "name"},
		{"no cmd", Service{Name: "web"}, "cmd"},
		{"empty program", Service{Name: "web", Cmd: []string{""}}, "cmd"},
		{"NUL in cmd", Service{Name: "web", Cmd: []string{"x\x00"}}, "cmd"},
		{"bad env", Service{Name: "web", Cmd: []string{"x"}, Env: map[string]string{"A=B": "c"}}, "env"},
		{"bad restart", Service{Name: "web", Cmd: []string{"x"}, Restart: "sometimes"}, "restart"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckService(&tt.s)
			if tt.bad == "" {
				if err != nil {
					t.Fatalf("CheckService = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.(*Error).Message, tt.bad+":") {
				t.Fatalf("CheckService = %v, want invalid about %s", err, tt.bad)
			}
		})
	}
}
