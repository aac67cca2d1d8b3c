package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/store/postgres/pgtest"
	"loam.dev/loam/test/harness"
)

// clusterLease is the nodes' lease in the cluster tests: short, so that a
// node killed is seen gone in seconds.
const clusterLease = "3s"

// freePort is a loopback port free now, for a node that must know its
// address (--advertise) before it listens.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// clusterNode is a node daemon of a test's cluster.
type clusterNode struct {
	*harness.Daemon
	name string
	args []string
}

// startNode starts node name on database url, with the admin token given
// (its token file), or made by it when token is "" (the cluster's first).
func startNode(t testing.TB, url, name, token string, extra ...string) *clusterNode {
	t.Helper()
	dir, err := os.MkdirTemp("", "loam-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	d := &harness.Daemon{T: t, DataDir: dir, Subnet: harness.NextSubnet()}
	t.Cleanup(func() { d.Destroy() })
	if token != "" {
		if err := os.WriteFile(filepath.Join(dir, "token"), []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := freePort(t)
	n := &clusterNode{Daemon: d, name: name, args: []string{
		"--database", url, "--node", name, "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--advertise", fmt.Sprintf("http://127.0.0.1:%d", port), "--test-lease", clusterLease,
	}}
	n.args = append(n.args, extra...)
	d.Start(n.args...)
	return n
}

// nodes is GET /v1/nodes through n.
func (n *clusterNode) nodes(t testing.TB) map[string]api.Node {
	t.Helper()
	code, body := n.Curl("GET", "/v1/nodes", "")
	if code != http.StatusOK {
		t.Fatalf("GET /v1/nodes through %s: %d %s", n.name, code, body)
	}
	var list api.NodeList
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]api.Node{}
	for _, nd := range list.Nodes {
		out[nd.Name] = nd
	}
	return out
}

// TestCluster: two node daemons on one PostgreSQL answer for each other.
// A sandbox made through node b is b's; through node a it is listed, read,
// run in (exec, files), checkpointed and forked (on b, which holds the
// checkpoint), and its URL served; two nodes racing for one name leave one
// sandbox; a node killed shows its sandboxes unknown, refuses calls naming
// it, and takes them back when it restarts; a cordon shows; a node removed
// for good leaves its sandboxes in error.
func TestCluster(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	a := startNode(t, url, "a", "")
	b := startNode(t, url, "b", a.Token)
	front := startNode(t, url, "front", a.Token, "--role", "api")
	ctx := harness.Ctx(t)
	// The nodes' answers, against the API's document.
	doc := &walker{t: t, d: a.Daemon, c: newConformance(t)}
	var listed api.NodeList
	doc.json(req{route: "GET /v1/nodes", path: "/v1/nodes"}, 200, &listed)

	nodes := a.nodes(t)
	if nd := nodes["front"]; nd.Role != "api" || nd.State != api.NodeReady {
		t.Errorf("the front end in GET /v1/nodes: %+v", nd)
	}
	for _, name := range []string{"a", "b"} {
		if nd, ok := nodes[name]; !ok || nd.State != api.NodeReady || nd.Role != "node" || nd.CPUs == 0 || nd.MemoryMiB == 0 || nd.Runsc == "" {
			t.Errorf("node %s in GET /v1/nodes: %+v, want ready with its load", name, nd)
		}
	}

	// Pinned by the operator, through the other node.
	onB, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "on-b", Node: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if onB.Node != "b" {
		t.Errorf("a sandbox pinned to node b: node %q", onB.Node)
	}
	if sb, err := b.C.CreateSandbox(ctx, api.CreateSandbox{Name: "on-a", Node: "a"}); err != nil || sb.Node != "a" {
		t.Fatalf("a sandbox pinned to node a through b: %+v, %v", sb, err)
	}
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "nowhere", Node: "c"}); harness.APICode(err) != api.CodeInvalid {
		t.Errorf("a sandbox pinned to a node that is none: %v, want invalid", err)
	}
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "nowhere", Node: "front"}); harness.APICode(err) != api.CodeInvalid {
		t.Errorf("a sandbox pinned to the front end: %v, want invalid", err)
	}
	// The front end runs none: it places a create on a node, and passes
	// the calls for it there.
	viaFront, err := front.C.CreateSandbox(ctx, api.CreateSandbox{Name: "via-front"})
	if err != nil || (viaFront.Node != "a" && viaFront.Node != "b") {
		t.Fatalf("a create through the front end: %+v, %v; want it on a or b", viaFront, err)
	}
	if out := front.Run("via-front", "echo", "through-front"); strings.TrimSpace(out) != "through-front" {
		t.Errorf("an exec through the front end: %q", out)
	}
	if err := front.C.DeleteSandbox(ctx, "via-front"); err != nil {
		t.Errorf("a delete through the front end: %v", err)
	}

	// Through a, everything of b's sandbox.
	if sb, err := a.C.GetSandbox(ctx, "on-b"); err != nil || sb.Node != "b" || sb.State != api.StateRunning {
		t.Errorf("on-b through a: %+v, %v", sb, err)
	}
	list, err := a.C.ListSandboxes(ctx, client.ListOptions{})
	if err != nil || len(list) != 2 {
		t.Errorf("the list through a: %+v, %v; want on-a and on-b", list, err)
	}
	if out := a.Run("on-b", "sh", "-c", "echo hello > /home/loam/mark; hostname"); !strings.Contains(out, "on-b") {
		t.Errorf("an exec in on-b through a: %q", out)
	}
	payload := bytes.Repeat([]byte("loam cluster "), 100_000)
	if _, err := a.C.WriteFile(ctx, "on-b", "/home/loam/big", bytes.NewReader(payload), nil); err != nil {
		t.Fatalf("an upload to on-b through a: %v", err)
	}
	rc, err := a.C.ReadFile(ctx, "on-b", "/home/loam/big", nil)
	if err != nil {
		t.Fatalf("a download from on-b through a: %v", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, payload) {
		t.Errorf("the download through a: %d bytes, %v; want the %d uploaded", len(got), err, len(payload))
	}
	// A session and a port stream, through a.
	sess, err := a.C.CreateSession(ctx, "on-b", api.ExecRequest{Cmd: []string{"sh", "-c", "echo in-session"}})
	if err != nil {
		t.Fatalf("a session in on-b through a: %v", err)
	}
	if done, err := a.C.WaitSession(ctx, "on-b", sess.ID); err != nil || done.ExitCode == nil || *done.ExitCode != 0 {
		t.Errorf("the session through a: %+v, %v", done, err)
	}
	// Its URL, through a's front door.
	a.Run("on-b", "sh", "-c", "mkdir -p /tmp/www && echo served-by-b > /tmp/www/index.html && (httpd -p 8080 -h /tmp/www &)")
	tok, err := a.C.AccessToken(ctx, "on-b")
	if err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 20*time.Second, "on-b's URL through a", func() error {
		req, _ := http.NewRequestWithContext(ctx, "GET", a.URL+"/", nil)
		req.Host = strings.TrimPrefix(strings.TrimPrefix(tok.URL, "http://"), "https://")
		req.Header.Set("X-Loam-Access-Token", tok.AccessToken)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "served-by-b") {
			return fmt.Errorf("%d %s", res.StatusCode, body)
		}
		return nil
	})

	harness.Eventually(t, 20*time.Second, "a port stream to on-b through a", func() error {
		conn, err := a.C.DialPort(ctx, "on-b", 8080)
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\n\r\n"); err != nil {
			return err
		}
		got, _ := io.ReadAll(io.LimitReader(conn, 4096))
		if !strings.Contains(string(got), "served-by-b") {
			return fmt.Errorf("read %q", got)
		}
		return nil
	})

	// Checkpoints of one sandbox through both nodes at once: unique ids,
	// in order.
	var wg sync.WaitGroup
	ids := make(chan string, 4)
	for i := range 4 {
		via := a
		if i%2 == 1 {
			via = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One checkpoint of a sandbox at a time, wherever it is asked
			// for: the others wait their turn.
			for {
				cp, err := via.C.CreateCheckpoint(ctx, "on-b", api.CreateCheckpoint{})
				if harness.APICode(err) == api.CodeConflict && strings.Contains(err.Error(), "busy") {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				if err != nil {
					t.Errorf("a checkpoint of on-b through %s: %v", via.name, err)
					return
				}
				ids <- cp.ID
				return
			}
		}()
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		seen[id] = true
	}
	for _, id := range []string{"v1", "v2", "v3", "v4"} {
		if !seen[id] {
			t.Errorf("checkpoint ids through two nodes: %v, want v1..v4", seen)
			break
		}
	}
	fork, err := a.C.Fork(ctx, "on-b", "v1", "fork-b")
	if err != nil {
		t.Fatalf("a fork of on-b through a: %v", err)
	}
	if fork.Node != "b" {
		t.Errorf("the fork of b's checkpoint: node %q, want b (which holds it)", fork.Node)
	}
	if out := a.Run("fork-b", "cat", "/home/loam/mark"); strings.TrimSpace(out) != "hello" {
		t.Errorf("the fork's mark through a: %q", out)
	}

	// Two nodes racing for one name: one sandbox, one conflict.
	errs := make(chan error, 2)
	for _, via := range []*clusterNode{a, b} {
		go func() {
			_, err := via.C.CreateSandbox(ctx, api.CreateSandbox{Name: "race"})
			errs <- err
		}()
	}
	e1, e2 := <-errs, <-errs
	if (e1 == nil) == (e2 == nil) {
		t.Errorf("two creates of one name through two nodes: %v and %v, want one conflict", e1, e2)
	} else if c := harness.APICode(e1) + harness.APICode(e2); c != api.CodeConflict {
		t.Errorf("the loser's error: %v %v, want conflict", e1, e2)
	}

	// A cordon keeps placements off a node; with every node cordoned, a
	// create answers limit, saying why.
	var cordoned api.Node
	doc.json(req{route: "POST /v1/nodes/{node}/cordon", path: "/v1/nodes/b/cordon"}, 200, &cordoned)
	if !cordoned.Cordoned || cordoned.Name != "b" {
		t.Errorf("cordon b: %+v", cordoned)
	}
	doc.json(req{route: "GET /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/on-b"}, 200, &api.Sandbox{})
	if !a.nodes(t)["b"].Cordoned {
		t.Errorf("b after the cordon: not cordoned")
	}
	// Each node reads the cordon with its next renewal.
	time.Sleep(2 * time.Second)
	for i := range 3 {
		sb, err := b.C.CreateSandbox(ctx, api.CreateSandbox{Name: fmt.Sprintf("placed-%d", i)})
		if err != nil || sb.Node != "a" {
			t.Errorf("a create through b while b is cordoned: %+v, %v; want it on a", sb, err)
		}
	}
	a.Curl("POST", "/v1/nodes/a/cordon", "")
	time.Sleep(2 * time.Second)
	if _, err := b.C.CreateSandbox(ctx, api.CreateSandbox{Name: "full"}); harness.APICode(err) != api.CodeLimit || !strings.Contains(err.Error(), "a cordoned") || !strings.Contains(err.Error(), "b cordoned") {
		t.Errorf("a create with every node cordoned: %v, want limit naming them", err)
	}
	for _, n := range []string{"a", "b"} {
		var un api.Node
		doc.json(req{route: "POST /v1/nodes/{node}/uncordon", path: "/v1/nodes/" + n + "/uncordon"}, 200, &un)
		if un.Cordoned {
			t.Errorf("uncordon %s: %+v", n, un)
		}
	}

	// Node b killed: its sandboxes are unknown through a, calls to them
	// refused naming it; a's own run on.
	b.Kill()
	harness.Eventually(t, 20*time.Second, "on-b unknown through a", func() error {
		sb, err := a.C.GetSandbox(ctx, "on-b")
		if err != nil {
			return err
		}
		if sb.State != api.StateUnknown || !strings.Contains(sb.Reason, "node b stopped answering at") {
			return fmt.Errorf("on-b: %s %q", sb.State, sb.Reason)
		}
		return nil
	})
	if nd := a.nodes(t)["b"]; nd.State != api.NodeUnreachable {
		t.Errorf("b in GET /v1/nodes after its kill: %s, want unreachable", nd.State)
	}
	if _, _, _, err := a.C.Output(ctx, "on-b", "true"); harness.APICode(err) != api.CodeUnavailable || !strings.Contains(err.Error(), "node b") {
		t.Errorf("an exec in on-b while b is down: %v, want unavailable naming node b", err)
	}
	if cps, err := a.C.ListCheckpoints(ctx, "on-b"); err != nil || len(cps) != 4 {
		t.Errorf("on-b's checkpoints while b is down: %d, %v; want 4", len(cps), err)
	}
	if out := a.Run("on-a", "echo", "fine"); strings.TrimSpace(out) != "fine" {
		t.Errorf("on-a while b is down: %q", out)
	}

	// Back: it takes its sandboxes back, their state returns.
	b.Start(b.args...)
	harness.Eventually(t, 30*time.Second, "on-b back through a", func() error {
		out, _, _, err := a.C.Output(ctx, "on-b", "cat", "/home/loam/mark")
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(out)) != "hello" {
			return fmt.Errorf("mark %q", out)
		}
		return nil
	})
	if sb, err := a.C.GetSandbox(ctx, "on-b"); err != nil || sb.State != api.StateRunning {
		t.Errorf("on-b once b is back: %+v, %v", sb, err)
	}

	// Removed for good, once it is down: its sandboxes are in error.
	if code, body := a.Curl("DELETE", "/v1/nodes/b?force=true", ""); code != http.StatusConflict {
		t.Errorf("removing b while it runs: %d %s, want conflict", code, body)
	}
	b.Kill()
	harness.Eventually(t, 20*time.Second, "b unreachable", func() error {
		if st := a.nodes(t)["b"].State; st != api.NodeUnreachable {
			return fmt.Errorf("b is %s", st)
		}
		return nil
	})
	if code, body := a.Curl("DELETE", "/v1/nodes/b", ""); code != http.StatusBadRequest {
		t.Errorf("removing b without force: %d %s, want invalid", code, body)
	}
	all, err := a.C.ListSandboxes(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ofB := 0
	for _, sb := range all {
		if sb.Node == "b" {
			ofB++
		}
	}
	var removed api.NodeRemoved
	doc.json(req{route: "DELETE /v1/nodes/{node}", path: "/v1/nodes/b?force=true"}, 200, &removed)
	if removed.Sandboxes != ofB {
		t.Errorf("removing b: %+v, want its %d sandboxes marked", removed, ofB)
	}
	if sb, err := a.C.GetSandbox(ctx, "on-b"); err != nil || sb.State != api.StateError || sb.Reason != "node removed" {
		t.Errorf("on-b after b's removal: %+v, %v", sb, err)
	}
	// Node b's daemon never starts again under its name.
	if err := b.Launch(b.args...); err == nil || !strings.Contains(err.Error(), "removed") {
		t.Errorf("b started again after its removal: %v", err)
		b.Stop()
	}
	// A removed node's sandbox is its records alone: any node deletes them.
	if err := a.C.DeleteSandbox(ctx, "on-b"); err != nil {
		t.Errorf("deleting on-b of removed node b through a: %v", err)
	}
	if _, err := a.C.GetSandbox(ctx, "on-b"); harness.APICode(err) != api.CodeNotFound {
		t.Errorf("on-b after its delete: %v, want not_found", err)
	}
}

