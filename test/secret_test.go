package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// recorder keeps the body of every response a client reads.
type recorder struct {
	mu     sync.Mutex
	bodies bytes.Buffer
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return resp, nil // an exec stream: the checks keep values out of it
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.bodies.Write(b)
	r.bodies.WriteByte('\n')
	r.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp, nil
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bodies.String()
}

func randomValue(t *testing.T) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "s3cr3t-" + hex.EncodeToString(b)
}

// TestSecrets: a secret is given to a sandbox's processes as env and as a
// file (mode 0400, the sandbox user's), is in no API response, not in the
// daemon's log and not in clear in its data dir; a fork inherits its
// source's secrets, a fork that gives its own has only those; deleting one
// in use is a conflict unless forced.
func TestSecrets(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	rec := &recorder{}
	c := client.New(d.URL, d.Token, client.WithHTTPClient(&http.Client{Transport: rec}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	dbPass, apiKey := randomValue(t), randomValue(t)
	if _, err := c.PutSecret(ctx, "db-pass", "first value"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutSecret(ctx, "db-pass", dbPass); err != nil { // replaces
		t.Fatal(err)
	}
	// The CLI reads the value from stdin, never argv.
	if out, errb, code := d.CLI(apiKey+"\n", "secret", "set", "api-key"); code != 0 {
		t.Fatalf("loam secret set: %d %s %s", code, out, errb)
	}
	if out, _, _ := d.CLI("", "secret", "ls"); !strings.Contains(out, "api-key") || !strings.Contains(out, "db-pass") {
		t.Errorf("loam secret ls:\n%s", out)
	}
	if _, err := c.PutSecret(ctx, "bad/name", "x"); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("a bad name: %v, want invalid", err)
	}

	_, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "nope", Secrets: map[string]string{"X": "missing"}})
	if !errors.Is(err, api.ErrInvalid) {
		t.Errorf("a secret that does not exist: %v, want invalid", err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{
		Name:        "sec",
		Secrets:     map[string]string{"DB_PASS": "db-pass"},
		SecretFiles: map[string]string{"/run/secrets/db": "db-pass"},
		Services: []api.Service{{Name: "show", Cmd: []string{"sh", "-c",
			`if [ "$DB_PASS" = "` + dbPass + `" ] && [ "$(cat /run/secrets/db)" = "` + dbPass + `" ]; then echo yes; else echo no; fi > /tmp/svc; exec sleep 100000`}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Secrets["DB_PASS"] != "db-pass" || sb.SecretFiles["/run/secrets/db"] != "db-pass" {
		t.Errorf("create shows secrets %v, files %v", sb.Secrets, sb.SecretFiles)
	}
	run := func(sb string, cmd ...string) string {
		t.Helper()
		out, errb, code, err := c.Output(ctx, sb, cmd...)
		if err != nil || code != 0 {
			t.Fatalf("run %v in %s: %d %v %s", cmd, sb, code, err, errb)
		}
		return string(out)
	}
	// Output of a run is a response too: read what would show the value
	// through a comparison inside, so that it never comes back.
	check := func(sb, cond string) {
		t.Helper()
		if got := run(sb, "sh", "-c", "if "+cond+"; then echo yes; else echo no; fi"); got != "yes\n" {
			t.Errorf("in %s: %s: %q", sb, cond, got)
		}
	}
	check("sec", `[ "$DB_PASS" = "`+dbPass+`" ]`)
	check("sec", `[ "$(cat /run/secrets/db)" = "`+dbPass+`" ]`)
	// A service gets them too.
	harness.Eventually(t, 10*time.Second, "the service sees the secret", func() error {
		got := run("sec", "sh", "-c", "cat /tmp/svc 2>/dev/null || true")
		if got != "yes\n" && got != "" {
			t.Fatalf("the service saw the secret: %q", got)
		}
		if got == "" {
			return errors.New("the service wrote nothing yet")
		}
		return nil
	})
	if got := run("sec", "stat", "-c", "%a %U", "/run/secrets/db"); got != "400 loam\n" {
		t.Errorf("the secret file is %q, want 400 loam", got)
	}

	got, err := c.GetSandbox(ctx, "sec")
	if err != nil {
		t.Fatal(err)
	}
	if got.Secrets["DB_PASS"] != "db-pass" || len(got.Secrets) != 1 || got.SecretFiles["/run/secrets/db"] != "db-pass" {
		t.Errorf("GET shows secrets %v, files %v", got.Secrets, got.SecretFiles)
	}

	// A fork inherits its source's secrets.
	if _, err := c.CreateCheckpoint(ctx, "sec", api.CreateCheckpoint{Comment: "with secrets"}); err != nil {
		t.Fatal(err)
	}
	fork, err := c.Fork(ctx, "sec", "v1", "sec-fork")
	if err != nil {
		t.Fatal(err)
	}
	if fork.Secrets["DB_PASS"] != "db-pass" || fork.SecretFiles["/run/secrets/db"] != "db-pass" {
		t.Errorf("the fork shows secrets %v, files %v", fork.Secrets, fork.SecretFiles)
	}
	check("sec-fork", `[ "$DB_PASS" = "`+dbPass+`" ]`)
	check("sec-fork", `[ "$(cat /run/secrets/db)" = "`+dbPass+`" ]`)

	// A fork that gives its own secrets has only those: the source's file,
	// on the disk it copied, is removed.
	own, err := c.ForkWith(ctx, "sec", "v1", api.CreateSandbox{Name: "sec-own", Secrets: map[string]string{"API_KEY": "api-key"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(own.Secrets) != 1 || own.Secrets["API_KEY"] != "api-key" || len(own.SecretFiles) != 0 {
		t.Errorf("the fork with its own shows secrets %v, files %v", own.Secrets, own.SecretFiles)
	}
	check("sec-own", `[ "$API_KEY" = "`+apiKey+`" ]`)
	check("sec-own", `[ -z "${DB_PASS+set}" ]`)
	check("sec-own", `[ ! -e /run/secrets/db ]`)

	// A fork of a disk-only checkpoint boots fresh and gets them again.
	memory := false
	if _, err := c.CreateCheckpoint(ctx, "sec", api.CreateCheckpoint{Comment: "disk", Memory: &memory}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fork(ctx, "sec", "v2", "sec-disk"); err != nil {
		t.Fatal(err)
	}
	check("sec-disk", `[ "$DB_PASS" = "`+dbPass+`" ]`)
	check("sec-disk", `[ "$(cat /run/secrets/db)" = "`+dbPass+`" ]`)

	// Deleting a secret in use is a conflict naming its sandboxes.
	if _, errb, code := d.CLI("", "secret", "rm", "-y", "db-pass"); code != 1 || !strings.Contains(errb, "force") {
		t.Errorf("loam secret rm of a secret in use: %d %s", code, errb)
	}
	err = c.DeleteSecret(ctx, "db-pass", false)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeConflict || !strings.Contains(ae.Message, "sec-fork") {
		t.Errorf("deleting a secret in use: %v, want conflict naming sec-fork", err)
	}
	if err := c.DeleteSecret(ctx, "db-pass", true); err != nil {
		t.Fatalf("deleting with force: %v", err)
	}
	// Gone, it is not_found, though sandboxes still name it: a conflict
	// would send the caller round to delete it again.
	if err := c.DeleteSecret(ctx, "db-pass", false); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("deleting a secret deleted with force: %v, want not_found", err)
	}
	list, err := c.ListSecrets(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "api-key" {
		t.Errorf("after the delete: %v, %v", list, err)
	}
	// The sandbox keeps running; a restore (a fresh connect) goes without.
	check("sec", `[ "$DB_PASS" = "`+dbPass+`" ]`)
	if _, err := c.RestoreCheckpoint(ctx, "sec", "v1"); err != nil {
		t.Fatal(err)
	}
	check("sec", `[ -z "${DB_PASS+set}" ]`)

	for _, v := range []string{dbPass, apiKey} {
		if strings.Contains(rec.String(), v) {
			t.Errorf("an API response holds a secret's value")
		}
		if strings.Contains(d.Log.String(), v) {
			t.Errorf("the daemon's log holds a secret's value")
		}
		files, _ := filepath.Glob(filepath.Join(d.DataDir, "loam.db*"))
		for _, f := range files {
			if b, _ := os.ReadFile(f); bytes.Contains(b, []byte(v)) {
				t.Errorf("%s holds a secret's value in clear", f)
			}
		}
	}
	if fi, err := os.Stat(filepath.Join(d.DataDir, "secrets.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("secrets.key: %v, %v", fi, err)
	}
}

// TestSecretsAfterRestart: a sandbox keeps its secrets when the daemon
// restarts and takes it back (recovery sends the agent its identity, the
// secrets with it, again).
func TestSecretsAfterRestart(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	v := randomValue(t)
	if _, err := d.C.PutSecret(ctx, "tok", v); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "kept", Secrets: map[string]string{"TOK": "tok"}}); err != nil {
		t.Fatal(err)
	}
	cond := `if [ "$TOK" = "` + v + `" ]; then echo yes; fi`
	if got := d.Run("kept", "sh", "-c", cond); got != "yes\n" {
		t.Fatalf("before the restart: %q", got)
	}
	d.Stop()
	d.Start()
	if got := d.Run("kept", "sh", "-c", cond); got != "yes\n" {
		t.Fatalf("after the restart: %q", got)
	}
}
