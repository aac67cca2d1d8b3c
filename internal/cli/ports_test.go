package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParsePortSpec(t *testing.T) {
	for _, tc := range []struct {
		in            string
		local, remote int
		err           bool
	}{
		{in: "8080", local: 8080, remote: 8080},
		{in: "9000:8080", local: 9000, remote: 8080},
		{in: "0:8080", local: 0, remote: 8080},
		{in: "0", err: true},
		{in: "65536", err: true},
		{in: "http", err: true},
		{in: "9000:", err: true},
		{in: ":8080", err: true},
		{in: "-1:8080", err: true},
		{in: "1:2:3", err: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			l, r, err := parsePortSpec(tc.in)
			if tc.err {
				if err == nil {
					t.Fatalf("got %d:%d, want an error", l, r)
				}
				return
			}
			if err != nil || l != tc.local || r != tc.remote {
				t.Fatalf("got %d:%d, %v; want %d:%d", l, r, err, tc.local, tc.remote)
			}
		})
	}
}

// TestForward: each accepted connection is carried to one dialed
// connection, both ways; a dial that fails is reported and forwarding goes
// on; cancelling ends it.
func TestForward(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var dialed atomic.Int32
	var errw bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- forward(ctx, ln, func(context.Context) (net.Conn, error) {
			if dialed.Add(1) == 1 {
				return nil, errors.New("nothing there")
			}
			// The "sandbox" side: echo in upper case, then close.
			a, b := net.Pipe()
			go func() {
				defer b.Close()
				buf := make([]byte, 5)
				if _, err := io.ReadFull(b, buf); err == nil {
					b.Write([]byte(strings.ToUpper(string(buf))))
				}
			}()
			return a, nil
		}, &errw)
	}()
	// The first connection's dial fails: it is closed at once.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a connection whose dial failed: %v, want EOF", err)
	}
	c.Close()
	c, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("hello"))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "HELLO" {
		t.Fatalf("forwarded: %q, %v", got, err)
	}
	c.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errw.String(), "nothing there") {
		t.Fatalf("stderr: %q", errw.String())
	}
}
