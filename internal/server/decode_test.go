package server

import (
	"errors"
	"testing"

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
