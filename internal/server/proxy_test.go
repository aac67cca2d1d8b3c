package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/internal/sandbox"
)

// TestProxyCutsOffStalledClient: an agent floods a stream whose client
// reads nothing; the proxy gives up on the client after its write timeout
// instead of holding the stream (and the agent) forever.
func TestProxyCutsOffStalledClient(t *testing.T) {
	msg := make([]byte, 16<<10) // under the default read limit
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for c.Write(r.Context(), websocket.MessageBinary, msg) == nil {
		}
	}))
	defer agent.Close()
	const timeout = 300 * time.Millisecond
	took := make(chan time.Duration, 1)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ac, _, err := websocket.Dial(r.Context(), "ws"+strings.TrimPrefix(agent.URL, "http"), nil)
		if err != nil {
			t.Error(err)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			ac.CloseNow()
			return
		}
		defer c.CloseNow()
		start := time.Now()
		proxyStream(r.Context(), c, sandbox.NewStream(ac), timeout)
		took <- time.Since(start)
	}))
	defer front.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(front.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.CloseNow()
	// The client reads nothing: the socket's buffers fill, then the
	// proxy's write waits for it.
	select {
	case d := <-took:
		t.Logf("the stalled client was cut off after %v", d.Round(time.Millisecond))
	case <-ctx.Done():
		t.Fatal("the proxy still waits on a client that reads nothing")
	}
	// Reading again, the client finds its stream ended, not flowing.
	for {
		if _, _, err := client.Read(ctx); err != nil {
			if ctx.Err() != nil {
				t.Fatal("the cut-off stream still flows")
			}
			break
		}
	}
}

// TestIdleReaderClientError: an upload its client broke off is the
// client's error, an invalid request, whatever the sandbox said.
func TestIdleReaderClientError(t *testing.T) {
	r := &idleReader{timeout: time.Second}
	other := errors.New("the agent failed")
	if got := r.clientError(other); got != other {
		t.Errorf("with the body whole: %v, want the error as it was", got)
	}
	r.err = io.ErrUnexpectedEOF
	if got := r.clientError(other); got == other || !strings.Contains(got.Error(), "cut short") {
		t.Errorf("with the body cut: %v", got)
	}
	if got := r.clientError(nil); got != nil {
		t.Errorf("no error: %v", got)
	}
}
