package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"slices"
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
	// link, for a node on a machine of its own (clusterNet), is its link
	// to the others; inside is a client of its API from inside its
	// namespace, which answers whatever its link does.
	link   *harness.Link
	inside *client.Client
}

// startNode starts node name on database url, listening on loopback, with
// the admin token given (its token file), or made by it when token is ""
// (the cluster's first).
func startNode(t testing.TB, url, name, token string, extra ...string) *clusterNode {
	t.Helper()
	return launchNode(t, url, name, token, nil, fmt.Sprintf("127.0.0.1:%d", freePort(t)), extra...)
}

// clusterNet is a test's cluster on machines of their own: each node in a
// network namespace, joined to the host by a link the test can drop
// (harness.Links), and a PostgreSQL of the test's own (which it may stop
// and crash) on the host's end of the links, reached over TCP, so that a
// dropped link cuts a node off from the database and the other nodes at
// once.
type clusterNet struct {
	links *harness.Links
	pg    *pgtest.Server
	url   string
}

func newClusterNet(t *testing.T) *clusterNet {
	t.Helper()
	links := harness.NewLinks(t)
	pg := pgtest.NewServer(t, net.JoinHostPort(links.Host().String(), "5432"))
	return &clusterNet{links: links, pg: pg, url: pg.TCPURL(pg.NewDatabase(t))}
}

// node starts node name on a machine of its own, as startNode does.
func (cn *clusterNet) node(t testing.TB, name, token string, extra ...string) *clusterNode {
	t.Helper()
	link := cn.links.Add()
	return launchNode(t, cn.url, name, token, link, net.JoinHostPort(link.Addr.String(), "7070"), extra...)
}

