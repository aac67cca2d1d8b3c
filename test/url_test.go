package test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// urlServer is a small server for a sandbox, on python's standard library
// alone: GET serves /home/loam/site, POST echoes its body, and GET /ws
// answers a WebSocket handshake and echoes text frames until a close; GET
// /slow creates /tmp/slow-began, then answers "slow" after 1.5 s.
const urlServer = `import base64, hashlib, http.server, os, socketserver, struct, sys, time

class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def __init__(self, *a, **kw):
        super().__init__(*a, directory="/home/loam/site", **kw)
    def log_message(self, *a):
        pass
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        out = b"posted " + body
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def do_GET(self):
        if self.path == "/slow":
            open("/tmp/slow-began", "w").close()
            time.sleep(1.5)
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"slow\n")
            return
        if self.path != "/ws":
            return super().do_GET()
        key = self.headers["Sec-WebSocket-Key"]
        acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", acc)
        self.end_headers()
        self.wfile.flush()
        while True:
            b1, b2 = self.rfile.read(2)
            n = b2 & 0x7f
            if n == 126:
                n = struct.unpack(">H", self.rfile.read(2))[0]
            mask = self.rfile.read(4)
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(self.rfile.read(n)))
            op = b1 & 0x0f
            if op == 8:
                self.wfile.write(bytes([0x88, len(data)]) + data)
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(bytes([0x81, len(data)]) + data)
            self.wfile.flush()

class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

S(("0.0.0.0", 8080), H).serve_forever()
`

// startURLServer starts urlServer in sandbox sb, serving a page that says
// page, and waits until it answers.
func startURLServer(t *testing.T, d *harness.Daemon, sb, page string) {
	t.Helper()
	ctx := harness.Ctx(t)
	if _, err := d.C.WriteFile(ctx, sb, "/home/loam/server.py", strings.NewReader(urlServer), nil); err != nil {
		t.Fatal(err)
	}
	d.Run(sb, "sh", "-c", `mkdir -p /home/loam/site && echo `+page+` > /home/loam/site/index.html &&
		nohup python3 /home/loam/server.py >/home/loam/server.log 2>&1 &`)
	waitFor(t, func() bool {
		_, _, code, _ := d.C.Output(ctx, sb, "python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/')")
		return code == 0
	})
}

// urlClient is an HTTP client that reaches every URL at the daemon's
// listener, as a browser resolving NAME--ORG.localhost to loopback would,
// and follows no redirects.
func urlClient(d *harness.Daemon) *http.Client {
	addr := strings.TrimPrefix(d.URL, "http://")
	return &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			},
			MaxIdleConnsPerHost: 64,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// fetch sends a request and returns its status, body and header.
func fetch(ctx context.Context, c *http.Client, method, u string, hdr http.Header, body string) (int, string, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, strings.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}

