package conns

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// serve runs an http.Server with l on loopback: /busy answers when release
// is closed, /auth keeps its connection alive, anything else does not.
func serve(t *testing.T, l *Limiter, release chan struct{}) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/busy":
				<-release
			case "/auth":
				KeepAlive(w)
			}
			io.WriteString(w, "ok")
		})),
		ConnContext: l.ConnContext,
	}
	go srv.Serve(l.Listener(ln))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// dial connects from the loopback address from.
func dial(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c, waiting up to 5 s.
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// get sends GET path on c and reads the answer.
func get(t *testing.T, c net.Conn, path string) *http.Response {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	c.SetDeadline(time.Time{})
	return resp
}

// waitOpen waits until l counts n connections.
func waitOpen(t *testing.T, l *Limiter, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.Open() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open, want %d", l.Open(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPerClientCap(t *testing.T) {
	l := New(100, 2, slog.New(slog.DiscardHandler))
	addr := serve(t, l, nil)
	first := dial(t, "127.0.0.1", addr)
	waitOpen(t, l, 1)
	dial(t, "127.0.0.1", addr)
	waitOpen(t, l, 2)
	// A third from the same address takes the place of the one idle
	// longest, which never sent a request; another address is not
	// affected by that address's cap.
	third := dial(t, "127.0.0.1", addr)
	other := dial(t, "127.0.0.2", addr)
	if !closedByServer(first) {
		t.Fatal("the connection idle longest was not closed")
	}
	if resp := get(t, third, "/auth"); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if resp := get(t, other, "/auth"); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	waitOpen(t, l, 3)
}

func TestBusyConnectionsAreKept(t *testing.T) {
	l := New(2, 2, slog.New(slog.DiscardHandler))
	release := make(chan struct{})
	addr := serve(t, l, release)
	// Released before the server is closed, which waits for the handlers.
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock)
	var busy []net.Conn
	for range 2 {
		c := dial(t, "127.0.0.1", addr)
		io.WriteString(c, "GET /busy HTTP/1.1\r\nHost: x\r\n\r\n")
		busy = append(busy, c)
	}
	// Both are busy once their requests are being served: nothing idle
	// to reclaim, so a new connection, from any address, is closed.
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		idle := l.idle.Len()
		l.mu.Unlock()
		if idle == 0 && l.Open() == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the busy connections did not become busy")
		}
		time.Sleep(time.Millisecond)
	}
	if !closedByServer(dial(t, "127.0.0.3", addr)) {
		t.Fatal("a connection over the cap was kept while all were busy")
	}
	unblock()
	for _, c := range busy {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("a busy connection was cut: %v", err)
		}
	}
	// Now idle (the answers closed them: not authenticated).
	waitOpen(t, l, 0)
}

func TestCloseUnlessAuthenticated(t *testing.T) {
	l := New(10, 10, slog.New(slog.DiscardHandler))
	addr := serve(t, l, nil)
	c := dial(t, "127.0.0.1", addr)
	if resp := get(t, c, "/open"); !resp.Close {
		t.Errorf("an unauthenticated answer kept its connection: %v", resp.Header)
	}
	if !closedByServer(c) {
		t.Error("the connection of an unauthenticated answer stays open")
	}
	c = dial(t, "127.0.0.1", addr)
	for range 3 {
		if resp := get(t, c, "/auth"); resp.Close {
			t.Fatalf("an authenticated answer closed its connection: %v", resp.Header)
		}
	}
}

// TestTLS: over TLS (and HTTP/2), a request being served still makes its
// connection busy: ConnContext finds the counted connection beneath the
// TLS one.
func TestTLS(t *testing.T) {
	l := New(10, 10, slog.New(slog.DiscardHandler))
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	})))
	srv.Listener = l.Listener(srv.Listener)
	srv.Config.ConnContext = l.ConnContext
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	// Released before the server is closed, which waits for the handler.
	unblock := sync.OnceFunc(func() { close(release) })
	defer unblock()
	done := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Get(srv.URL)
		if err == nil {
			resp.Body.Close()
			if resp.ProtoMajor != 2 {
				err = fmt.Errorf("served over %s, not HTTP/2", resp.Proto)
			}
		}
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		busy := l.open == 1 && l.idle.Len() == 0
		l.mu.Unlock()
		if busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a TLS connection serving a request is not busy")
		}
		time.Sleep(time.Millisecond)
	}
	unblock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
