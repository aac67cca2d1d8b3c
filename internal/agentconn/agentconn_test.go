package agentconn_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"loam.dev/loam/api"
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