// TestURL: a sandbox's URL reaches its server through the daemon's
// listener, by Host: GET, POST with a body, a WebSocket; a private sandbox
// refuses a request without a token and takes its access token in the
// header or once in the query, then in a cookie; a public one takes any;
// unknown names and servers that do not listen get loam's pages.
func TestURL(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "web", Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.URL != "http://web--default.localhost:7070" || sb.Public {
		t.Fatalf("url %q, public %v", sb.URL, sb.Public)
	}
	at, err := d.C.AccessToken(ctx, "web")
	if err != nil || at.URL != sb.URL || !strings.HasPrefix(at.AccessToken, "loam_at_") {
		t.Fatalf("access token: %+v, %v", at, err)
	}
	out, errOut, code := d.CLI("", "url", "web")
	if code != 0 || !strings.Contains(out, "access:      private\n") || !strings.Contains(out, "token:       "+at.AccessToken+"\n") ||
		!strings.Contains(out, "open:        http://web--default.localhost:7070/?loam_token="+at.AccessToken+"\n") {
		t.Fatalf("loam url: %d %q %q", code, out, errOut)
	}
	c := urlClient(d)

	// Before the server listens: 502, loam's page.
	status, body, _, err := fetch(ctx, c, "GET", sb.URL+"/", http.Header{"X-Loam-Access-Token": {at.AccessToken}}, "")
	if err != nil || status != http.StatusBadGateway || !strings.Contains(body, "nothing answered on its port 8080") {
		t.Fatalf("no server: %d %q %v", status, body, err)
	}
	startURLServer(t, d, "web", "hello")

	// Private: no token, a wrong token, then the right ones.
	for _, tok := range []string{"", "loam_at_nope"} {
		status, body, _, err := fetch(ctx, c, "GET", sb.URL+"/", http.Header{"X-Loam-Access-Token": {tok}}, "")
		if err != nil || status != http.StatusUnauthorized || !strings.Contains(body, "private") {
			t.Fatalf("token %q: %d %q %v", tok, status, body, err)
		}
	}
	status, body, _, err = fetch(ctx, c, "GET", sb.URL+"/", http.Header{"X-Loam-Access-Token": {at.AccessToken}}, "")
	if err != nil || status != 200 || body != "hello\n" {
		t.Fatalf("GET with the access token: %d %q %v", status, body, err)
	}
	status, body, _, err = fetch(ctx, c, "GET", sb.URL+"/", http.Header{"Authorization": {"Bearer " + d.Token}}, "")
	if err != nil || status != 200 || body != "hello\n" {
		t.Fatalf("GET with the API token: %d %q %v", status, body, err)
	}
	status, _, hdr, err := fetch(ctx, c, "GET", sb.URL+"/index.html?loam_token="+url.QueryEscape(at.AccessToken), nil, "")
	cookie := hdr.Get("Set-Cookie")
	if err != nil || status != http.StatusSeeOther || hdr.Get("Location") != "/index.html" || !strings.Contains(cookie, "loam_access="+at.AccessToken) {
		t.Fatalf("?loam_token=: %d, Location %q, cookie %q, %v", status, hdr.Get("Location"), cookie, err)
	}
	cookie, _, _ = strings.Cut(cookie, ";")
	status, body, _, err = fetch(ctx, c, "GET", sb.URL+"/index.html", http.Header{"Cookie": {cookie}}, "")
	if err != nil || status != 200 || body != "hello\n" {
		t.Fatalf("GET with the cookie: %d %q %v", status, body, err)
	}

	// POST with a body, any case of Host.
	status, body, _, err = fetch(ctx, c, "POST", strings.ToUpper(sb.URL)+"/echo", http.Header{"X-Loam-Access-Token": {at.AccessToken}}, "a body")
	if err != nil || status != 200 || body != "posted a body" {
		t.Fatalf("POST: %d %q %v", status, body, err)
	}

	// A WebSocket through the URL.
	ws, resp, err := websocket.Dial(ctx, "ws://web--default.localhost:7070/ws", &websocket.DialOptions{
		HTTPClient: urlClient(d),
		HTTPHeader: http.Header{"X-Loam-Access-Token": {at.AccessToken}},
	})
	if err != nil {
		t.Fatalf("WebSocket: %v (%v)", err, resp)
	}
	for _, msg := range []string{"one", "two"} {
		if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		typ, got, err := ws.Read(ctx)
		if err != nil || typ != websocket.MessageText || string(got) != msg {
			t.Fatalf("WebSocket echo: %v %q %v", typ, got, err)
		}
	}
	ws.Close(websocket.StatusNormalClosure, "")

	// A public sandbox needs no token.
	if out, errOut, code := d.CLI("", "create", "open", "--template", "base", "--public"); code != 0 || !strings.Contains(out, "access:      public\n") {
		t.Fatalf("loam create --public: %d %q %q", code, out, errOut)
	}
	startURLServer(t, d, "open", "open")
	status, body, _, err = fetch(ctx, c, "GET", "http://open--default.localhost:7070/", nil, "")
	if err != nil || status != 200 || body != "open\n" {
		t.Fatalf("public: %d %q %v", status, body, err)
	}

	// A server that listens on the sandbox's loopback only is reached
	// through a port stream.
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "lo", Template: "base", HTTPPort: 9090, Public: true}); err != nil {
		t.Fatal(err)
	}
	serveSite(t, d, "lo", 9090, "127.0.0.1")
	waitFor(t, func() bool {
		status, body, _, err = fetch(ctx, c, "GET", "http://lo--default.localhost:7070/", nil, "")
		return err == nil && status == 200 && body == "hello\n"
	})

	// An unknown name; the API is unaffected on its own host.
	status, body, _, err = fetch(ctx, c, "GET", "http://nope--default.localhost:7070/", nil, "")
	if err != nil || status != 404 || !strings.Contains(body, "no sandbox named nope") {
		t.Fatalf("unknown: %d %q %v", status, body, err)
	}
	if _, err := d.C.GetSandbox(ctx, "web"); err != nil {
		t.Fatal(err)
	}
}

