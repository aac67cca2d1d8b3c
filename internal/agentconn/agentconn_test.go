package agentconn_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/agentconn"
)

// TestAgentControl: an agent may refuse a command as invalid or not found,
// but any other class it names (unauthorized, say, which would tell the
// client its token is wrong) becomes the agent's own failure. What the
// client gets is the message as loam read it: a message loam cannot read
// is dropped, and one that another reader of JSON would read otherwise
// (two keys that Go takes as one) is written anew.
func TestAgentControl(t *testing.T) {
	for _, tc := range []struct {
		in, wantCode string
		same, drop   bool
	}{
		{`{"type":"started","pid":7}`, "", true, false},
		{`{"type":"error","error":{"code":"invalid","message":"user \"x\" does not exist"}}`, "invalid", true, false},
		{`{"type":"error","error":{"code":"not_found","message":"exec: \"x\": not found"}}`, "not_found", true, false},
		{`{"type":"error","error":{"code":"unauthorized","message":"your token is wrong"}}`, "internal", false, false},
		{`{"type":"error","error":{"code":"limit","message":"pay more"}}`, "internal", false, false},
		{`{"type":"error"}`, "internal", false, false},
		{`{"type":"error","error":{"code":"invalid","message":"` + strings.Repeat("x", 5000) + `"}}`, "internal", false, false},
		{`not json`, "", false, true},
		{`{"type":"error","error":{"code":"forbidden","message":"x"},"pid":"not a number"}`, "", false, true},
		{`{"type":"error","error":{"code":"forbidden","message":"js reads this"},"Error":{"code":"invalid","message":"go reads this"}}`, "invalid", false, false},
		{`{"type":"exit","Type":"error","exit_code":0}`, "internal", false, false},
	} {
		out := agentconn.Control([]byte(tc.in))
		if tc.drop {
			if out != nil {
				t.Errorf("%s: passed on as %s", tc.in, out)
			}
			continue
		}
		if tc.same {
			if string(out) != tc.in {
				t.Errorf("%s: rewritten to %s", tc.in, out)
			}
			continue
		}
		var c api.ExecControl
		if err := json.Unmarshal(out, &c); err != nil || c.Error == nil || string(c.Error.Code) != tc.wantCode ||
			(tc.wantCode == "internal") != strings.HasPrefix(c.Error.Message, "the sandbox's agent failed") || len(c.Error.Message) > 1200 ||
			bytes.Contains(out, []byte(`"Error"`)) || bytes.Contains(out, []byte(`"Type"`)) {
			t.Errorf("%.80s: got %.200s", tc.in, out)
		}
	}
}

// TestMap: the one mapper gives an agent's answer only the meaning the
// relay's protocol gives its status; any other answer is the agent's own
// failure (internal, quoted), whatever class or status it claims, 5xx
// included; no answer is the relay's unavailable; a caller gone gets its
// own error back.
func TestMap(t *testing.T) {
	known := func(ae *agent.Error) error {
		if ae.Status == 404 {
			return api.Errorf(api.CodeNotFound, "no such thing")
		}
		return nil
	}
	noAnswer := func() error { return api.Errorf(api.CodeUnavailable, "the sandbox's agent does not answer") }
	bg := context.Background()
	gone, cancel := context.WithCancel(bg)
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want api.Code
		msg  string
	}{
		{"a status the protocol defines", bg, fmt.Errorf("x: %w", &agent.Error{Status: 404, Code: "forbidden", Message: "lies"}), api.CodeNotFound, "no such thing"},
		{"a 5xx claiming unavailable", bg, &agent.Error{Status: 503, Code: "unavailable", Message: "later"}, api.CodeInternal, "the sandbox's agent failed"},
		{"a 500 claiming not_found", bg, &agent.Error{Status: 500, Code: "not_found", Message: "x"}, api.CodeInternal, "the sandbox's agent failed"},
		{"a 401", bg, &agent.Error{Status: 401, Code: "unauthorized"}, api.CodeInternal, "the sandbox's agent failed"},
		{"no answer", bg, errors.New("connection refused"), api.CodeUnavailable, "does not answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := agentconn.Map(tc.ctx, tc.err, known, noAnswer)
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != tc.want || !strings.Contains(ae.Message, tc.msg) {
				t.Fatalf("got %v, want %s about %q", err, tc.want, tc.msg)
			}
		})
	}
	if err := agentconn.Map(gone, context.Canceled, known, noAnswer); err != context.Canceled {
		t.Errorf("caller gone: got %v, want its own error", err)
	}
	if err := agentconn.Map(bg, &agent.Error{Status: 404}, nil, noAnswer); !errors.Is(err, api.ErrInternal) {
		t.Errorf("no known statuses: got %v, want internal", err)
	}
}
