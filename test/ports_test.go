package test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/test/harness"
)

// serveSite starts python's http.server in sandbox sb on port, serving a
// page that says hello, bound to bind ("" for every address).
func serveSite(t *testing.T, d *harness.Daemon, sb string, port int, bind string) {
	t.Helper()
	args := ""
	if bind != "" {
		args = " --bind " + bind
	}
	d.Run(sb, "sh", "-c", `mkdir -p /home/loam/site && echo hello > /home/loam/site/index.html &&
		nohup python3 -m http.server `+strconv.Itoa(port)+args+` --directory /home/loam/site >/dev/null 2>&1 &`)
}

// httpThrough is an HTTP client whose every connection is a port stream
// to port in sandbox sb.
func httpThrough(c *client.Client, sb string, port int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return c.DialPort(ctx, sb, port)
		},
		DisableKeepAlives: true,
	}}
}

// getThrough GETs / through a port stream and returns the body.
func getThrough(ctx context.Context, c *client.Client, sb string, port int) (string, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://sandbox/", nil)
	if err != nil {
		return "", err
	}
	resp, err := httpThrough(c, sb, port).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestPorts: a port watch sees python's http.server open and close; the
// listing shows it and a loopback-only one, never the agent's port; a port
// stream carries an HTTP request to each; refusals are loam's own errors.
func TestPorts(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "porty", Template: "base"}); err != nil {
		t.Fatal(err)
	}

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	events := make(chan api.PortEvent, 16)
	watchErr := make(chan error, 1)
	go func() {
		defer close(events)
		for ev, err := range d.C.WatchPorts(wctx, "porty") {
			if err != nil {
				watchErr <- err
				return
			}
			events <- ev
		}
	}()
	wantEvent := func(want api.PortEvent) {
		t.Helper()
		timeout := time.After(20 * time.Second)
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("the watch ended waiting for %+v: %v", want, <-watchErr)
				}
				if ev == want {
					return
				}
				t.Logf("watch: %+v", ev)
			case <-timeout:
				t.Fatalf("the watch did not see %+v", want)
			}
		}
	}

	serveSite(t, d, "porty", 8080, "")
	wantEvent(api.PortEvent{Type: api.PortOpen, Port: 8080})
	serveSite(t, d, "porty", 9090, "127.0.0.1")
	wantEvent(api.PortEvent{Type: api.PortOpen, Port: 9090})

	ps, err := d.C.ListPorts(ctx, "porty")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ps, func(p api.Port) bool { return p.Port == 8080 })
	j := slices.IndexFunc(ps, func(p api.Port) bool { return p.Port == 9090 })
	if i < 0 || ps[i].Loopback || j < 0 || !ps[j].Loopback || !slices.Equal(ps[j].Addresses, []string{"127.0.0.1"}) {
		t.Fatalf("ports: %+v, want 8080 on every address and 9090 on 127.0.0.1 only", ps)
	}
	if slices.ContainsFunc(ps, func(p api.Port) bool { return p.Port == agent.DefaultPort }) {
		t.Fatalf("ports: %+v lists the agent's own port", ps)
	}

	for _, port := range []int{8080, 9090} {
		body, err := getThrough(ctx, d.C, "porty", port)
		if err != nil || body != "hello\n" {
			t.Fatalf("GET through port %d: %q, %v", port, body, err)
		}
	}

	for _, tc := range []struct {
		port int
		want *api.Error
		msg  string
	}{
		{9999, api.ErrNotFound, "nothing listens on TCP port 9999 in sandbox porty"},
		{agent.DefaultPort, api.ErrForbidden, "loam's agent"},
		{0, api.ErrInvalid, "port"},
	} {
		_, err := d.C.DialPort(ctx, "porty", tc.port)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("DialPort %d: %v, want %s saying %q", tc.port, err, tc.want.Code, tc.msg)
		}
	}
	if _, err := d.C.DialPort(ctx, "nope", 8080); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("DialPort to a missing sandbox: %v", err)
	}

	d.Run("porty", "pkill", "-f", "http.server 9090")
	wantEvent(api.PortEvent{Type: api.PortClose, Port: 9090})
}

