package console

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/console"
	"loam.dev/loam/internal/testenv"
	"loam.dev/loam/test/harness"
)

// consoleDir is web/, the console's sources.
func consoleDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "web")
}

// chromiumPath is the browser TestConsole drives: $CHROMIUM, or Debian's
// chromium (scripts/setup installs it).
func chromiumPath() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	return "/usr/bin/chromium"
}

// TestConsole drives the web console in headless Chromium against a real
// daemon and real sandboxes (web/test/console.e2e.mjs: log in, create,
// terminal, checkpoint, change a file, restore, the file back, fork, the
// fork's process running, services, files, sleep, wake, delete). It first
// type-checks web/ and checks that the bundle committed in
// internal/console/dist is what web/ builds. Screenshots of each step are kept in test/artifacts/TestConsole.
// Without node, npm or chromium it skips, unless CI=true.
func TestConsole(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"node", "npm", chromiumPath()} {
		if _, err := exec.LookPath(tool); err != nil {
			if testenv.CI() {
				t.Fatalf("%s not found (scripts/setup installs it); CI=true, so this is a failure", tool)
			}
			t.Skipf("%s not found (scripts/setup installs it)", tool)
		}
	}
	dir := consoleDir()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	run := func(env []string, name string, args ...string) string {
		t.Helper()
		return harness.Command(ctx, t, dir, env, name, args...)
	}
	run(nil, "npm", "ci", "--no-audit", "--no-fund")
	run(nil, "npm", "run", "check")
	built := t.TempDir()
	run(nil, "node", "build.mjs", built)
	if diff := diffTrees(t, built, filepath.Join(dir, "..", "internal", "console", "dist")); diff != "" {
		t.Fatalf("internal/console/dist is not what web/ builds (run: cd web && npm run build, and commit): %s", diff)
	}

	// The daemon's URL domain is its own listener, so that the page's
	// "open the URL" reaches the sandbox (*.localhost is loopback to
	// Chromium). A later flag wins over harness.StartDaemon's --listen.
	port := freePort(t)
	d := harness.StartDaemon(t, "--listen", "127.0.0.1:"+port, "--domain", "localhost:"+port)
	artifacts := filepath.Join(dir, "..", "test", "artifacts", t.Name())
	if err := os.RemoveAll(artifacts); err != nil {
		t.Fatal(err)
	}
	// The script asks, on its stdout, for the daemon to be restarted under
	// its open page; it goes on when told so on its stdin.
	// A read key, with which the page logs in at its end.
	st, body := d.Curl("POST", "/v1/keys", `{"name":"console-reader","scope":"read"}`)
	var readKey api.Key
	if err := json.Unmarshal([]byte(body), &readKey); st != http.StatusCreated || err != nil {
		t.Fatalf("making a read key: %d %s", st, body)
	}
	e2e := exec.CommandContext(ctx, "node", "test/console.e2e.mjs")
	e2e.Dir = dir
	e2e.Env = append(os.Environ(), "LOAM_URL="+d.URL, "LOAM_TOKEN="+d.Token, "LOAM_READ_KEY="+readKey.Secret, "LOAM_TOKEN_FILE="+filepath.Join(d.DataDir, "token"), "LOAM_ARTIFACTS="+artifacts,
		"LOAM_TEMPLATE=base", "CHROMIUM="+chromiumPath())
	stdin, err := e2e.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := e2e.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr harness.SyncBuffer
	e2e.Stderr = &stderr
	start := time.Now()
	if err := e2e.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	restarted := false
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		line := lines.Text()
		out.WriteString(line + "\n")
		if line == "loam-e2e: restart the daemon" {
			began := time.Now()
			d.Stop()
			d.Start("--listen", "127.0.0.1:"+port, "--domain", "localhost:"+port)
			t.Logf("restarted the daemon under the open page in %v", time.Since(began).Round(time.Millisecond))
			restarted = true
			if _, err := io.WriteString(stdin, "restarted\n"); err != nil {
				t.Errorf("telling the script: %v", err)
			}
			stdin.Close()
		}
	}
	err = e2e.Wait()
	t.Logf("node test/console.e2e.mjs: %s\n%s%s", time.Since(start).Round(time.Millisecond), out.String(), stderr.String())
	if err != nil {
		t.Fatalf("node test/console.e2e.mjs: %v", err)
	}
	if !restarted {
		t.Error("the script never asked for the daemon's restart")
	}

	// What the page did, seen through the API.
	sb, err := d.C.GetSandbox(ctx, "web1")
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != api.StateRunning || sb.Labels["team"] != "console" {
		t.Errorf("web1 is %s with labels %v; want running with team=console", sb.State, sb.Labels)
	}
	cps, err := d.C.ListCheckpoints(ctx, "web1")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, cp := range cps {
		ids = append(ids, cp.ID)
	}
	if strings.Join(ids, ",") != "v1,auto-1" {
		t.Errorf("web1's checkpoints are %v; want v1 (the page's) and auto-1 (its restore's)", ids)
	}
	// The page hung up the shells it started when it left them; the
	// sessions are gone a moment later.
	harness.Eventually(t, 30*time.Second, "the page's shells' sessions in web1 ended after it left them", func() error {
		ss, err := d.C.ListSessions(ctx, "web1")
		if err != nil {
			t.Fatal(err)
		}
		var running []string
		for _, s := range ss {
			if s.State == "running" {
				running = append(running, s.ID+" "+strings.Join(s.Cmd, " "))
			}
		}
		if len(running) > 0 {
			return fmt.Errorf("still running: %v", running)
		}
		return nil
	})
	for _, gone := range []string{"web1-fork", "web1-fork2"} {
		if _, err := d.C.GetSandbox(ctx, gone); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("%s, deleted in the page, is still there (%v)", gone, err)
		}
	}
	t.Logf("screenshots in %s", artifacts)
}