// relay passes connections to PostgreSQL's socket on, until cut: a real
// link between one node and its database that a test can drop, the
// others keeping theirs.
type relay struct {
	t      *testing.T
	dir    string // holds the relay's socket, as PostgreSQL's dir does
	target string // PostgreSQL's socket

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
}

// newRelay relays to the socket of the server that url (a pgtest URL)
// names, and returns the relay and url through it.
func newRelay(t *testing.T, dbURL string) (*relay, string) {
	t.Helper()
	u, err := neturl.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	dir, err := os.MkdirTemp("", "loam-relay-")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{t: t, dir: dir, target: filepath.Join(q.Get("host"), ".s.PGSQL.5432"), conns: map[net.Conn]bool{}}
	r.heal()
	t.Cleanup(func() { r.cut(); os.RemoveAll(dir) })
	q.Set("host", dir)
	u.RawQuery = q.Encode()
	return r, u.String()
}

// heal listens again: the node reaches its database.
func (r *relay) heal() {
	r.mu.Lock()
	defer r.mu.Unlock()
	sock := filepath.Join(r.dir, ".s.PGSQL.5432")
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		r.t.Fatal(err)
	}
	r.ln = ln
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("unix", r.target)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.conns[c], r.conns[up] = true, true
			r.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
}

// cut drops every connection through the relay and takes no more.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		c.Close()
	}
	clear(r.conns)
}