// TestURLDuringRestore: requests sent to a sandbox's URL while it is being
// restored wait, and are answered by the restored machine; none fails.
func TestURLDuringRestore(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "roll", Template: "base", Public: true})
	if err != nil {
		t.Fatal(err)
	}
	startURLServer(t, d, "roll", "v1")
	cp, err := d.C.CreateCheckpoint(ctx, "roll", api.CreateCheckpoint{Comment: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("roll", "sh", "-c", "echo v2 > /home/loam/site/index.html")
	c := urlClient(d)
	if status, body, _, err := fetch(ctx, c, "GET", sb.URL+"/", nil, ""); err != nil || status != 200 || body != "v2\n" {
		t.Fatalf("before the restore: %d %q %v", status, body, err)
	}

	// A slow request in flight when the restore begins is answered by
	// the machine it went to: the restore waits for it (up to 2 s).
	slow := make(chan string, 1)
	go func() {
		status, body, _, err := fetch(ctx, c, "GET", sb.URL+"/slow", nil, "")
		slow <- fmt.Sprintf("%d %q %v", status, body, err)
	}()
	harness.Eventually(t, 20*time.Second, "the slow request reaches the sandbox's server", func() error {
		_, _, code, err := d.C.Output(ctx, "roll", "test", "-e", "/tmp/slow-began")
		if err == nil && code != 0 {
			err = errors.New("no /tmp/slow-began")
		}
		return err
	})
	restored := make(chan error, 1)
	go func() {
		_, err := d.C.RestoreCheckpoint(ctx, "roll", cp.ID)
		restored <- err
	}()
	defer func() {
		if got := <-slow; got != `200 "slow\n" <nil>` {
			t.Errorf("a request in flight when the restore began: %s", got)
		}
	}()
	// Once the daemon has taken the restore up (it first keeps the current
	// state as an automatic checkpoint, then says restoring), send
	// requests every 50 ms until it ends: every one must be answered by
	// the restored sandbox.
	harness.Eventually(t, time.Minute, "the sandbox restoring", func() error {
		sb, err := d.C.GetSandbox(ctx, "roll")
		if err == nil && sb.State != api.StateRestoring {
			err = fmt.Errorf("it is %s", sb.State)
		}
		return err
	})
	type answer struct {
		status int
		body   string
		err    error
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
	)
	send := func(method, body string) {
		defer wg.Done()
		status, got, _, err := fetch(ctx, c, method, sb.URL+"/", nil, body)
		mu.Lock()
		answers = append(answers, answer{status, got, err})
		mu.Unlock()
	}
	during := 0
	for {
		select {
		case err := <-restored:
			if err != nil {
				t.Fatalf("restore: %v", err)
			}
			wg.Wait()
			if during == 0 {
				t.Fatal("the restore ended before a request was sent during it")
			}
			for _, a := range answers {
				if a.err != nil || a.status != 200 || (a.body != "v1\n" && a.body != "posted x") {
					t.Errorf("a request sent during the restore: %d %q %v", a.status, a.body, a.err)
				}
			}
			t.Logf("%d requests sent during the restore, all answered by the restored sandbox", len(answers))
			if status, body, _, err := fetch(ctx, c, "GET", sb.URL+"/", nil, ""); err != nil || status != 200 || body != "v1\n" {
				t.Fatalf("after the restore: %d %q %v", status, body, err)
			}
			return
		case <-time.After(50 * time.Millisecond):
			during++
			wg.Add(2)
			go send("GET", "")
			go send("POST", "x")
		}
	}
}

// BenchmarkURL compares a trivial server in a sandbox (python's
// http.server, a new connection per request) reached through its URL with
// the same server reached through a port stream (client.DialPort): requests
// per second and p50/p99 latency, with 1 client and with 8 at once.
func BenchmarkURL(b *testing.B) {
	d := harness.StartDaemonB(b)
	ctx := context.Background()
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "bench", Template: "base", Public: true})
	if err != nil {
		b.Fatal(err)
	}
	d.RunB(b, "bench", "sh", "-c", `mkdir -p /home/loam/site && echo ok > /home/loam/site/index.html &&
		nohup python3 -m http.server 8080 --directory /home/loam/site >/dev/null 2>&1 &`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, code, _ := d.C.Output(ctx, "bench", "python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/')")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the server did not start")
		}
		time.Sleep(100 * time.Millisecond)
	}
	viaURL := urlClient(d)
	viaStream := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.C.DialPort(ctx, "bench", 8080)
		},
		MaxIdleConnsPerHost: 64,
	}}
	for _, clients := range []int{1, 8} {
		for _, tc := range []struct {
			name string
			c    *http.Client
			url  string
		}{
			{"url", viaURL, sb.URL + "/"},
			{"portstream", viaStream, "http://sandbox/"},
		} {
			b.Run(fmt.Sprintf("%s/clients=%d", tc.name, clients), func(b *testing.B) { benchGets(b, tc.c, tc.url, clients) })
		}
	}
}