// freePort is a TCP port free on loopback a moment ago, below the
// kernel's ephemeral range: the daemon takes it again after a restart, and
// meanwhile no listener on port 0 nor outgoing connection of a parallel
// test can be given it (the kernel picks those in the ephemeral range).
func freePort(t *testing.T) string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 11000 {
				low = n
			}
		}
	}
	for range 100 {
		port := strconv.Itoa(10000 + rand.IntN(low-10000))
		ln, err := net.Listen("tcp", "127.0.0.1:"+port)
		if err == nil {
			ln.Close()
			return port
		}
	}
	t.Fatal("no free port below the ephemeral range in 100 tries")
	return ""
}

// diffTrees says how the files under a and b differ; "" when they are the
// same.
func diffTrees(t *testing.T, a, b string) string {
	t.Helper()
	read := func(root string) map[string][]byte {
		files := map[string][]byte{}
		err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			body, err := os.ReadFile(p)
			rel, _ := filepath.Rel(root, p)
			files[rel] = body
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	fa, fb := read(a), read(b)
	var diffs []string
	for name, body := range fa {
		if other, ok := fb[name]; !ok {
			diffs = append(diffs, name+" is missing")
		} else if !bytes.Equal(body, other) {
			diffs = append(diffs, name+" differs")
		}
	}
	for name := range fb {
		if _, ok := fa[name]; !ok {
			diffs = append(diffs, name+" is not built any more")
		}
	}
	return strings.Join(diffs, "; ")
}

// TestConsoleHostileInput sends a daemon's console what a hostile browser
// or client might: forged, stale and missing cookies, cookies without the
// CSRF token or with another session's, cross-site style requests, and
// paths that try to leave the page's files. Each gets a 4xx with the API's
// error shape, never a 500; Bearer tokens work as before, cookie or not.
func TestConsoleHostileInput(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	login := func() (*http.Cookie, string) {
		t.Helper()
		c, csrf := d.ConsoleLogin(d.Token)
		if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode {
			t.Errorf("session cookie %v: want HttpOnly, SameSite=Strict", c)
		}
		return c, csrf
	}
	cookie, csrf := login()
	_, otherCSRF := login()
	forged := &http.Cookie{Name: console.CookieName, Value: strings.Repeat("a", 64)}

	type req struct {
		name, method, path, body, contentType string
		cookie                                *http.Cookie
		header                                map[string]string
		want                                  int
	}
	csrfH := map[string]string{console.CSRFHeader: csrf}
	cases := []req{
		{name: "no cookie, no token", method: "GET", path: "/v1/sandboxes", want: 401},
		{name: "forged cookie", method: "GET", path: "/v1/sandboxes", cookie: forged, header: csrfH, want: 401},
		{name: "empty cookie", method: "GET", path: "/v1/sandboxes", cookie: &http.Cookie{Name: console.CookieName, Value: ""}, header: csrfH, want: 401},
		{name: "cookie without CSRF", method: "GET", path: "/v1/sandboxes", cookie: cookie, want: 403},
		{name: "create with cookie without CSRF", method: "POST", path: "/v1/sandboxes", body: `{"name":"evil"}`, contentType: "application/json", cookie: cookie, want: 403},
		{name: "form post with cookie", method: "POST", path: "/v1/sandboxes", body: "name=evil", contentType: "application/x-www-form-urlencoded", cookie: cookie, header: map[string]string{"Origin": "https://evil.example"}, want: 403},
		{name: "another session's CSRF", method: "DELETE", path: "/v1/sandboxes/x", cookie: cookie, header: map[string]string{console.CSRFHeader: otherCSRF}, want: 403},
		{name: "wrong CSRF", method: "POST", path: "/v1/sandboxes/x/sleep", cookie: cookie, header: map[string]string{console.CSRFHeader: csrf + "x"}, want: 403},
		{name: "websocket with cookie without CSRF", method: "GET", path: "/v1/sandboxes/x/exec", cookie: cookie,
			header: map[string]string{"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol": api.WebSocketProtocol}, want: 403},
		{name: "cookie with CSRF", method: "GET", path: "/v1/sandboxes", cookie: cookie, header: csrfH, want: 200},
		{name: "wrong bearer with good cookie", method: "GET", path: "/v1/sandboxes", cookie: cookie, header: map[string]string{"Authorization": "Bearer nope", console.CSRFHeader: csrf}, want: 401},
		{name: "bearer without cookie", method: "GET", path: "/v1/sandboxes", header: map[string]string{"Authorization": "Bearer " + d.Token}, want: 200},
		{name: "bearer with forged cookie", method: "GET", path: "/v1/sandboxes", cookie: forged, header: map[string]string{"Authorization": "Bearer " + d.Token}, want: 200},
		{name: "session without cookie", method: "GET", path: "/console/session", want: 401},
		{name: "session with forged cookie", method: "GET", path: "/console/session", cookie: forged, want: 401},
		{name: "logout without CSRF", method: "POST", path: "/console/logout", cookie: cookie, want: 403},
		{name: "logout without cookie", method: "POST", path: "/console/logout", header: csrfH, want: 401},
		{name: "logout with a malformed cookie", method: "POST", path: "/console/logout", header: map[string]string{"Cookie": console.CookieName + "=\"a b", console.CSRFHeader: csrf}, want: 401},
		{name: "login as a form", method: "POST", path: "/console/login", body: "token=" + d.Token, contentType: "application/x-www-form-urlencoded", want: 400},
		{name: "login with a wrong token", method: "POST", path: "/console/login", body: `{"token":"loam_nope"}`, contentType: "application/json", want: 401},
		{name: "login with junk", method: "POST", path: "/console/login", body: `{"token":`, contentType: "application/json", want: 400},
		{name: "login with PUT", method: "PUT", path: "/console/login", want: 405},
		{name: "login hint", method: "GET", path: "/console/login", want: 200},
		{name: "unknown console call", method: "GET", path: "/console/../../etc/passwd", want: 404},
		{name: "traversal in assets", method: "GET", path: "/assets/../../../../etc/passwd", want: 404},
		{name: "encoded traversal in assets", method: "GET", path: "/assets/..%2f..%2f..%2fetc%2fpasswd", want: 404},
		{name: "double-encoded traversal", method: "GET", path: "/assets/%252e%252e/%252e%252e/etc/passwd", want: 404},
		{name: "embed path", method: "GET", path: "/assets/../dist/index.html", want: 404},
		{name: "Go source", method: "GET", path: "/assets/console.go", want: 404},
		{name: "NUL in path", method: "GET", path: "/assets/app.js%00.png", want: 404},
		{name: "directory", method: "GET", path: "/assets/", want: 404},
		{name: "POST to the page", method: "POST", path: "/", want: 405},
		{name: "the page", method: "GET", path: "/", want: 200},
		{name: "the script", method: "GET", path: "/assets/app.js", want: 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := http.NewRequest(c.method, d.URL+c.path, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if c.contentType != "" {
				r.Header.Set("Content-Type", c.contentType)
			}
			for k, v := range c.header {
				r.Header.Set(k, v)
			}
			if c.cookie != nil {
				r.AddCookie(c.cookie)
			}
			res, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != c.want {
				t.Fatalf("%s %s: %d %s; want %d", c.method, c.path, res.StatusCode, body, c.want)
			}
			if c.want >= 400 {
				var e api.ErrorBody
				if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Code == "" {
					t.Errorf("%s %s: body %q is not the API's error shape", c.method, c.path, body)
				}
			}
		})
	}
	// The page is never served on a sandbox's URL: that Host is the
	// sandbox's, and the front door answers for it.
	r, _ := http.NewRequest("GET", d.URL+"/", nil)
	r.Host = "nosuch--default.localhost"
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode < 400 || res.StatusCode >= 500 || bytes.Contains(body, []byte("/assets/app.js")) {
		t.Errorf("GET / on a sandbox's URL: %d %.200s; want the front door's 4xx, not the console", res.StatusCode, body)
	}
}

// TestConsoleSessionKeptOverRestart: a console login outlives a restart of
// the daemon (sessions are in its database); its logout does too.
func TestConsoleSessionKeptOverRestart(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	cookie, csrf := d.ConsoleLogin(d.Token)
	call := func(method, path string) int {
		t.Helper()
		r, _ := http.NewRequest(method, d.URL+path, nil)
		r.AddCookie(cookie)
		r.Header.Set(console.CSRFHeader, csrf)
		res, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	d.Stop()
	d.Start()
	if code := call("GET", "/v1/sandboxes"); code != http.StatusOK {
		t.Fatalf("the console session after a restart: %d, want 200", code)
	}
	if code := call("POST", "/console/logout"); code != http.StatusNoContent {
		t.Fatalf("logout: %d", code)
	}
	d.Stop()
	d.Start()
	if code := call("GET", "/v1/sandboxes"); code != http.StatusUnauthorized {
		t.Errorf("a session logged out of, after a restart: %d, want 401", code)
	}
}