// TestClusterCutOff: a node cut off from the database while its process
// runs on stops accepting changes once its lease is gone (its API answers
// unavailable, and nothing it was asked lands), the other node shows its
// sandbox unknown; when its link returns it renews its lease, and its
// sandbox is as it was, running, and takes changes again.
func TestClusterCutOff(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	a := startNode(t, url, "a", "")
	link, viaRelay := newRelay(t, url)
	b := startNode(t, viaRelay, "b", a.Token)
	ctx := harness.Ctx(t)

	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "cut", Node: "b"}); err != nil {
		t.Fatal(err)
	}
	b.Run("cut", "sh", "-c", "echo before > /home/loam/mark")

	link.cut()
	// Through b itself: no change once its lease ran out (3 s).
	harness.Eventually(t, 20*time.Second, "b refusing changes", func() error {
		_, _, _, err := b.C.Output(ctx, "cut", "true")
		if harness.APICode(err) != api.CodeUnavailable || !strings.Contains(err.Error(), "lease") {
			return fmt.Errorf("an exec through b: %v", err)
		}
		return nil
	})
	if err := b.C.DeleteSandbox(ctx, "cut"); harness.APICode(err) != api.CodeUnavailable {
		t.Errorf("a delete through b cut off: %v, want unavailable", err)
	}
	if _, err := b.C.CreateSandbox(ctx, api.CreateSandbox{Name: "while-cut", Node: "b"}); harness.APICode(err) != api.CodeUnavailable {
		t.Errorf("a create through b cut off: %v, want unavailable", err)
	}
	// Through a: unknown, naming b; calls to it refused.
	harness.Eventually(t, 20*time.Second, "cut unknown through a", func() error {
		sb, err := a.C.GetSandbox(ctx, "cut")
		if err != nil {
			return err
		}
		if sb.State != api.StateUnknown || !strings.Contains(sb.Reason, "node b stopped answering") {
			return fmt.Errorf("%s %q", sb.State, sb.Reason)
		}
		return nil
	})
	if _, _, _, err := a.C.Output(ctx, "cut", "true"); harness.APICode(err) != api.CodeUnavailable {
		t.Errorf("an exec in cut through a while b is cut off: %v, want unavailable", err)
	}

	link.heal()
	harness.Eventually(t, 30*time.Second, "cut back through a", func() error {
		out, _, _, err := a.C.Output(ctx, "cut", "cat", "/home/loam/mark")
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(out)) != "before" {
			return fmt.Errorf("mark %q", out)
		}
		return nil
	})
	if sb, err := b.C.GetSandbox(ctx, "cut"); err != nil || sb.State != api.StateRunning {
		t.Errorf("cut once b's link is back: %+v, %v", sb, err)
	}
	if _, err := a.C.GetSandbox(ctx, "while-cut"); harness.APICode(err) != api.CodeNotFound {
		t.Errorf("the create refused while b was cut off: %v, want not_found", err)
	}
	if _, err := b.C.CreateCheckpoint(ctx, "cut", api.CreateCheckpoint{}); err != nil {
		t.Errorf("a checkpoint through b once it is back: %v", err)
	}
	if !strings.Contains(b.Log.String(), "holds its lease again") {
		t.Errorf("b's log does not say it took its lease back")
	}
}