func launchNode(t testing.TB, url, name, token string, link *harness.Link, listen string, extra ...string) *clusterNode {
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
	n := &clusterNode{Daemon: d, name: name, link: link, args: []string{
		"--database", url, "--node", name, "--listen", listen,
		"--advertise", "http://" + listen, "--test-lease", clusterLease,
	}}
	if link != nil {
		d.Netns = link.Netns
		// Before Destroy (cleanups run last first): it deletes the
		// sandboxes through the API, over the link.
		t.Cleanup(link.Heal)
	}
	n.args = append(n.args, extra...)
	d.Start(n.args...)
	if link != nil {
		n.inside = link.Client(d.URL, d.Token)
	}
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

// TestCluster: three node daemons and a front end, each on a machine of
// its own (a network namespace), on one PostgreSQL, answer for each other.
// Through node a, the seed's story runs on a sandbox placed on node c. A
// sandbox made through node a is b's; through a it is listed, read, run in
// (exec, files, sessions, port streams), checkpointed through every node at
// once and forked (on b, which holds the checkpoint), and its URL served;
// three nodes racing for one name leave one sandbox; `loam ls` on every
// node, and the console logged in on one, see everything; a node killed
// shows its sandboxes unknown, refuses calls naming it, and takes them
// back when it restarts; a cordon keeps placements off; a node removed for
// good leaves its sandboxes in error.
func TestCluster(t *testing.T) {
	t.Parallel()
	cn := newClusterNet(t)
	a := cn.node(t, "a", "")
	b := cn.node(t, "b", a.Token)
	c := cn.node(t, "c", a.Token)
	front := cn.node(t, "front", a.Token, "--role", "api")
	ctx := harness.Ctx(t)
	// The nodes' answers, against the API's document.
	doc := &walker{t: t, d: a.Daemon, c: newConformance(t)}
	var listed api.NodeList
	doc.json(req{route: "GET /v1/nodes", path: "/v1/nodes"}, 200, &listed)

	nodes := a.nodes(t)
	if nd := nodes["front"]; nd.Role != "api" || nd.State != api.NodeReady {
		t.Errorf("the front end in GET /v1/nodes: %+v", nd)
	}
	for _, name := range []string{"a", "b", "c"} {
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
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "nowhere", Node: "zz"}); harness.APICode(err) != api.CodeInvalid {
		t.Errorf("a sandbox pinned to a node that is none: %v, want invalid", err)
	}
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "nowhere", Node: "front"}); harness.APICode(err) != api.CodeInvalid {
		t.Errorf("a sandbox pinned to the front end: %v, want invalid", err)
	}
	// The front end runs none: it places a create on a node, and passes
	// the calls for it there.
	viaFront, err := front.C.CreateSandbox(ctx, api.CreateSandbox{Name: "via-front"})
	if err != nil || (viaFront.Node != "a" && viaFront.Node != "b" && viaFront.Node != "c") {
		t.Fatalf("a create through the front end: %+v, %v; want it on a node", viaFront, err)
	}
	if out := front.Run("via-front", "echo", "through-front"); strings.TrimSpace(out) != "through-front" {
		t.Errorf("an exec through the front end: %q", out)
	}
	if err := front.C.DeleteSandbox(ctx, "via-front"); err != nil {
		t.Errorf("a delete through the front end: %v", err)
	}

	// The seed's story through a, on c.
	seedStory(t, a.Daemon, "c")
	if err := a.C.DeleteSandbox(ctx, "scratch-copy"); err != nil {
		t.Errorf("deleting the story's fork through a: %v", err)
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
		return a.Served(ctx, tok, "served-by-b")
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

	// Checkpoints of one sandbox through every node at once: unique ids,
	// in order.
	var wg sync.WaitGroup
	ids := make(chan string, 4)
	for i := range 4 {
		via := []*clusterNode{a, b, c}[i%3]
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

	// Three nodes racing for one name: one sandbox, two conflicts.
	errs := make(chan error, 3)
	for _, via := range []*clusterNode{a, b, c} {
		go func() {
			_, err := via.C.CreateSandbox(ctx, api.CreateSandbox{Name: "race"})
			errs <- err
		}()
	}
	won, lost := 0, 0
	for range 3 {
		switch err := <-errs; {
		case err == nil:
			won++
		case harness.APICode(err) == api.CodeConflict:
			lost++
		default:
			t.Errorf("a create racing for one name: %v, want success or conflict", err)
		}
	}
	if won != 1 || lost != 2 {
		t.Errorf("three creates of one name through three nodes: %d made, %d conflict; want 1 and 2", won, lost)
	}

	// `loam ls` through every node lists every node's sandboxes.
	for _, via := range []*clusterNode{a, b, c, front} {
		out, errOut, code := via.CLI("", "ls")
		for _, name := range []string{"on-a", "on-b", "fork-b", "race"} {
			if code != 0 || !strings.Contains(out, name) {
				t.Errorf("loam ls through %s: %d %q %q; want %s listed", via.name, code, out, errOut, name)
			}
		}
	}
	// The console, logged in on c, through b and c: its list has every
	// sandbox, and its calls about b's sandbox pass on with its cookie.
	consoleCalls(t, c, b, "on-b", "/home/loam/mark", "hello")

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
		if err != nil || sb.Node == "b" {
			t.Errorf("a create through b while b is cordoned: %+v, %v; want it on a or c", sb, err)
		}
	}
	a.Curl("POST", "/v1/nodes/a/cordon", "")
	a.Curl("POST", "/v1/nodes/c/cordon", "")
	time.Sleep(2 * time.Second)
	if _, err := b.C.CreateSandbox(ctx, api.CreateSandbox{Name: "full"}); harness.APICode(err) != api.CodeLimit ||
		!strings.Contains(err.Error(), "a cordoned") || !strings.Contains(err.Error(), "b cordoned") || !strings.Contains(err.Error(), "c cordoned") {
		t.Errorf("a create with every node cordoned: %v, want limit naming them", err)
	}
	for _, n := range []string{"a", "b", "c"} {
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

// consoleCalls logs in to the console on node login, then makes the
// calls its page makes with the session's cookie: the list through node
// via has every sandbox; sandbox sb's file path, read through login (sb
// being another node's), holds want.
func consoleCalls(t *testing.T, login, via *clusterNode, sb, path, want string) {
	t.Helper()
	res, err := http.Post(login.URL+"/console/login", "application/json", strings.NewReader(`{"token":"`+login.Token+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		CSRF string `json:"csrf_token"`
	}
	err = json.NewDecoder(res.Body).Decode(&info)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || err != nil || len(res.Cookies()) != 1 {
		t.Fatalf("console login on %s: %d %v %v", login.name, res.StatusCode, err, res.Cookies())
	}
	cookie := res.Cookies()[0]
	call := func(n *clusterNode, path string) (int, string) {
		return consoleCall(t, n.Daemon, cookie, info.CSRF, "GET", path, "")
	}
	code, body := call(via, "/v1/sandboxes")
	var list api.SandboxList
	if code != http.StatusOK || json.Unmarshal([]byte(body), &list) != nil {
		t.Fatalf("the console's list through %s, logged in on %s: %d %s", via.name, login.name, code, body)
	}
	all, err := login.C.ListSandboxes(harness.Ctx(t), client.ListOptions{})
	if err != nil || len(list.Sandboxes) != len(all) {
		t.Errorf("the console's list through %s: %d sandboxes; the API's: %d (%v)", via.name, len(list.Sandboxes), len(all), err)
	}
	code, body = call(login, "/v1/sandboxes/"+sb+"/files/content?"+neturl.Values{"path": {path}}.Encode())
	if code != http.StatusOK || strings.TrimSpace(body) != want {
		t.Errorf("the console reading %s of %s through %s: %d %q, want %q", path, sb, login.name, code, body, want)
	}
}

// TestClusterCutOff: a node whose link is dropped while its process runs
// on (cut off from the database and the other nodes at once) stops
// accepting changes once its lease is gone: its own API, reached from
// inside its machine, answers unavailable, a read that needs the database
// answers unavailable in seconds rather than hanging, and nothing it was
// asked lands; the other node shows its sandbox unknown and refuses calls
// to it, naming it. When its link returns it renews its lease, its sandbox
// is as it was, running, and takes changes again.
func TestClusterCutOff(t *testing.T) {
	t.Parallel()
	cn := newClusterNet(t)
	a := cn.node(t, "a", "")
	b := cn.node(t, "b", a.Token)
	ctx := harness.Ctx(t)

	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "cut", Node: "b"}); err != nil {
		t.Fatal(err)
	}
	a.Run("cut", "sh", "-c", "echo before > /home/loam/mark")

	b.link.Cut()
	// Through b itself, from inside its machine: no change once its
	// lease ran out (3 s).
	harness.Eventually(t, 40*time.Second, "b refusing changes", func() error {
		// Each try bounded: one made before the lease ran out reads the
		// database, whose connections hang until their own timeouts.
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, _, _, err := b.inside.Output(ctx, "cut", "sh", "-c", "echo during > /home/loam/mark")
		if harness.APICode(err) != api.CodeUnavailable || !strings.Contains(err.Error(), "lease") {
			return fmt.Errorf("an exec through b: %v", err)
		}
		return nil
	})
	if err := b.inside.DeleteSandbox(ctx, "cut"); harness.APICode(err) != api.CodeUnavailable {
		t.Errorf("a delete through b cut off: %v, want unavailable", err)
	}
	if _, err := b.inside.CreateSandbox(ctx, api.CreateSandbox{Name: "while-cut", Node: "b"}); harness.APICode(err) != api.CodeUnavailable {
		t.Errorf("a create through b cut off: %v, want unavailable", err)
	}
	if _, err := b.inside.CreateCheckpoint(ctx, "cut", api.CreateCheckpoint{}); harness.APICode(err) != api.CodeUnavailable {
		t.Errorf("a checkpoint through b cut off: %v, want unavailable", err)
	}
	// A read needs the database, which is silent: it fails, in seconds.
	start := time.Now()
	if _, err := b.inside.ListSandboxes(ctx, client.ListOptions{}); harness.APICode(err) != api.CodeUnavailable {
		t.Errorf("a list through b cut off: %v, want unavailable", err)
	}
	took := time.Since(start)
	if took > 30*time.Second {
		t.Errorf("a list through b cut off took %v to answer", took)
	}
	t.Logf("a list through b cut off answered unavailable in %v", took.Round(time.Millisecond))
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
	// Bounded: a call passed to b, cut off, would hang (it must not be).
	cutCtx, cancelCut := context.WithTimeout(ctx, 30*time.Second)
	defer cancelCut()
	if _, _, _, err := a.C.Output(cutCtx, "cut", "true"); harness.APICode(err) != api.CodeUnavailable || !strings.Contains(err.Error(), "node b") {
		t.Errorf("an exec in cut through a while b is cut off: %v, want unavailable naming node b", err)
	}
	if err := a.C.DeleteSandbox(ctx, "cut"); harness.APICode(err) != api.CodeUnavailable {
		t.Errorf("a delete of cut through a while b is cut off: %v, want unavailable", err)
	}

	b.link.Heal()
	harness.Eventually(t, 60*time.Second, "cut back through a", func() error {
		out, _, _, err := a.C.Output(ctx, "cut", "cat", "/home/loam/mark")
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(out)) != "before" {
			return fmt.Errorf("mark %q, want what was there before the cut", out)
		}
		return nil
	})
	if sb, err := b.C.GetSandbox(ctx, "cut"); err != nil || sb.State != api.StateRunning {
		t.Errorf("cut once b's link is back: %+v, %v", sb, err)
	}
	if _, err := a.C.GetSandbox(ctx, "while-cut"); harness.APICode(err) != api.CodeNotFound {
		t.Errorf("the create refused while b was cut off: %v, want not_found", err)
	}
	if cps, err := a.C.ListCheckpoints(ctx, "cut"); err != nil || len(cps) != 0 {
		t.Errorf("cut's checkpoints once b is back: %+v, %v; want none (the one asked for was refused)", cps, err)
	}
	if _, err := b.C.CreateCheckpoint(ctx, "cut", api.CreateCheckpoint{}); err != nil {
		t.Errorf("a checkpoint through b once it is back: %v", err)
	}
	if !strings.Contains(b.Log.String(), "holds its lease again") {
		t.Errorf("b's log does not say it took its lease back")
	}
}

