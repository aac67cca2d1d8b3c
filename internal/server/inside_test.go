package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"
)

const insideID = "sb-000000000001" // "box" of newFake

var (
	loopback = netip.MustParseAddr("127.0.0.1")
	// other is another address of the loopback network, standing for
	// another sandbox.
	other = netip.MustParseAddr("127.0.0.2")
)

// openInside serves the fake's sandbox box on a loopback port, reachable
// only from peer, and returns the address.
func openInside(t *testing.T, in *Inside, peer netip.Addr) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	in.mu.Lock()
	in.serveLocked(insideID, ln, peer)
	in.mu.Unlock()
	t.Cleanup(func() { in.Close(insideID) })
	return ln.Addr().String()
}

// dialFrom connects to addr from the local address from.
func dialFrom(t *testing.T, from netip.Addr, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends a GET of the sandbox's own record on c, keeping c open.
func get(t *testing.T, in *Inside, c net.Conn) {
	t.Helper()
	_, err := fmt.Fprintf(c, "GET /v1/sandboxes/box HTTP/1.1\r\nHost: loam\r\nAuthorization: Bearer %s\r\n\r\n", in.Token(insideID))
	if err != nil {
		t.Fatal(err)
	}
}

// answer reads the answer to a request on c, waiting up to wait.
func answer(c net.Conn, br *bufio.Reader, wait time.Duration) (*http.Response, error) {
	c.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, err
}

// closedByServer reports whether the server closed c (rather than leaving
// it open past wait), reading and dropping whatever it sent first.
func closedByServer(t *testing.T, c net.Conn, wait time.Duration) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(wait))
	_, err := io.Copy(io.Discard, c)
	switch {
	case err == nil, errors.Is(err, syscall.ECONNRESET):
		return true
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false
	}
	t.Fatalf("reading: %v", err)
	return false
}

func TestInsidePeers(t *testing.T) {
	t.Run("another address is closed at once", func(t *testing.T) {
		in := NewInside(newFake(), []byte("secret"), discardLog())
		addr := openInside(t, in, other)
		c := dialFrom(t, loopback, addr)
		// Nothing is sent: the server closes without waiting for a request.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(make([]byte, 1))
		if n != 0 || !(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			t.Fatalf("read %d bytes, %v; want the connection closed", n, err)
		}
		// A request gets no HTTP answer at all, not even a 401.
		c = dialFrom(t, loopback, addr)
		get(t, in, c)
		if resp, err := answer(c, bufio.NewReader(c), 5*time.Second); err == nil {
			t.Fatalf("got an answer: %s", resp.Status)
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection left open: %v", err)
		}
	})
	t.Run("the peer is served", func(t *testing.T) {
		in := NewInside(newFake(), []byte("secret"), discardLog())
		addr := openInside(t, in, other)
		c := dialFrom(t, other, addr)
		get(t, in, c)
		resp, err := answer(c, bufio.NewReader(c), 5*time.Second)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("answer %v, %v; want 200", resp, err)
		}
	})
	t.Run("the peer on the address dialled from", func(t *testing.T) {
		in := NewInside(newFake(), []byte("secret"), discardLog())
		addr := openInside(t, in, loopback)
		c := dialFrom(t, loopback, addr)
		get(t, in, c)
		resp, err := answer(c, bufio.NewReader(c), 5*time.Second)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("answer %v, %v; want 200", resp, err)
		}
	})
}

