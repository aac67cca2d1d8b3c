package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/console"
)

// Ctx is a test's context: it ends with the test, or after 10 minutes, so
// that a call that hangs fails the test instead of the whole run. Not
// less: a long test (TestDataDirFull, TestFilesLarge) has taken over 3
// minutes on a 2-core host running five test packages at once.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// Curl sends a request to the daemon's API as the docs' curl lines do and
// returns the status and body.
func (d *Daemon) Curl(method, path, body string) (int, string) {
	d.T.Helper()
	return d.CurlAs(d.Token, method, path, body)
}

// CurlAs is Curl with token (an API key, say) instead of the admin token.
func (d *Daemon) CurlAs(token, method, path, body string) (int, string) {
	d.T.Helper()
	req, err := http.NewRequest(method, d.URL+path, strings.NewReader(body))
	if err != nil {
		d.T.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.T.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// EnvInt is the positive number the environment variable name holds (a
// test's knob, such as LOAM_SOAK), or def when it is not set.
func EnvInt(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: a positive number", name, v)
	}
	return n
}

// APICode is the code of the *api.Error err wraps, or "".
func APICode(err error) api.Code {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

// MountsUnder lists the mount points below dir.
func MountsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mounts")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			out = append(out, f[1])
		}
	}
	return out
}

// LoopsOf counts the loop devices on data dir dir's disk pool image.
func LoopsOf(dir string) int {
	out, _ := exec.Command("losetup", "-j", filepath.Join(dir, "disk", "disk.img")).Output()
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) != "" {
			n++
		}
	}
	return n
}

// ConsoleLogin logs in to the daemon's web console with token (the admin
// token or an API key), as its page does, and returns the session's
// cookie and CSRF token.
func (d *Daemon) ConsoleLogin(token string) (*http.Cookie, string) {
	d.T.Helper()
	res, err := http.Post(d.URL+"/console/login", "application/json", strings.NewReader(`{"token":"`+token+`"}`))
	if err != nil {
		d.T.Fatal(err)
	}
	defer res.Body.Close()
	var info console.SessionInfo
	if err := json.NewDecoder(res.Body).Decode(&info); err != nil || res.StatusCode != http.StatusOK {
		d.T.Fatalf("console login: %d %v", res.StatusCode, err)
	}
	for _, c := range res.Cookies() {
		if c.Name == console.CookieName {
			return c, info.CSRFToken
		}
	}
	d.T.Fatal("console login set no session cookie")
	return nil, ""
}

// Served asks the daemon's front door for the URL of a sandbox (tok, its
// access token) and returns nil once the answer is 200 with want in its
// body: for Eventually, while the sandbox's server comes up.
func (d *Daemon) Served(ctx context.Context, tok *api.AccessToken, want string) error {
	req, err := http.NewRequestWithContext(ctx, "GET", d.URL+"/", nil)
	if err != nil {
		return err
	}
	req.Host = strings.TrimPrefix(strings.TrimPrefix(tok.URL, "http://"), "https://")
	req.Header.Set("X-Loam-Access-Token", tok.AccessToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
		return fmt.Errorf("%d %s", res.StatusCode, body)
	}
	return nil
}
