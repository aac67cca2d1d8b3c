package guest

import (
	"bytes"
	"encoding/json"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agentconn"
)

// canonical fails unless out is nil or exactly what loam writes for the
// value it decodes into v: the client, whatever JSON reader it has, then
// reads what loam checked.
func canonical(t *testing.T, what string, in, out []byte, v any) bool {
	t.Helper()
	if out == nil {
		return false
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("%s(%q) = %q: %v", what, in, out, err)
	}
	again, _ := json.Marshal(v)
	if !bytes.Equal(again, out) {
		t.Fatalf("%s(%q) = %q, not as loam writes it (%q)", what, in, out, again)
	}
	return true
}

// FuzzAgentFrames feeds the filters of what an agent sends up a stream
// (exec and attach control, watch events, port events) fuzzed text
// frames: what reaches the client is loam's own writing of what it read,
// and an agent's error never carries a class it may not choose.
func FuzzAgentFrames(f *testing.F) {
	for _, s := range []string{
		`{"type":"started","pid":7,"session":"s-1"}`,
		`{"type":"exit","exit_code":0}`,
		`{"type":"offset","stream":2,"offset":100,"dropped":5}`,
		`{"type":"error","error":{"code":"not_found","message":"exec: \"x\": not found"}}`,
		`{"type":"error","error":{"code":"unauthorized","message":"x"}}`,
		`{"type":"error","error":{"code":"forbidden","message":"x"},"pid":"x"}`,
		`{"type":"error","error":{"code":"forbidden","message":"x"},"Error":{"code":"invalid","message":"y"}}`,
		`{"type":"exit","Type":"error"}`,
		`{"type":"create","path":"/tmp/x"}`,
		`{"type":"overflow"}`,
		`{"type":"open","port":8080}`,
		`{"type":"close","port":70000}`,
		`{"type":"open","port":80,"host":"evil"}`,
		`{"type":"error","error":null}`,
		`not json`, `null`, `[]`, `{"type":"error","error":{"code":"invalid","message":"\ud800"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := bytes.Clone(data)
		var c api.ExecControl
		if canonical(t, "agentControl", in, agentconn.Control(data), &c) && c.Type == api.ExecError {
			if c.Error == nil || !(agentconn.MayChoose(c.Error.Code) || c.Error.Code == api.CodeInternal) || len(c.Error.Message) > agentconn.MaxMessage+200 {
				t.Fatalf("agentControl(%q): an error %+v reaches the client", in, c.Error)
			}
		}
		var w api.WatchEvent
		if canonical(t, "watchEvent", in, watchEvent(data), &w) {
			switch w.Type {
			case api.WatchCreate, api.WatchWrite, api.WatchRemove, api.WatchRename, api.WatchChmod, api.WatchOverflow:
			default:
				t.Fatalf("watchEvent(%q): type %q", in, w.Type)
			}
			if len(w.Path) > api.MaxFilePath {
				t.Fatalf("watchEvent(%q): a path of %d bytes", in, len(w.Path))
			}
		}
		var p api.PortEvent
		if canonical(t, "portEvent", in, portEvent(data), &p) {
			if p.Type != api.PortOpen && p.Type != api.PortClose || p.Port < 1 || p.Port > api.MaxPort {
				t.Fatalf("portEvent(%q) = %+v", in, p)
			}
		}
		if !bytes.Equal(in, data) {
			t.Fatalf("a filter changed its input")
		}
	})
}
