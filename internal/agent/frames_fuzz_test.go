package agent

import (
	"encoding/json"
	"errors"
	"net/url"
	"testing"

	"loam.dev/loam/api"
)

// FuzzExecFrames feeds the agent what a client sends on an exec or attach
// socket, as the agent reads it: the request (the first text message),
// control messages (a signal's name), and an attach's query. Nothing may
// panic; a request is refused as invalid or is one the agent can start.
func FuzzExecFrames(f *testing.F) {
	f.Add([]byte(`{"cmd":["sh","-c","echo hi"],"env":{"A":"1"},"dir":"/tmp","user":"root","tty":true,"rows":24,"cols":80,"buffer_size":1024}`), "TERM", "offset=0&stderr_offset=10&follow=false")
	f.Add([]byte(`{"cmd":[""],"env":{"":"x","A=B":"y"}}`), "sigkill", "offset=-1")
	f.Add([]byte(`{"cmd":["a\u0000b"],"rows":-1,"cols":70000,"buffer_size":-5}`), "65", "follow=maybe")
	f.Add([]byte(`{"type":"signal","signal":"INT"}`), "0", "offset=99999999999999999999")
	f.Add([]byte(`{"type":"resize","rows":50,"cols":200}`), " 9 ", "stderr_offset=5")
	f.Add([]byte(`[1,2]`), "SIG", "")
	f.Fuzz(func(t *testing.T, frame []byte, signal, query string) {
		var req api.ExecRequest
		if json.Unmarshal(frame, &req) == nil {
			err := checkRequest(&req)
			var ae *api.Error
			switch {
			case err == nil:
				if len(req.Cmd) == 0 || req.Cmd[0] == "" || req.BufferSize < 0 || req.Rows < 0 || req.Rows > 0xffff || req.Cols < 0 || req.Cols > 0xffff {
					t.Fatalf("request %s accepted", frame)
				}
			case !errors.As(err, &ae) || ae.Code != api.CodeInvalid:
				t.Fatalf("request %s: %v, want invalid", frame, err)
			}
		}
		var c api.ExecControl
		if json.Unmarshal(frame, &c) == nil {
			signal = c.Signal + signal
		}
		if sig := signalByName(signal); sig < 0 || sig > 64 {
			t.Fatalf("signal %q = %d", signal, sig)
		}
		q, _ := url.ParseQuery(query)
		from, err := parseAttachFrom(q)
		var ae *api.Error
		if err != nil && (!errors.As(err, &ae) || ae.Code != api.CodeInvalid) {
			t.Fatalf("query %q: %v, want invalid", query, err)
		}
		if err == nil && (from.stdout != nil && *from.stdout < 0 || from.stderr != nil && *from.stderr < 0) {
			t.Fatalf("query %q: negative offsets accepted", query)
		}
	})
}
