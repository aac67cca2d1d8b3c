package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// fakeExec serves the exec socket of every sandbox with script, after
// checking the token and decoding the request.
func fakeExec(t *testing.T, script func(ctx context.Context, conn *websocket.Conn, req api.ExecRequest)) *Client {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{sandbox}/exec", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: api.Errorf(api.CodeUnauthorized, "bad token")})
			return
		}
		if r.PathValue("sandbox") != "scratch" {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: api.Errorf(api.CodeNotFound, "sandbox %s not found", r.PathValue("sandbox"))})
			return
		}
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		defer conn.CloseNow()
		conn.SetReadLimit(-1)
		ctx := r.Context()
		typ, b, err := conn.Read(ctx)
		if err != nil || typ != websocket.MessageText {
			t.Errorf("first message: %v %v", typ, err)
			return
		}
		var req api.ExecRequest
		if err := json.Unmarshal(b, &req); err != nil {
			t.Errorf("decoding the request: %v", err)
			return
		}
		script(ctx, conn, req)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return New(srv.URL, "tok")
}

func send(ctx context.Context, conn *websocket.Conn, ctl api.ExecControl) {
	b, _ := json.Marshal(ctl)
	_ = conn.Write(ctx, websocket.MessageText, b)
}

func sendData(ctx context.Context, conn *websocket.Conn, stream byte, s string) {
	_ = conn.Write(ctx, websocket.MessageBinary, append([]byte{stream}, s...))
}

func exit(ctx context.Context, conn *websocket.Conn, code int) {
	send(ctx, conn, api.ExecControl{Type: api.ExecExit, ExitCode: &code})
	_ = conn.Close(websocket.StatusNormalClosure, "")
}

// TestExecEcho runs a fake "tr a-z A-Z": stdin comes back upper-cased on
// stdout, with a note on stderr, and stdin ends with "eof".
func TestExecEcho(t *testing.T) {
	reqs := make(chan api.ExecRequest, 1)
	c := fakeExec(t, func(ctx context.Context, conn *websocket.Conn, req api.ExecRequest) {
		reqs <- req
		send(ctx, conn, api.ExecControl{Type: api.ExecStarted, PID: 42})
		for {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if b[0] != api.StreamStdin {
					t.Errorf("stream %d from the client", b[0])
				}
				sendData(ctx, conn, api.StreamStdout, strings.ToUpper(string(b[1:])))
				continue
			}
			var ctl api.ExecControl
			_ = json.Unmarshal(b, &ctl)
			if ctl.Type == api.ExecEOF {
				sendData(ctx, conn, api.StreamStderr, "done\n")
				exit(ctx, conn, 3)
				return
			}
		}
	})
	big := strings.Repeat("abcdefgh", 20_000) // several stdin frames
	var stdout, stderr bytes.Buffer
	code, err := c.Exec(context.Background(), "scratch", ExecOptions{
		Cmd:    []string{"tr", "a-z", "A-Z"},
		Env:    map[string]string{"K": "V"},
		Dir:    "/tmp",
		User:   "root",
		Stdin:  strings.NewReader(big),
		Stdout: &stdout,
		Stderr: &stderr,
	})
	if err != nil || code != 3 {
		t.Fatalf("Exec = %d, %v; want 3, nil", code, err)
	}
	if stdout.String() != strings.ToUpper(big) {
		t.Errorf("stdout is %d bytes, want %d upper-cased", stdout.Len(), len(big))
	}
	if stderr.String() != "done\n" {
		t.Errorf("stderr = %q", stderr.String())
	}
	want := api.ExecRequest{Cmd: []string{"tr", "a-z", "A-Z"}, Env: map[string]string{"K": "V"}, Dir: "/tmp", User: "root", Stdin: true}
	if got := <-reqs; !reflect.DeepEqual(got, want) {
		t.Errorf("request = %+v, want %+v", got, want)
	}
}

// TestExecSendsEveryField checks that ExecOptions can give every field of
// api.ExecRequest: a field added to the request and not to the options
// fails here.
func TestExecSendsEveryField(t *testing.T) {
	reqs := make(chan api.ExecRequest, 1)
	c := fakeExec(t, func(ctx context.Context, conn *websocket.Conn, req api.ExecRequest) {
		reqs <- req
		exit(ctx, conn, 0)
	})
	_, err := c.Exec(context.Background(), "scratch", ExecOptions{
		Cmd:        []string{"sh"},
		Env:        map[string]string{"K": "V"},
		Dir:        "/tmp",
		User:       "root",
		TTY:        true,
		Rows:       24,
		Cols:       80,
		Stdin:      strings.NewReader(""),
		Detachable: true,
		BufferSize: 4096,
	})
	if err != nil {
		t.Fatal(err)
	}
	got := <-reqs
	want := api.ExecRequest{Cmd: []string{"sh"}, Env: map[string]string{"K": "V"}, Dir: "/tmp", User: "root",
		TTY: true, Rows: 24, Cols: 80, Stdin: true, Detachable: true, BufferSize: 4096}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("request = %+v, want %+v", got, want)
	}
	v := reflect.ValueOf(got)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Errorf("ExecOptions has no way to give api.ExecRequest.%s", v.Type().Field(i).Name)
		}
	}
}

// TestExecBigOutput checks a frame far above the WebSocket library's default
// read limit gets through.
func TestExecBigOutput(t *testing.T) {
	big := strings.Repeat("x", 4<<20)
	c := fakeExec(t, func(ctx context.Context, conn *websocket.Conn, req api.ExecRequest) {
		if req.Stdin {
			t.Error("Stdin is true without a reader")
		}
		sendData(ctx, conn, api.StreamStdout, big)
		exit(ctx, conn, 0)
	})
	stdout, stderr, code, err := c.Output(context.Background(), "scratch", "cat", "big")
	if err != nil || code != 0 || len(stdout) != len(big) || len(stderr) != 0 {
		t.Fatalf("Output = %d bytes, %q, %d, %v", len(stdout), stderr, code, err)
	}
}