func TestInsideTimeouts(t *testing.T) {
	newInside := func() *Inside {
		in := NewInside(newFake(), []byte("secret"), discardLog())
		in.readHeaderTimeout = 200 * time.Millisecond
		in.readTimeout = 200 * time.Millisecond
		in.idleTimeout = 200 * time.Millisecond
		return in
	}
	t.Run("idle after a request", func(t *testing.T) {
		in := newInside()
		c := dialFrom(t, loopback, openInside(t, in, loopback))
		get(t, in, c)
		if resp, err := answer(c, bufio.NewReader(c), 5*time.Second); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("answer %v, %v; want 200", resp, err)
		}
		if !closedByServer(t, c, 5*time.Second) {
			t.Fatal("an idle connection was left open")
		}
	})
	t.Run("silent", func(t *testing.T) {
		in := newInside()
		c := dialFrom(t, loopback, openInside(t, in, loopback))
		if !closedByServer(t, c, 5*time.Second) {
			t.Fatal("a connection that sends nothing was left open")
		}
	})
	t.Run("half a header", func(t *testing.T) {
		in := newInside()
		c := dialFrom(t, loopback, openInside(t, in, loopback))
		fmt.Fprintf(c, "GET /v1/sandboxes/box HTTP/1.1\r\nHost: loam\r\n")
		if !closedByServer(t, c, 5*time.Second) {
			t.Fatal("a connection that stops halfway through its header was left open")
		}
	})
	t.Run("slow body", func(t *testing.T) {
		in := newInside()
		c := dialFrom(t, loopback, openInside(t, in, loopback))
		fmt.Fprintf(c, "POST /v1/sandboxes/box/checkpoints HTTP/1.1\r\nHost: loam\r\nAuthorization: Bearer %s\r\nContent-Length: 20\r\n\r\n{", in.Token(insideID))
		// The body never comes: the request fails (400) and the
		// connection is closed.
		if !closedByServer(t, c, 5*time.Second) {
			t.Fatal("a connection that stops halfway through its body was left open")
		}
	})
	t.Run("long request", func(t *testing.T) {
		// A memory checkpoint can take far longer than reading a request
		// may: its answer must still come, its context not be cancelled.
		fake := newFake()
		fake.cpDelay = time.Second
		in := NewInside(fake, []byte("secret"), discardLog())
		in.readHeaderTimeout = 100 * time.Millisecond
		in.readTimeout = 100 * time.Millisecond
		in.idleTimeout = 100 * time.Millisecond
		c := dialFrom(t, loopback, openInside(t, in, loopback))
		fmt.Fprintf(c, "POST /v1/sandboxes/box/checkpoints HTTP/1.1\r\nHost: loam\r\nAuthorization: Bearer %s\r\nContent-Length: 2\r\n\r\n{}", in.Token(insideID))
		resp, err := answer(c, bufio.NewReader(c), 10*time.Second)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("answer %v, %v; want 201", resp, err)
		}
	})
}

func TestInsideConnLimit(t *testing.T) {
	in := NewInside(newFake(), []byte("secret"), discardLog())
	in.maxConns = 3
	addr := openInside(t, in, loopback)
	// maxConns connections, each served once and kept open.
	var held []net.Conn
	for range in.maxConns {
		c := dialFrom(t, loopback, addr)
		get(t, in, c)
		if resp, err := answer(c, bufio.NewReader(c), 5*time.Second); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("answer %v, %v; want 200", resp, err)
		}
		held = append(held, c)
	}
	// One more waits…
	c := dialFrom(t, loopback, addr)
	get(t, in, c)
	br := bufio.NewReader(c)
	if resp, err := answer(c, br, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection %d was served (%v, %v) while %d were open", in.maxConns+1, resp, err, in.maxConns)
	}
	// …until one of the others closes.
	held[0].Close()
	if resp, err := answer(c, br, 5*time.Second); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("answer %v, %v; want 200", resp, err)
	}
}

func TestInsideOthersNotCounted(t *testing.T) {
	in := NewInside(newFake(), []byte("secret"), discardLog())
	in.maxConns = 1
	addr := openInside(t, in, other)
	// Connections from another sandbox, left open on its side, take no
	// place of the sandbox's own.
	for range 5 {
		c := dialFrom(t, loopback, addr)
		if !closedByServer(t, c, 5*time.Second) {
			t.Fatal("a connection from another address was left open")
		}
	}
	c := dialFrom(t, other, addr)
	get(t, in, c)
	if resp, err := answer(c, bufio.NewReader(c), 5*time.Second); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("answer %v, %v; want 200", resp, err)
	}
}

func TestInsideDefaults(t *testing.T) {
	in := NewInside(newFake(), []byte("secret"), discardLog())
	if in.readHeaderTimeout <= 0 || in.readTimeout <= 0 || in.idleTimeout <= 0 || in.maxConns != maxInsideConns {
		t.Fatalf("limits %v %v %v %d", in.readHeaderTimeout, in.readTimeout, in.idleTimeout, in.maxConns)
	}
}