// benchGets sends b.N GETs to u from clients goroutines and reports the
// rate and latencies.
func benchGets(b *testing.B, c *http.Client, u string, clients int) {
	lats := make([]time.Duration, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				status, body, _, err := fetch(context.Background(), c, "GET", u, nil, "")
				if err != nil || status != 200 || body != "ok\n" {
					b.Errorf("GET %s: %d %q %v", u, status, body, err)
					return
				}
				lats[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lats)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(lats[len(lats)/2].Microseconds()), "p50-µs")
}

// TestURLWakesASleepingSandbox: a sandbox with an idle time falls asleep;
// `loam checkpoint ls` does not wake it; an HTTP request through its URL
// does, and is answered by the server that was running, same PID.
func TestURLWakesASleepingSandbox(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t, idleFlags...)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "dozy", Template: "base", Public: true, Idle: "2s"})
	if err != nil {
		t.Fatal(err)
	}
	startURLServer(t, d, "dozy", "awake")
	pid := strings.TrimSpace(d.Run("dozy", "pgrep", "-x", "python3"))
	waitState(t, d, "dozy", api.StateSleeping)
	if n := runscProcesses(sb.ID); n != 0 {
		t.Fatalf("%d host processes left for a sleeping sandbox", n)
	}
	if out, errOut, code := d.CLI("", "checkpoint", "ls", "dozy"); code != 0 {
		t.Fatalf("checkpoint ls: %d %q %q", code, out, errOut)
	}
	if got, _ := d.C.GetSandbox(ctx, "dozy"); got.State != api.StateSleeping {
		t.Fatalf("checkpoint ls woke it: %s", got.State)
	}
	u := sb.URL + "/index.html" // urlClient takes every URL to the daemon
	start := time.Now()
	code, body, _, err := fetch(ctx, urlClient(d), "GET", u, nil, "")
	if err != nil || code != 200 || strings.TrimSpace(body) != "awake" {
		t.Fatalf("GET %s on a sleeping sandbox: %d %q %v", u, code, body, err)
	}
	t.Logf("sleeping to the first HTTP response through the URL: %v", time.Since(start))
	if got := strings.TrimSpace(d.Run("dozy", "pgrep", "-x", "python3")); got != pid {
		t.Errorf("the server's pid after the wake is %q, was %q", got, pid)
	}

	// A WebSocket through the URL is activity for as long as it is open:
	// quiet for twice the idle time, the sandbox stays awake and the
	// socket works; closed, the sandbox falls asleep again.
	ws, resp, err := websocket.Dial(ctx, strings.Replace(sb.URL, "http", "ws", 1)+"/ws", &websocket.DialOptions{HTTPClient: urlClient(d)})
	if err != nil {
		t.Fatalf("WebSocket: %v (%v)", err, resp)
	}
	defer ws.CloseNow()
	time.Sleep(4 * time.Second)
	if got, _ := d.C.GetSandbox(ctx, "dozy"); got.State != api.StateRunning {
		t.Fatalf("with a WebSocket open through its URL the sandbox is %s", got.State)
	}
	if err := ws.Write(ctx, websocket.MessageText, []byte("still")); err != nil {
		t.Fatal(err)
	}
	if typ, got, err := ws.Read(ctx); err != nil || typ != websocket.MessageText || string(got) != "still" {
		t.Fatalf("WebSocket echo after a quiet spell: %v %q %v", typ, got, err)
	}
	ws.Close(websocket.StatusNormalClosure, "")
	waitState(t, d, "dozy", api.StateSleeping)
}