func TestExecTTYControls(t *testing.T) {
	// The fake sends what it saw through these before it says "exit".
	reqs := make(chan api.ExecRequest, 1)
	controls := make(chan []api.ExecControl, 1)
	// The signal is sent once the fake has the resize, so the order is
	// known whatever the host's load (a sleep was not enough: both
	// channels were ready by the time the client read them).
	first := make(chan struct{})
	c := fakeExec(t, func(ctx context.Context, conn *websocket.Conn, req api.ExecRequest) {
		reqs <- req
		var got []api.ExecControl
		defer func() { controls <- got }()
		for len(got) < 2 {
			_, b, err := conn.Read(ctx)
			if err != nil {
				return
			}
			var ctl api.ExecControl
			_ = json.Unmarshal(b, &ctl)
			got = append(got, ctl)
			if len(got) == 1 {
				close(first)
			}
		}
		exit(ctx, conn, 130)
	})
	resize := make(chan WindowSize, 1)
	signal := make(chan string, 1)
	resize <- WindowSize{Rows: 50, Cols: 132}
	go func() {
		<-first
		signal <- "INT"
	}()
	code, err := c.Exec(context.Background(), "scratch", ExecOptions{
		Cmd: []string{"bash"}, TTY: true, Rows: 24, Cols: 80, Resize: resize, Signal: signal,
	})
	if err != nil || code != 130 {
		t.Fatalf("Exec = %d, %v; want 130, nil", code, err)
	}
	if req := <-reqs; !req.TTY || req.Rows != 24 || req.Cols != 80 {
		t.Errorf("request = %+v", req)
	}
	want := []api.ExecControl{{Type: "resize", Rows: 50, Cols: 132}, {Type: "signal", Signal: "INT"}}
	if got := <-controls; !reflect.DeepEqual(got, want) {
		t.Errorf("controls = %+v, want %+v", got, want)
	}
}

func TestExecErrors(t *testing.T) {
	tests := []struct {
		name     string
		sandbox  string
		token    string
		script   func(ctx context.Context, conn *websocket.Conn)
		check    []error
		notCheck []error
		message  string
	}{
		{
			name: "command not found",
			script: func(ctx context.Context, conn *websocket.Conn) {
				send(ctx, conn, api.ExecControl{Type: api.ExecError, Error: api.Errorf(api.CodeNotFound, "nope: command not found")})
				_ = conn.Close(websocket.StatusNormalClosure, "")
			},
			check:   []error{ErrNotStarted, api.ErrNotFound},
			message: "nope: command not found",
		},
		{
			name: "checkpointed",
			script: func(ctx context.Context, conn *websocket.Conn) {
				sendData(ctx, conn, api.StreamStdout, "partial")
				_ = conn.Close(websocket.StatusInternalError, "")
			},
			check:    []error{ErrStreamEnded, api.ErrUnavailable},
			notCheck: []error{ErrNotStarted},
			message:  "the sandbox was checkpointed or restored",
		},
		{
			name: "dropped",
			script: func(ctx context.Context, conn *websocket.Conn) {
				_ = conn.CloseNow()
			},
			check:    []error{ErrStreamEnded},
			notCheck: []error{api.ErrUnavailable},
		},
		{
			name:     "no such sandbox",
			sandbox:  "nope",
			check:    []error{api.ErrNotFound},
			notCheck: []error{ErrNotStarted, ErrStreamEnded},
			message:  "sandbox nope not found",
		},
		{
			name:    "bad token",
			token:   "wrong",
			check:   []error{api.ErrUnauthorized},
			message: "bad token",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fakeExec(t, func(ctx context.Context, conn *websocket.Conn, _ api.ExecRequest) {
				tt.script(ctx, conn)
			})
			if tt.token != "" {
				c.token = tt.token
			}
			sandbox := "scratch"
			if tt.sandbox != "" {
				sandbox = tt.sandbox
			}
			code, err := c.Exec(context.Background(), sandbox, ExecOptions{Cmd: []string{"nope"}, Stdout: io.Discard})
			if code != -1 || err == nil {
				t.Fatalf("Exec = %d, %v; want -1 and an error", code, err)
			}
			for _, target := range tt.check {
				if !errors.Is(err, target) {
					t.Errorf("err = %v, want errors.Is %v", err, target)
				}
			}
			for _, target := range tt.notCheck {
				if errors.Is(err, target) {
					t.Errorf("err = %v, want not errors.Is %v", err, target)
				}
			}
			var ae *api.Error
			if tt.message != "" && (!errors.As(err, &ae) || ae.Message != tt.message) {
				t.Errorf("err = %v, want an *api.Error with message %q", err, tt.message)
			}
		})
	}
}

func TestExecContextCancel(t *testing.T) {
	c := fakeExec(t, func(ctx context.Context, conn *websocket.Conn, _ api.ExecRequest) {
		_, _, _ = conn.Read(ctx) // until the client goes away
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Exec(ctx, "scratch", ExecOptions{Cmd: []string{"sleep", "100"}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want DeadlineExceeded", err)
	}
}

func TestWSURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:7070":         "ws://127.0.0.1:7070",
		"https://loam.example.com/loam": "wss://loam.example.com/loam",
	} {
		if got := wsURL(in); got != want {
			t.Errorf("wsURL(%q) = %q, want %q", in, got, want)
		}
	}
}