// TestClusterDatabaseRestart: PostgreSQL crashed (an immediate shutdown,
// its WAL replayed at the next start) and started again while clients
// create, checkpoint and delete sandboxes through two nodes: calls fail
// with unavailable while it is away, running sandboxes keep running, the
// nodes work again once it is back, and every create, checkpoint and
// delete acknowledged before, during or after is there (or gone) after.
func TestClusterDatabaseRestart(t *testing.T) {
	t.Parallel()
	cn := newClusterNet(t)
	a := cn.node(t, "a", "")
	b := cn.node(t, "b", a.Token)
	ctx := harness.Ctx(t)
	for _, n := range []*clusterNode{a, b} {
		if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "keep-" + n.name, Node: n.name}); err != nil {
			t.Fatal(err)
		}
	}

	// What the clients were told: sandboxes made and deleted, and the
	// checkpoints taken, by sandbox.
	var mu sync.Mutex
	made, deleted, refused := map[string]bool{}, map[string]bool{}, 0
	// A delete not acknowledged may have been done, or half done: the
	// sandbox gone, or left "deleting", which a delete again finishes.
	tried := map[string]bool{}
	cps := map[string][]string{}
	unexpected := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if harness.APICode(err) == api.CodeUnavailable {
			refused++
			return
		}
		t.Errorf("%s: %v, want success or unavailable", what, err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w, via := range []*clusterNode{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			no := false
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("load-%d-%d", w, i)
				if _, err := via.C.CreateSandbox(ctx, api.CreateSandbox{Name: name}); err != nil {
					unexpected("a create through "+via.name, err)
					time.Sleep(200 * time.Millisecond)
					continue
				}
				mu.Lock()
				made[name] = true
				mu.Unlock()
				if cp, err := via.C.CreateCheckpoint(ctx, name, api.CreateCheckpoint{Memory: &no}); err != nil {
					unexpected("a checkpoint through "+via.name, err)
				} else {
					mu.Lock()
					cps[name] = append(cps[name], cp.ID)
					mu.Unlock()
				}
				if i%2 == 1 {
					if err := via.C.DeleteSandbox(ctx, name); err != nil {
						unexpected("a delete through "+via.name, err)
						mu.Lock()
						tried[name] = true
						mu.Unlock()
					} else {
						mu.Lock()
						deleted[name] = true
						mu.Unlock()
					}
				}
			}
		}()
	}
	time.Sleep(4 * time.Second)
	if err := cn.pg.Crash(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := cn.pg.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("acknowledged: %d creates, %d deletes, %d checkpoints; %d calls refused unavailable", len(made), len(deleted), len(cps), refused)

	// The nodes take changes again.
	for _, n := range []*clusterNode{a, b} {
		harness.Eventually(t, 30*time.Second, "node "+n.name+" taking changes", func() error {
			_, _, _, err := n.C.Output(ctx, "keep-"+n.name, "true")
			return err
		})
	}
	for name := range tried {
		if err := a.C.DeleteSandbox(ctx, name); err != nil && harness.APICode(err) != api.CodeNotFound {
			t.Errorf("deleting %s again, whose delete was refused during the restart: %v", name, err)
		}
		deleted[name] = true
	}
	all, err := a.C.ListSandboxes(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]api.Sandbox{}
	for _, sb := range all {
		listed[sb.Name] = sb
	}
	for name := range made {
		sb, ok := listed[name]
		switch {
		case deleted[name] && ok:
			t.Errorf("%s, whose delete was acknowledged, is there: %s", name, sb.State)
		case !deleted[name] && !ok:
			t.Errorf("%s, whose create was acknowledged, is gone", name)
		case !deleted[name] && sb.State != api.StateRunning:
			t.Errorf("%s after the restart: %s %q, want running", name, sb.State, sb.Reason)
		}
		if deleted[name] || !ok {
			continue
		}
		list, err := a.C.ListCheckpoints(ctx, name)
		if err != nil {
			t.Errorf("the checkpoints of %s: %v", name, err)
			continue
		}
		for _, id := range cps[name] {
			if !slices.ContainsFunc(list, func(cp api.Checkpoint) bool { return cp.ID == id }) {
				t.Errorf("checkpoint %s of %s, acknowledged, is gone", id, name)
			}
		}
	}
	if len(made) == 0 {
		t.Error("no create was acknowledged: the load never ran")
	}
	for _, n := range []*clusterNode{a, b} {
		if out := a.Run("keep-"+n.name, "echo", "still"); strings.TrimSpace(out) != "still" {
			t.Errorf("keep-%s after the restart: %q", n.name, out)
		}
	}
}
