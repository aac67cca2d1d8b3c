package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

func TestCheckDuplicates(t *testing.T) {
	for _, tc := range []struct {
		body, err string
	}{
		{`{}`, ""},
		{`{"a":1,"b":{"a":1},"c":[{"a":1},{"a":2}]}`, ""},
		{`{"a":[[],{}],"b":[1,"a",null,{"b":{}}]}`, ""},
		{`{"a":"a","A":1}`, ""}, // names are compared as they are
		{`{"a":1,"a":1}`, "a: given twice"},
		{`{"a":1,"\u0061":1}`, "a: given twice"},
		{`{"a":{"b":1,"b":2}}`, "a.b: given twice"},
		{`{"a":[{"b":1},{"b":1,"c":{},"c":[]}]}`, "a.c: given twice"},
		{`{"a":[],"b":{},"a":0}`, "a: given twice"},
	} {
		err := checkDuplicates([]byte(tc.body))
		var ae *api.Error
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.body, err)
		case tc.err != "" && (!errors.As(err, &ae) || ae.Code != api.CodeInvalid || ae.Message != tc.err):
			t.Errorf("%s: %v, want %q", tc.body, err, tc.err)
		}
	}
}

// TestExecRequestChecks: the exec socket's first message is held to the
// rules of a request body.
func TestExecRequestChecks(t *testing.T) {
	for _, tc := range []struct{ msg, want string }{
		{`{"cmd":["true"],"cmd":["rm","-rf","/"]}`, "cmd: given twice"},
		{"{\"cmd\":[\"echo\",\"\xff\"]}", "body: not valid UTF-8"},
		{`{"cmd":["true"],"nope":1}`, "nope: unknown field"},
	} {
		_, err := execRequest(websocket.MessageText, []byte(tc.msg))
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeInvalid || ae.Message != tc.want {
			t.Errorf("%q: %v, want invalid %q", tc.msg, err, tc.want)
		}
	}
	if req, err := execRequest(websocket.MessageText, []byte(`{"cmd":["echo","café"],"env":{"A":"1","a":"2"}}`)); err != nil || req.Cmd[1] != "café" {
		t.Errorf("a good request: %+v, %v", req, err)
	}
}

// TestExecMessageLimit: a client's message on the exec socket is bounded
// by api.MaxExecMessage, not 32 MiB: each socket could hold that much of
// the daemon's memory.
func TestExecMessageLimit(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	hdr := http.Header{"Authorization": {"Bearer " + testToken}}
	request := func(size int) []byte {
		pad := size - len(`{"cmd":["true"],"env":{"PAD":""}}`)
		return []byte(`{"cmd":["true"],"env":{"PAD":"` + strings.Repeat("x", pad) + `"}}`)
	}
	for _, tc := range []struct {
		size int
		ok   bool
	}{
		{api.MaxExecMessage, true},
		{api.MaxExecMessage + 1, false},
		{4 << 20, false},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v1/sandboxes/box/exec", &websocket.DialOptions{HTTPHeader: hdr})
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadLimit(1 << 20)
		// The server may close before the whole message is written.
		_ = c.Write(ctx, websocket.MessageText, request(tc.size))
		_, b, err := c.Read(ctx)
		switch {
		case tc.ok && (err != nil || !strings.Contains(string(b), `"exit"`)):
			t.Errorf("a message of %d bytes: %q, %v; want it run", tc.size, b, err)
		case !tc.ok && websocket.CloseStatus(err) != websocket.StatusMessageTooBig:
			t.Errorf("a message of %d bytes: %q, %v; want a close with status 1009", tc.size, b, err)
		}
		c.CloseNow()
		cancel()
	}
}
