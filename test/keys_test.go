package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// makeKey makes an API key with the admin token; its answer.
func makeKey(t *testing.T, d *harness.Daemon, body string) api.Key {
	t.Helper()
	st, out := d.Curl("POST", "/v1/keys", body)
	var k api.Key
	if err := json.Unmarshal([]byte(out), &k); err != nil || st != http.StatusCreated || !strings.HasPrefix(k.Secret, api.KeyPrefix) {
		t.Fatalf("POST /v1/keys %s: %d %s", body, st, out)
	}
	return k
}

// TestKeys holds API keys to their promises on real sandboxes: a key
// limited by labels works on its own sandboxes only; one key serves two
// clients at once; a read key cannot exec; revoking a key ends its open
// exec and port streams within seconds and refuses its next call; an expired key
// is refused and its stream ends; each change is in the audit log once,
// with the key that made it.
func TestKeys(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	admin := client.New(d.URL, d.Token)

	agentKey := makeKey(t, d, `{"name":"agent","scope":"write","labels":{"owner":"agent"}}`)
	readKey := makeKey(t, d, `{"name":"watcher","scope":"read"}`)
	agent := client.New(d.URL, agentKey.Secret)
	reader := client.New(d.URL, readKey.Secret)

	mine, err := agent.CreateSandbox(ctx, api.CreateSandbox{Name: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	if mine.Labels["owner"] != "agent" {
		t.Errorf("a sandbox the agent's key made has labels %v, want owner=agent", mine.Labels)
	}
	if _, err := admin.CreateSandbox(ctx, api.CreateSandbox{Name: "theirs"}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := agent.Output(ctx, "theirs", "true"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("exec in a sandbox outside the key's labels: %v, want not_found", err)
	}
	if list, err := agent.ListSandboxes(ctx, client.ListOptions{}); err != nil || len(list) != 1 || list[0].Name != "mine" {
		t.Errorf("the agent's list: %v, %v; want mine alone", list, err)
	}

	// One key, two clients, at once.
	other := client.New(d.URL, agentKey.Secret)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		c := agent
		if i%2 == 1 {
			c = other
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, _, code, err := c.Output(ctx, "mine", "echo", fmt.Sprint(i))
			if err != nil || code != 0 || strings.TrimSpace(string(out)) != fmt.Sprint(i) {
				errs <- fmt.Errorf("exec %d: %q %d %v", i, out, code, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	if _, err := reader.GetSandbox(ctx, "mine"); err != nil {
		t.Errorf("get with a read key: %v", err)
	}
	if _, _, _, err := reader.Output(ctx, "mine", "true"); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("exec with a read key: %v, want forbidden", err)
	}

	// Revoking ends the open streams (an exec, a port stream) and refuses
	// the next call. The port stream's server (nc, its input held open)
	// never closes it: only the revoke can.
	if _, _, code, err := admin.Output(ctx, "mine", "sh", "-c", "setsid sh -c 'sleep 600 | nc -l -p 8080' </dev/null >/dev/null 2>&1 &"); err != nil || code != 0 {
		t.Fatalf("starting nc: %d %v", code, err)
	}
	harness.Eventually(t, 30*time.Second, "nc to listen", func() error {
		ps, err := admin.ListPorts(ctx, "mine")
		if err != nil || len(ps) != 1 || ps[0].Port != 8080 {
			return fmt.Errorf("ports %+v, %v", ps, err)
		}
		return nil
	})
	port, err := agent.DialPort(ctx, "mine", 8080)
	if err != nil {
		t.Fatal(err)
	}
	defer port.Close()
	if _, err := io.WriteString(port, "hello\n"); err != nil {
		t.Fatal(err)
	}
	portEnded := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(port)
		portEnded <- err
	}()
	ended := make(chan error, 1)
	go func() {
		_, err := agent.Exec(ctx, "mine", client.ExecOptions{Cmd: []string{"sh", "-c", "touch /tmp/started; exec sleep 600"}})
		ended <- err
	}()
	harness.Eventually(t, 30*time.Second, "the exec to start", func() error {
		if _, _, code, err := admin.Output(ctx, "mine", "test", "-e", "/tmp/started"); err != nil || code != 0 {
			return fmt.Errorf("no /tmp/started: %d %v", code, err)
		}
		return nil
	})
	select {
	case err := <-portEnded:
		t.Fatalf("the port stream ended before the revoke: %v", err)
	default:
	}
	if st, out := d.Curl("DELETE", "/v1/keys/"+agentKey.ID, ""); st != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", st, out)
	}
	revoked := time.Now()
	select {
	case err := <-ended:
		t.Logf("the revoked key's exec stream ended %v after the revoke: %v", time.Since(revoked).Round(time.Millisecond), err)
	case <-time.After(10 * time.Second):
		t.Fatal("the exec stream of a revoked key is still open 10 s after the revoke")
	}
	select {
	case err := <-portEnded:
		t.Logf("the revoked key's port stream ended %v after the revoke: %v", time.Since(revoked).Round(time.Millisecond), err)
	case <-time.After(10 * time.Second):
		t.Fatal("the port stream of a revoked key is still open 10 s after the revoke")
	}
	if _, err := agent.GetSandbox(ctx, "mine"); !errors.Is(err, api.ErrUnauthorized) {
		t.Errorf("a call with a revoked key: %v, want unauthorized", err)
	}

	// Expiry: the key works, then is refused, and its stream ends.
	brief := makeKey(t, d, `{"name":"brief","scope":"write","expires_in":"4s"}`)
	short := client.New(d.URL, brief.Secret)
	start := time.Now()
	go func() {
		_, err := short.Exec(ctx, "mine", client.ExecOptions{Cmd: []string{"sleep", "600"}})
		ended <- err
	}()
	select {
	case <-ended:
		if left := time.Until(*brief.ExpiresAt); left > time.Second {
			t.Errorf("the brief key's stream ended %v before the key expired", left)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the exec stream of an expired key is still open 30 s after it began")
	}
	t.Logf("the brief key's stream ended %v after it began (the key lived 4 s)", time.Since(start).Round(time.Millisecond))
	if _, err := short.GetSandbox(ctx, "mine"); !errors.Is(err, api.ErrUnauthorized) {
		t.Errorf("a call with an expired key: %v, want unauthorized", err)
	}

	// The audit log: each change once, by the key that made it.
	st, out := d.Curl("GET", "/v1/audit", "")
	var log api.AuditList
	if err := json.Unmarshal([]byte(out), &log); err != nil || st != http.StatusOK {
		t.Fatalf("audit: %d %s", st, out)
	}
	count := map[string]int{}
	for _, ev := range log.Events {
		count[ev.Key+" "+ev.Action+" "+ev.Target+" "+ev.Outcome]++
	}
	for want, n := range map[string]int{
		"admin key.create keys/" + agentKey.ID + " ok":              1,
		agentKey.ID + " sandbox.create sandboxes/mine ok":           1,
		"admin sandbox.create sandboxes/theirs ok":                  1,
		agentKey.ID + " exec.start sandboxes/theirs/exec not_found": 1,
		agentKey.ID + " exec.start sandboxes/mine/exec ok":          9,
		readKey.ID + " exec.start sandboxes/mine/exec forbidden":    1,
		"admin key.revoke keys/" + agentKey.ID + " ok":              1,
	} {
		if count[want] != n {
			t.Errorf("audit log: %d × %q, want %d\n%s", count[want], want, n, out)
		}
	}
}
