package test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// portBenchMiB is how much a throughput iteration moves through a port
// stream.
const portBenchMiB = 64

// bulkServer serves, in a sandbox, port 9000 (sends N MiB of zeros to each
// connection, then closes) and port 9001 (reads N MiB, answers "ok",
// closes), N being the first line a client sends.
const bulkServer = `
import socket, threading
def serve(port, fn):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(16)
    while True:
        c, _ = s.accept()
        threading.Thread(target=fn, args=(c,), daemon=True).start()
def size(c):
    line = b""
    while not line.endswith(b"\n"):
        line += c.recv(1)
    return int(line) << 20
def source(c):
    n, buf = size(c), bytes(1 << 16)
    while n > 0:
        n -= c.send(buf[:min(n, len(buf))])
    c.close()
def sink(c):
    n = size(c)
    while n > 0:
        b = c.recv(1 << 16)
        if not b:
            break
        n -= len(b)
    c.sendall(b"ok")
    c.close()
threading.Thread(target=serve, args=(9001, sink), daemon=True).start()
serve(9000, source)
`

// BenchmarkPortStream: the time to list ports, to open a port stream, the time for an HTTP GET through a port stream (a
// new stream each, as port-forward makes one per connection) beside one
// straight to the sandbox's address, and the throughput of a port stream
// each way, beside a connection straight to the sandbox's address (what
// the sandbox's network and the Python servers allow).
func BenchmarkPortStream(b *testing.B) {
	d := harness.StartDaemonB(b)
	ctx := context.Background()
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "bench", Template: "base"})
	if err != nil {
		b.Fatal(err)
	}
	d.RunB(b, "bench", "sh", "-c", `mkdir -p /home/loam/site && echo hello > /home/loam/site/index.html &&
		nohup python3 -m http.server 8080 --directory /home/loam/site >/dev/null 2>&1 &
		cat > /home/loam/bulk.py <<'PY'`+bulkServer+`PY
		nohup python3 /home/loam/bulk.py >/dev/null 2>&1 &`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ps, err := d.C.ListPorts(ctx, "bench")
		if err == nil && len(ps) == 3 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the servers did not come up: %+v, %v", ps, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	get := func(b *testing.B, hc *http.Client) {
		for i := 0; i < b.N; i++ {
			resp, err := hc.Get("http://sandbox:8080/")
			if err != nil {
				b.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(body) != "hello\n" {
				b.Fatalf("GET: %q, %v", body, err)
			}
		}
	}
	b.Run("list", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := d.C.ListPorts(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("dial", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			conn, err := d.C.DialPort(ctx, "bench", 8080)
			if err != nil {
				b.Fatal(err)
			}
			conn.Close()
		}
	})
	b.Run("http-get", func(b *testing.B) { get(b, httpThrough(d.C, "bench", 8080)) })
	b.Run("http-get-direct", func(b *testing.B) {
		addr := net.JoinHostPort(sandboxIP(d, sb.ID), "8080")
		get(b, &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			},
			DisableKeepAlives: true,
		}})
	})
	stream := func(port int) func() (net.Conn, error) {
		return func() (net.Conn, error) { return d.C.DialPort(ctx, "bench", port) }
	}
	direct := func(port int) func() (net.Conn, error) {
		addr := net.JoinHostPort(sandboxIP(d, sb.ID), strconv.Itoa(port))
		return func() (net.Conn, error) { return net.Dial("tcp", addr) }
	}
	b.Run("download", func(b *testing.B) { benchDownload(b, stream(9000)) })
	b.Run("download-direct", func(b *testing.B) { benchDownload(b, direct(9000)) })
	b.Run("upload", func(b *testing.B) { benchUpload(b, stream(9001)) })
	b.Run("upload-direct", func(b *testing.B) { benchUpload(b, direct(9001)) })
}

// benchDownload reads portBenchMiB from bulkServer's source per iteration.
func benchDownload(b *testing.B, dial func() (net.Conn, error)) {
	b.SetBytes(portBenchMiB << 20)
	for i := 0; i < b.N; i++ {
		conn, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		io.WriteString(conn, strconv.Itoa(portBenchMiB)+"\n")
		n, err := io.Copy(io.Discard, conn)
		conn.Close()
		if err != nil || n != portBenchMiB<<20 {
			b.Fatalf("read %d bytes: %v", n, err)
		}
	}
}

// benchUpload writes portBenchMiB to bulkServer's sink per iteration.
func benchUpload(b *testing.B, dial func() (net.Conn, error)) {
	b.SetBytes(portBenchMiB << 20)
	buf := make([]byte, 1<<20)
	for i := 0; i < b.N; i++ {
		conn, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		io.WriteString(conn, strconv.Itoa(portBenchMiB)+"\n")
		for range portBenchMiB {
			if _, err := conn.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		ok, err := io.ReadAll(conn)
		conn.Close()
		if err != nil || string(ok) != "ok" {
			b.Fatalf("after the upload: %q, %v", ok, err)
		}
	}
}