// TestUpdateSandbox: PATCH of a sandbox changes its URL's access and port,
// its labels and idle time at once, without waking it; bad updates are
// invalid and change nothing.
func TestUpdateSandbox(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "upd", Labels: map[string]string{"owner": "docs"}})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("upd", "sh", "-c", `for p in 8080 9000; do mkdir -p /tmp/www$p && echo port$p > /tmp/www$p/index.html && httpd -p $p -h /tmp/www$p; done`)
	c := urlClient(d)
	get := func() (int, string) {
		t.Helper()
		code, body, _, err := fetch(ctx, c, "GET", sb.URL+"/", nil, "")
		if err != nil {
			t.Fatal(err)
		}
		return code, strings.TrimSpace(body)
	}
	if code, _ := get(); code != http.StatusUnauthorized {
		t.Fatalf("a private sandbox's URL without a token: %d", code)
	}
	if out, errOut, code := d.CLI("", "update", "upd", "--public"); code != 0 || !strings.Contains(out, "upd") {
		t.Fatalf("loam update --public: %d %q %q", code, out, errOut)
	}
	if code, body := get(); code != 200 || body != "port8080" {
		t.Fatalf("public now: %d %q", code, body)
	}
	port := 9000
	got, err := d.C.UpdateSandbox(ctx, "upd", api.UpdateSandbox{HTTPPort: &port, Labels: &map[string]string{"team": "core"}})
	if err != nil || got.HTTPPort != 9000 || !got.Public || len(got.Labels) != 1 || got.Labels["team"] != "core" {
		t.Fatalf("update: %v %+v", err, got)
	}
	if code, body := get(); code != 200 || body != "port9000" {
		t.Errorf("after the port change: %d %q", code, body)
	}
	if list, err := d.C.ListSandboxes(ctx, client.ListOptions{Labels: map[string]string{"team": "core"}}); err != nil || len(list) != 1 {
		t.Errorf("listing by the new label: %v %+v", err, list)
	}
	if list, _ := d.C.ListSandboxes(ctx, client.ListOptions{Labels: map[string]string{"owner": "docs"}}); len(list) != 0 {
		t.Errorf("the old label still matches: %+v", list)
	}

	// Bad updates change nothing.
	bad, zero := "5x", 0
	for _, req := range []api.UpdateSandbox{{}, {Idle: &bad}, {HTTPPort: &zero}} {
		if _, err := d.C.UpdateSandbox(ctx, "upd", req); harness.APICode(err) != api.CodeInvalid {
			t.Errorf("update %+v: %v, want invalid", req, err)
		}
	}
	yes := true
	if _, err := d.C.UpdateSandbox(ctx, "nosuch", api.UpdateSandbox{Public: &yes}); harness.APICode(err) != api.CodeNotFound {
		t.Errorf("update of no sandbox: %v, want not_found", err)
	}

	// A sleeping sandbox stays asleep.
	if _, err := d.C.Sleep(ctx, "upd"); err != nil {
		t.Fatal(err)
	}
	no, idle := false, "30m"
	got, err = d.C.UpdateSandbox(ctx, "upd", api.UpdateSandbox{Public: &no, Idle: &idle})
	if err != nil || got.State != api.StateSleeping || got.Public || got.Idle != "30m" || got.HTTPPort != 9000 {
		t.Fatalf("update of a sleeping sandbox: %v %+v", err, got)
	}
	if code, _ := get(); code != http.StatusUnauthorized {
		t.Errorf("private again: %d", code)
	}
	// A request refused at the door leaves it asleep; one with the token
	// wakes it.
	if got, _ := d.C.GetSandbox(ctx, "upd"); got.State != api.StateSleeping {
		t.Errorf("a refused request woke the sandbox: %s", got.State)
	}
	at, err := d.C.AccessToken(ctx, "upd")
	if err != nil {
		t.Fatal(err)
	}
	code, body, _, err := fetch(ctx, c, "GET", sb.URL+"/", http.Header{"X-Loam-Access-Token": {at.AccessToken}}, "")
	if err != nil || code != 200 || strings.TrimSpace(body) != "port9000" {
		t.Errorf("with the access token: %d %q %v", code, body, err)
	}
}