// TestPortStreamsEnd: a memory checkpoint ends port streams and port
// watches with 1011; a disk-only checkpoint ends neither; a restore ends
// them too.
func TestPortStreamsEnd(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "porty", Template: "base"}); err != nil {
		t.Fatal(err)
	}
	serveSite(t, d, "porty", 8080, "")
	waitFor(t, func() bool {
		ps, err := d.C.ListPorts(ctx, "porty")
		return err == nil && len(ps) == 1 && ps[0].Port == 8080
	})

	// open opens a port stream, with a request started but not finished
	// and its answer read as it comes, as any client's would be, and a
	// watch, with its first event read.
	type stream struct {
		conn net.Conn
		read chan readResult
	}
	open := func() (stream, chan error) {
		t.Helper()
		conn, err := d.C.DialPort(ctx, "porty", 8080)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\n"); err != nil {
			t.Fatal(err)
		}
		st := stream{conn: conn, read: make(chan readResult, 1)}
		go func() {
			b, err := io.ReadAll(conn)
			st.read <- readResult{b, err}
		}()
		first := make(chan struct{})
		ended := make(chan error, 1)
		go func() {
			for _, err := range d.C.WatchPorts(ctx, "porty") {
				if err != nil {
					ended <- err
					return
				}
				select {
				case first <- struct{}{}:
				default:
				}
			}
		}()
		select {
		case <-first:
		case err := <-ended:
			t.Fatal(err)
		}
		return st, ended
	}
	// wantEnded checks that the stream and the watch ended with 1011.
	wantEnded := func(st stream, watch chan error, why ...string) {
		t.Helper()
		select {
		case r := <-st.read:
			if !errors.Is(r.err, client.ErrStreamEnded) || !errors.Is(r.err, api.ErrUnavailable) || !slices.ContainsFunc(why, func(w string) bool { return strings.Contains(r.err.Error(), w) }) {
				t.Errorf("the port stream ended with %v, want 1011 saying one of %q", r.err, why)
			}
		case <-time.After(20 * time.Second):
			t.Error("the port stream did not end")
		}
		select {
		case err := <-watch:
			if !errors.Is(err, client.ErrStreamEnded) || !errors.Is(err, api.ErrUnavailable) {
				t.Errorf("the watch ended with %v, want 1011", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("the watch did not end")
		}
	}

	st, watch := open()
	f := false
	if _, err := d.C.CreateCheckpoint(ctx, "porty", api.CreateCheckpoint{Memory: &f}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-watch:
		t.Fatalf("a disk-only checkpoint ended the watch: %v", err)
	case r := <-st.read:
		t.Fatalf("a disk-only checkpoint ended the port stream: %q, %v", r.b, r.err)
	case <-time.After(500 * time.Millisecond):
	}
	// The stream still carries its request to the end.
	if _, err := io.WriteString(st.conn, "\r\n"); err != nil {
		t.Fatalf("after a disk-only checkpoint: %v", err)
	}
	if r := <-st.read; r.err != nil || !strings.HasPrefix(string(r.b), "HTTP/1.0 200 ") || !strings.HasSuffix(string(r.b), "\r\n\r\nhello\n") {
		t.Fatalf("after a disk-only checkpoint: %q, %v", r.b, r.err)
	}
	st.conn.Close()

	st, watch = open()
	cp, err := d.C.CreateCheckpoint(ctx, "porty", api.CreateCheckpoint{})
	if err != nil {
		t.Fatal(err)
	}
	wantEnded(st, watch, "checkpointed")
	if body, err := getThrough(ctx, d.C, "porty", 8080); err != nil || body != "hello\n" {
		t.Fatalf("GET after the memory checkpoint: %q, %v", body, err)
	}

	// A restore first takes an automatic memory checkpoint, which is what
	// ends the streams.
	st, watch = open()
	if _, err := d.C.RestoreCheckpoint(ctx, "porty", cp.ID); err != nil {
		t.Fatal(err)
	}
	wantEnded(st, watch, "checkpointed", "restored")
	if body, err := getThrough(ctx, d.C, "porty", 8080); err != nil || body != "hello\n" {
		t.Fatalf("GET after the restore: %q, %v", body, err)
	}
}

type readResult struct {
	b   []byte
	err error
}

// TestPortsCLI: loam ports lists, loam ports watch watches, loam
// port-forward forwards.
func TestPortsCLI(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "porty", Template: "base"}); err != nil {
		t.Fatal(err)
	}
	serveSite(t, d, "porty", 8080, "127.0.0.1")
	waitFor(t, func() bool {
		out, _, code := d.CLI("", "ports", "porty")
		return code == 0 && strings.Contains(out, "8080")
	})
	out, errOut, code := d.CLI("", "ports", "porty")
	if want := "PORT  ADDRESSES  LOOPBACK\n8080  127.0.0.1  yes\n"; code != 0 || out != want {
		t.Fatalf("loam ports: exit %d, stderr %q, stdout:\n%s\nwant:\n%s", code, errOut, out, want)
	}
	out, _, code = d.CLI("", "ports", "porty", "--json")
	if want := `"loopback": true`; code != 0 || !strings.Contains(out, want) {
		t.Fatalf("loam ports --json: exit %d, %s", code, out)
	}

	watch := exec.Command(harness.LoamBin, "ports", "watch", "porty")
	watch.Env = append(watch.Environ(), "LOAM_API_URL="+d.URL, "LOAM_TOKEN="+d.Token)
	wout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(wout).ReadString('\n')
	watch.Process.Kill()
	watch.Wait()
	if err != nil || line != "open 8080\n" {
		t.Fatalf("loam ports watch: %q, %v", line, err)
	}

	pf := exec.Command(harness.LoamBin, "port-forward", "porty", "0:8080")
	pf.Env = append(pf.Environ(), "LOAM_API_URL="+d.URL, "LOAM_TOKEN="+d.Token)
	stdout, err := pf.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		pf.Process.Kill()
		pf.Wait()
	}()
	line, err = bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	// "Forwarding from 127.0.0.1:PORT -> porty:8080"
	f := strings.Fields(line)
	if len(f) != 5 || f[4] != "porty:8080" {
		t.Fatalf("port-forward said %q", line)
	}
	for range 3 {
		resp, err := http.Get("http://" + f[2] + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "hello\n" {
			t.Fatalf("GET through port-forward: %q, %v", b, err)
		}
	}
}
