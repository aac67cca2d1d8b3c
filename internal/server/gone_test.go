package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/testenv"
)

// slowLookups is a store whose lookups last until their context ends, and
// then fail with its error, as SQLite's do: a client that goes away in the
// middle of one cancels it.
type slowLookups struct{ Sandboxes }

func (s slowLookups) Get(ctx context.Context, ref string) (*api.Sandbox, error) {
	<-ctx.Done()
	return nil, fmt.Errorf("reading sandbox %s: %w", ref, ctx.Err())
}

// TestClientGone: a client that half-closes its connection after its
// request cancels the request's context. It gets no answer, not a 500
// (the daemon's API) nor a false 404 (the in-sandbox API), and the daemon
// logs no error.
func TestClientGone(t *testing.T) {
	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	in := NewInside(slowLookups{newFake()}, []byte("secret"), log)
	for _, a := range []struct {
		name, base, token string
	}{
		{"daemon", serve(t, New(slowLookups{newFake()}, testToken, log, fakeServices(newFake())...)), testToken},
		{"inside", serve(t, in.handler("sb-000000000001")), in.Token("sb-000000000001")},
	} {
		t.Run(a.name, func(t *testing.T) {
			c, err := net.Dial("tcp", strings.TrimPrefix(a.base, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "GET /v1/sandboxes/box HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+a.token+"\r\n\r\n")
			c.(*net.TCPConn).CloseWrite()
			answer, err := io.ReadAll(c)
			if err != nil {
				t.Fatal(err)
			}
			if len(answer) != 0 {
				t.Errorf("a client gone got an answer: %q", answer)
			}
		})
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a client gone made errors in the log:\n%s", logs.String())
	}
}
