package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/image/imagetest"
	"loam.dev/loam/internal/server"
	"loam.dev/loam/test/harness"
)

// walker sends a conformance walk's requests to a daemon and checks every
// answer against the document.
type walker struct {
	t *testing.T
	d *harness.Daemon
	c *conformance
}

// req is one request of a walk: route is the documented route it is an
// instance of, path the path (and query) sent.
type req struct {
	route, path string
	body        string
	ctype       string // Content-Type of body; JSON when empty
	noAuth      bool
}

// call sends r, checks the answer against the document and that its
// status is want, and returns the body.
func (w *walker) call(r req, want int) []byte {
	w.t.Helper()
	method, pattern, _ := strings.Cut(r.route, " ")
	urlPath, _, _ := strings.Cut(r.path, "?")
	if !matches(pattern, urlPath) {
		w.t.Fatalf("%s is not an instance of %s", r.path, r.route)
	}
	hr, err := http.NewRequest(method, w.d.URL+r.path, strings.NewReader(r.body))
	if err != nil {
		w.t.Fatal(err)
	}
	if !r.noAuth {
		hr.Header.Set("Authorization", "Bearer "+w.d.Token)
	}
	if r.body != "" {
		ct := r.ctype
		if ct == "" {
			ct = "application/json"
		}
		hr.Header.Set("Content-Type", ct)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		w.t.Fatalf("%s %s: %v", method, r.path, err)
	}
	body := readBody(w.t, resp)
	if resp.StatusCode != want {
		w.t.Errorf("%s %s: status %d, want %d (body %.300q)", method, r.path, resp.StatusCode, want, body)
	}
	w.c.answer(w.t, r.route, resp, body)
	return body
}

// json is call, decoding the answer into v.
func (w *walker) json(r req, want int, v any) {
	w.t.Helper()
	b := w.call(r, want)
	if err := json.Unmarshal(b, v); err != nil {
		w.t.Fatalf("%s: decoding %q: %v", r.path, b, err)
	}
}

// errorCode is call for an answer that must be an error of code.
func (w *walker) errorCode(r req, code api.Code) {
	w.t.Helper()
	var eb api.ErrorBody
	w.json(r, code.HTTPStatus(), &eb)
	if eb.Error == nil || eb.Error.Code != code {
		w.t.Errorf("%s %s: error %+v, want code %s", r.route, r.path, eb.Error, code)
	}
}

// dial opens the WebSocket of route at path, checking the 101 against the
// document.
func (w *walker) dial(ctx context.Context, route, path string) *websocket.Conn {
	w.t.Helper()
	_, pattern, _ := strings.Cut(route, " ")
	urlPath, _, _ := strings.Cut(path, "?")
	if !matches(pattern, urlPath) {
		w.t.Fatalf("%s is not an instance of %s", path, route)
	}
	conn, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(w.d.URL, "http")+path, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + w.d.Token}},
	})
	if err != nil {
		var body []byte
		if resp != nil {
			body, _ = io.ReadAll(resp.Body)
		}
		w.t.Fatalf("dialing %s: %v (%.300q)", path, err, body)
	}
	w.c.answer(w.t, route, resp, nil)
	conn.SetReadLimit(1 << 20)
	return conn
}

// frame is one WebSocket message.
type frame struct {
	typ  websocket.MessageType
	data []byte
}

// frames reads conn's messages until it closes and returns them with the
// close status, checking each text message against schema ("" for a
// socket that has no text messages).
func (w *walker) frames(ctx context.Context, conn *websocket.Conn, schema string) ([]frame, []map[string]any, websocket.StatusCode) {
	w.t.Helper()
	var fs []frame
	var texts []map[string]any
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			return fs, texts, websocket.CloseStatus(err)
		}
		fs = append(fs, frame{typ, data})
		if typ == websocket.MessageText && schema != "" {
			texts = append(texts, w.c.message(w.t, schema, data))
		}
	}
}

// output joins the data of a stream's binary frames.
func output(fs []frame, stream byte) string {
	var b strings.Builder
	for _, f := range fs {
		if f.typ == websocket.MessageBinary && len(f.data) > 0 && f.data[0] == stream {
			b.Write(f.data[1:])
		}
	}
	return b.String()
}

// TestOpenAPIConformance walks every route of the daemon's API on a real
// daemon with real sandboxes, successes and errors, and checks every answer
// and every WebSocket message against api/openapi.yaml. It fails on a route
// the server has and the document lacks, on a route no walk reached, and on
// a documented field no answer held.
func TestOpenAPIConformance(t *testing.T) {
	t.Parallel()
	// A reserve no host has: warm pools say why they hold back (held).
	d := harness.StartDaemon(t, "--pool-reserve-mib", "100000000")
	ctx := harness.Ctx(t)
	w := &walker{t: t, d: d, c: newConformance(t)}

	t.Run("daemon", func(t *testing.T) { w.t = t; walkDaemon(w) })
	t.Run("sandboxes", func(t *testing.T) { w.t = t; walkSandboxes(w) })
	t.Run("exec", func(t *testing.T) { w.t = t; walkExec(ctx, w) })
	t.Run("sessions", func(t *testing.T) { w.t = t; walkSessions(ctx, w) })
	t.Run("services", func(t *testing.T) { w.t = t; walkServices(ctx, w) })
	t.Run("files", func(t *testing.T) { w.t = t; walkFiles(ctx, w) })
	t.Run("ports", func(t *testing.T) { w.t = t; walkPorts(ctx, w) })
	t.Run("checkpoints", func(t *testing.T) { w.t = t; walkCheckpoints(ctx, w) })
	t.Run("images", func(t *testing.T) { w.t = t; walkImages(w) })
	t.Run("templates", func(t *testing.T) { w.t = t; walkTemplates(w) })
	t.Run("keys", func(t *testing.T) { w.t = t; walkKeys(w) })
	t.Run("orgs", func(t *testing.T) { w.t = t; walkOrgs(w) })
	t.Run("nodes", func(t *testing.T) { w.t = t; walkNodes(w) })
	t.Run("cleanup", func(t *testing.T) { w.t = t; walkCleanup(w) })
	t.Run("unauthorized", func(t *testing.T) { w.t = t; walkUnauthorized(w) })
	w.c.finish(t)
}

// walkKeys makes a key with labels and an expiry, uses it, lists the
// keys, reads the audit log with its filters, and revokes the key.
func walkKeys(w *walker) {
	var k api.Key
	w.json(req{route: "POST /v1/keys", path: "/v1/keys", body: `{"name":"walk","scope":"read","expires_in":"1h","labels":{"owner":"walk"}}`}, 201, &k)
	if k.Secret == "" || k.ExpiresAt == nil {
		w.t.Fatalf("POST /v1/keys: %+v", k)
	}
	w.errorCode(req{route: "POST /v1/keys", path: "/v1/keys", body: `{"name":"walk","scope":"root"}`}, api.CodeInvalid)
	hr, _ := http.NewRequest("GET", w.d.URL+"/v1/sandboxes", nil)
	hr.Header.Set("Authorization", "Bearer "+k.Secret)
	if resp, err := http.DefaultClient.Do(hr); err != nil || resp.StatusCode != 200 {
		w.t.Fatalf("a call with the new key: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	var list api.KeyList
	w.json(req{route: "GET /v1/keys", path: "/v1/keys"}, 200, &list)
	if len(list.Keys) == 0 || list.Keys[len(list.Keys)-1].LastUsedAt == nil {
		w.t.Errorf("GET /v1/keys: %+v, want the key with its last use", list)
	}
	var log api.AuditList
	w.json(req{route: "GET /v1/audit", path: "/v1/audit?since=1h&since_seq=0&action=key.create&org=default&limit=10"}, 200, &log)
	if len(log.Events) == 0 || log.Events[0].Action != "key.create" {
		w.t.Errorf("GET /v1/audit: %+v, want the key's creation", log)
	}
	w.errorCode(req{route: "GET /v1/audit", path: "/v1/audit?since=yesterday"}, api.CodeInvalid)
	w.call(req{route: "DELETE /v1/keys/{key}", path: "/v1/keys/" + k.ID}, 204)
	w.errorCode(req{route: "DELETE /v1/keys/{key}", path: "/v1/keys/" + k.ID}, api.CodeNotFound)
}

// walkOrgs reads the caller's org and the operator's list, and sets the
// quota with every field, then none.
func walkOrgs(w *walker) {
	var o api.Org
	w.json(req{route: "GET /v1/org", path: "/v1/org"}, 200, &o)
	if o.Name != "default" {
		w.t.Errorf("GET /v1/org: %+v, want the default org", o)
	}
	w.call(req{route: "GET /v1/orgs", path: "/v1/orgs"}, 200)
	quota := req{route: "PUT /v1/orgs/{org}/quota", path: "/v1/orgs/default/quota"}
	quota.body = `{"sandboxes":100,"memory_mib":1048576,"cpus":64,"disk_mib":1048576,"checkpoints":1000,"pool_members":100}`
	w.json(quota, 200, &o)
	if o.Quota.Sandboxes == nil || *o.Quota.Sandboxes != 100 {
		w.t.Errorf("PUT quota: %+v", o)
	}
	quota.body = `{"sandboxes":-1}`
	w.errorCode(quota, api.CodeInvalid)
	quota.body = `{}`
	w.call(quota, 200)
	w.errorCode(req{route: "PUT /v1/orgs/{org}/quota", path: "/v1/orgs/nosuch/quota", body: `{}`}, api.CodeNotFound)

	create := req{route: "POST /v1/orgs", path: "/v1/orgs", body: `{"name":"walk"}`}
	w.json(create, 201, &o)
	if o.Name != "walk" {
		w.t.Errorf("POST /v1/orgs: %+v", o)
	}
	w.errorCode(create, api.CodeConflict)
	w.errorCode(req{route: "POST /v1/orgs", path: "/v1/orgs", body: `{"name":"Walk--Org"}`}, api.CodeInvalid)
	var k api.Key
	w.json(req{route: "POST /v1/orgs/{org}/keys", path: "/v1/orgs/walk/keys", body: `{"name":"walk-admin","scope":"admin"}`}, 201, &k)
	if k.Org != "walk" || k.Secret == "" {
		w.t.Errorf("POST /v1/orgs/walk/keys: %+v", k)
	}
	w.errorCode(req{route: "POST /v1/orgs/{org}/keys", path: "/v1/orgs/nosuch/keys", body: `{"name":"x"}`}, api.CodeNotFound)
	w.errorCode(req{route: "DELETE /v1/orgs/{org}", path: "/v1/orgs/default"}, api.CodeConflict)
	w.errorCode(req{route: "DELETE /v1/orgs/{org}", path: "/v1/orgs/walk?all=maybe"}, api.CodeInvalid)
	w.call(req{route: "DELETE /v1/orgs/{org}", path: "/v1/orgs/walk?all=true"}, 204)
	w.errorCode(req{route: "DELETE /v1/orgs/{org}", path: "/v1/orgs/walk"}, api.CodeNotFound)
}

// walkNodes calls the nodes' routes of a daemon that runs alone: an
// empty list, and every change refused as invalid. A cluster's answers
// (the nodes, a sandbox's node) are TestCluster's, a template's node
// TestClusterTemplates'.
func walkNodes(w *walker) {
	var list api.NodeList
	w.json(req{route: "GET /v1/nodes", path: "/v1/nodes"}, 200, &list)
	if list.Nodes == nil || len(list.Nodes) != 0 {
		w.t.Errorf("GET /v1/nodes alone: %+v, want an empty list", list)
	}
	w.errorCode(req{route: "POST /v1/nodes/{node}/cordon", path: "/v1/nodes/node-2/cordon"}, api.CodeInvalid)
	w.errorCode(req{route: "POST /v1/nodes/{node}/uncordon", path: "/v1/nodes/node-2/uncordon"}, api.CodeInvalid)
	w.errorCode(req{route: "DELETE /v1/nodes/{node}", path: "/v1/nodes/node-2?force=true"}, api.CodeInvalid)
	w.errorCode(req{route: "POST /v1/nodes/{node}/drain", path: "/v1/nodes/node-2/drain"}, api.CodeInvalid)
	w.errorCode(req{route: "POST /v1/sandboxes/{sandbox}/move", path: "/v1/sandboxes/scratch/move", body: `{"to":"node-2"}`}, api.CodeInvalid)
	// Seen in TestCluster and TestClusterTemplates (no daemon alone has
	// them), in TestObjectsCheckpoints (a daemon with --objects), and in
	// TestClusterMove (moves and drains).
	w.c.clusterOnly([]string{"Sandbox.node", "Template.node", "Checkpoint.storage", "CheckpointStorage.state",
		"DrainResult.node", "DrainResult.moved", "DrainResult.failed", "MovedSandbox.name", "MovedSandbox.id", "MovedSandbox.to", "MovedSandbox.ms",
		"MoveFailure.name", "MoveFailure.id", "MoveFailure.error"},
		[]string{"POST /v1/nodes/{node}/cordon", "POST /v1/nodes/{node}/uncordon", "DELETE /v1/nodes/{node}",
			"POST /v1/nodes/{node}/drain", "POST /v1/sandboxes/{sandbox}/move"})
}

func walkDaemon(w *walker) {
	w.call(req{route: "GET /healthz", path: "/healthz", noAuth: true}, 200)
	doc := w.call(req{route: "GET /v1/openapi.yaml", path: "/v1/openapi.yaml", noAuth: true}, 200)
	if !bytes.Equal(doc, api.OpenAPI) {
		w.t.Errorf("GET /v1/openapi.yaml is not the embedded document")
	}
	var tl api.TemplateList
	w.json(req{route: "GET /v1/templates", path: "/v1/templates"}, 200, &tl)
	if len(tl.Templates) == 0 {
		w.t.Errorf("no templates")
	}
	w.call(req{route: "PUT /v1/secrets/{name}", path: "/v1/secrets/api-key", body: `{"value":"s3cret"}`}, 200)
	w.errorCode(req{route: "PUT /v1/secrets/{name}", path: "/v1/secrets/api-key", body: `{"value":1}`}, api.CodeInvalid)
	w.call(req{route: "GET /v1/secrets", path: "/v1/secrets"}, 200)
	// Any path answers a method it does not serve with 405 and Allow.
	hr, _ := http.NewRequest("PATCH", w.d.URL+"/v1/sandboxes", nil)
	hr.Header.Set("Authorization", "Bearer "+w.d.Token)
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		w.t.Fatal(err)
	}
	w.c.methodNotAllowed(w.t, resp, readBody(w.t, resp))
}

// scratchJSON creates the walk's sandbox with every field a create takes,
// so that its answers hold every field a sandbox can show.
const scratchJSON = `{"name":"scratch","template":"base","env":{"GREETING":"hi"},"labels":{"owner":"docs"},
	"idle":"10m","http_port":8080,"resources":{"cpus":1,"memory_mib":512,"disk_mib":2048},
	"secrets":{"API_KEY":"api-key"},"secret_files":{"/home/loam/.api-key":"api-key"},
	"network":{"egress":"all","allow":[],"deny":["192.0.2.0/24"]},
	"services":[{"name":"web","cmd":["python3","-m","http.server","8080"],"env":{"PYTHONUNBUFFERED":"1"},"dir":".","user":"loam","restart":"always"}]}`

func walkSandboxes(w *walker) {
	var sb api.Sandbox
	w.json(req{route: "POST /v1/sandboxes", path: "/v1/sandboxes", body: scratchJSON}, 201, &sb)
	if sb.Name != "scratch" || sb.State != api.StateRunning {
		w.t.Fatalf("created %+v", sb)
	}
	w.errorCode(req{route: "POST /v1/sandboxes", path: "/v1/sandboxes", body: `{"name":"scratch","template":"base"}`}, api.CodeConflict)
	w.errorCode(req{route: "POST /v1/sandboxes", path: "/v1/sandboxes", body: `{"bogus":1}`}, api.CodeInvalid)
	w.errorCode(req{route: "POST /v1/sandboxes", path: "/v1/sandboxes", body: `{"from":{"sandbox":"nope","checkpoint":"v1"}}`}, api.CodeNotFound)
	var list api.SandboxList
	w.json(req{route: "GET /v1/sandboxes", path: "/v1/sandboxes?label=owner=docs"}, 200, &list)
	if len(list.Sandboxes) != 1 {
		w.t.Errorf("label filter found %d sandboxes, want 1", len(list.Sandboxes))
	}
	w.errorCode(req{route: "GET /v1/sandboxes", path: "/v1/sandboxes?label=nokey"}, api.CodeInvalid)
	w.call(req{route: "GET /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/scratch"}, 200)
	w.errorCode(req{route: "GET /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/nope"}, api.CodeNotFound)
	w.call(req{route: "PATCH /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/scratch",
		body: `{"labels":{"owner":"docs","team":"core"},"idle":"0","http_port":8080,"public":false,"recover":"latest-checkpoint"}`}, 200)
	w.errorCode(req{route: "PATCH /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/scratch", body: `{"recover":"sometimes"}`}, api.CodeInvalid)
	w.errorCode(req{route: "PATCH /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/scratch", body: `{}`}, api.CodeInvalid)
	w.errorCode(req{route: "PATCH /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/scratch", body: `{"idle":"soon"}`}, api.CodeInvalid)
	w.errorCode(req{route: "PATCH /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/nope", body: `{"public":true}`}, api.CodeNotFound)
	w.call(req{route: "GET /v1/sandboxes/{sandbox}/access-token", path: "/v1/sandboxes/scratch/access-token"}, 200)
	w.errorCode(req{route: "GET /v1/sandboxes/{sandbox}/access-token", path: "/v1/sandboxes/nope/access-token"}, api.CodeNotFound)
	w.call(req{route: "PUT /v1/sandboxes/{sandbox}/network", path: "/v1/sandboxes/scratch/network",
		body: `{"egress":"all","allow":["192.0.2.7"],"deny":["192.0.2.0/24"]}`}, 200)
	w.errorCode(req{route: "PUT /v1/sandboxes/{sandbox}/network", path: "/v1/sandboxes/scratch/network", body: `{"egress":"some"}`}, api.CodeInvalid)
}

func walkExec(ctx context.Context, w *walker) {
	const route = "GET /v1/sandboxes/{sandbox}/exec"
	conn := w.dial(ctx, route, "/v1/sandboxes/scratch/exec")
	defer conn.CloseNow()
	writeJSON(ctx, w.t, conn, api.ExecRequest{Cmd: []string{"sh", "-c", "cat; echo err >&2; exit 3"}, Stdin: true})
	if err := conn.Write(ctx, websocket.MessageBinary, append([]byte{api.StreamStdin}, "in\n"...)); err != nil {
		w.t.Fatal(err)
	}
	writeJSON(ctx, w.t, conn, api.ExecControl{Type: api.ExecEOF})
	fs, texts, status := w.frames(ctx, conn, "ExecServerControl")
	if status != websocket.StatusNormalClosure || len(texts) < 2 || texts[0]["type"] != "started" || texts[len(texts)-1]["type"] != "exit" ||
		texts[len(texts)-1]["exit_code"] != 3.0 || output(fs, api.StreamStdout) != "in\n" || output(fs, api.StreamStderr) != "err\n" {
		w.t.Errorf("exec: status %d, control %v, stdout %q, stderr %q", status, texts, output(fs, 1), output(fs, 2))
	}

	// A request that cannot run gets one "error" message and a normal close.
	conn = w.dial(ctx, route, "/v1/sandboxes/scratch/exec")
	defer conn.CloseNow()
	writeJSON(ctx, w.t, conn, map[string]any{"cmd": []string{}})
	_, texts, status = w.frames(ctx, conn, "ExecServerControl")
	if status != websocket.StatusNormalClosure || len(texts) != 1 || texts[0]["type"] != "error" {
		w.t.Errorf("exec without cmd: status %d, control %v", status, texts)
	}
	w.errorCode(req{route: route, path: "/v1/sandboxes/scratch/exec"}, api.CodeUpgradeRequired)
	w.errorCode(req{route: route, path: "/v1/sandboxes/nope/exec"}, api.CodeNotFound)
}

func writeJSON(ctx context.Context, t *testing.T, conn *websocket.Conn, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
}

func walkSessions(ctx context.Context, w *walker) {
	const base = "/v1/sandboxes/scratch/sessions"
	// 200000 bytes through a 65536-byte buffer: an attach from 0 is told
	// what was dropped.
	var ss api.Session
	w.json(req{route: "POST /v1/sandboxes/{sandbox}/sessions", path: base,
		body: `{"cmd":["sh","-c","head -c 200000 /dev/zero | tr '\\0' x; echo done >&2; exec sleep 600"],"detachable":true,"buffer_size":65536}`}, 201, &ss)
	w.errorCode(req{route: "POST /v1/sandboxes/{sandbox}/sessions", path: base, body: `{"cmd":[]}`}, api.CodeInvalid)
	attach := "GET /v1/sandboxes/{sandbox}/sessions/{session}/attach"
	var texts []map[string]any
	harness.Eventually(w.t, 10*time.Second, "the session writes \"done\"", func() error {
		conn := w.dial(ctx, attach, base+"/"+ss.ID+"/attach?offset=0&follow=false")
		fs, tx, status := w.frames(ctx, conn, "ExecServerControl")
		if status != websocket.StatusNormalClosure {
			w.t.Fatalf("attach with follow=false: close %d", status)
		}
		texts = tx
		if output(fs, api.StreamStderr) != "done\n" {
			return fmt.Errorf("%v", tx)
		}
		return nil
	})
	dropped := false
	for _, m := range texts {
		dropped = dropped || m["type"] == "offset" && m["stream"] == 1.0 && m["dropped"] != nil
	}
	if !dropped || texts[0]["type"] != "started" {
		w.t.Errorf("attach from 0 after the buffer wrapped: %v, want started then an offset with dropped", texts)
	}
	w.errorCode(req{route: attach, path: base + "/" + ss.ID + "/attach?offset=-1"}, api.CodeInvalid)
	w.errorCode(req{route: attach, path: base + "/" + ss.ID + "/attach"}, api.CodeUpgradeRequired)
	w.errorCode(req{route: attach, path: base + "/s-nope/attach"}, api.CodeNotFound)

	sess := "/v1/sandboxes/{sandbox}/sessions/{session}"
	w.errorCode(req{route: "POST " + sess + "/signal", path: base + "/" + ss.ID + "/signal", body: `{"signal":15}`}, api.CodeInvalid)
	w.call(req{route: "POST " + sess + "/signal", path: base + "/" + ss.ID + "/signal", body: `{"signal":"TERM"}`}, 204)
	w.json(req{route: "POST " + sess + "/wait", path: base + "/" + ss.ID + "/wait"}, 200, &ss)
	if ss.State != api.SessionExited || ss.ExitCode == nil || ss.ExitedAt == nil {
		w.t.Errorf("waited for %+v", ss)
	}
	w.call(req{route: "GET " + sess, path: base + "/" + ss.ID}, 200)
	w.call(req{route: "GET /v1/sandboxes/{sandbox}/sessions", path: base}, 200)
	// An exited session's attach ends with "exit".
	conn := w.dial(ctx, attach, base+"/"+ss.ID+"/attach?follow=false")
	_, texts, status := w.frames(ctx, conn, "ExecServerControl")
	if status != websocket.StatusNormalClosure || len(texts) == 0 || texts[len(texts)-1]["type"] != "exit" {
		w.t.Errorf("attach to an exited session: close %d, control %v", status, texts)
	}
	w.call(req{route: "DELETE " + sess, path: base + "/" + ss.ID}, 204)
	w.errorCode(req{route: "GET " + sess, path: base + "/" + ss.ID}, api.CodeNotFound)
	// Deleting a running session kills it.
	var sleeper api.Session
	w.json(req{route: "POST /v1/sandboxes/{sandbox}/sessions", path: base, body: `{"cmd":["sleep","600"],"detachable":true}`}, 201, &sleeper)
	w.call(req{route: "DELETE " + sess, path: base + "/" + sleeper.ID}, 204)
	w.errorCode(req{route: "DELETE " + sess, path: base + "/" + sleeper.ID}, api.CodeNotFound)
	w.errorCode(req{route: "POST " + sess + "/wait", path: base + "/s-nope/wait"}, api.CodeNotFound)
}

func walkServices(ctx context.Context, w *walker) {
	const base = "/v1/sandboxes/scratch/services"
	svc := "/v1/sandboxes/{sandbox}/services/{service}"
	body := `{"cmd":["sh","-c","echo hello; echo oops >&2; exec sleep 600"]}`
	w.call(req{route: "PUT " + svc, path: base + "/logger", body: body}, 201)
	w.call(req{route: "PUT " + svc, path: base + "/logger", body: body}, 200)
	w.errorCode(req{route: "PUT " + svc, path: base + "/Logger", body: body}, api.CodeInvalid)
	w.errorCode(req{route: "PUT " + svc, path: base + "/logger", body: `{"name":"other","cmd":["true"]}`}, api.CodeInvalid)
	// A service that exits, and one that cannot start, show how they ended.
	w.call(req{route: "PUT " + svc, path: base + "/failing", body: `{"cmd":["sh","-c","exit 3"],"restart":"never"}`}, 201)
	w.call(req{route: "PUT " + svc, path: base + "/missing", body: `{"cmd":["/nonexistent"],"restart":"never"}`}, 201)
	for _, name := range []string{"failing", "missing"} {
		harness.Eventually(w.t, 10*time.Second, "service "+name+" exits", func() error {
			var st api.ServiceStatus
			w.json(req{route: "GET " + svc, path: base + "/" + name}, 200, &st)
			if st.State != api.ServiceExited {
				return fmt.Errorf("%+v", st)
			}
			return nil
		})
	}
	logs := "GET " + svc + "/logs"
	harness.Eventually(w.t, 10*time.Second, "the logger's logs", func() error {
		conn := w.dial(ctx, logs, base+"/logger/logs?follow=false")
		fs, _, status := w.frames(ctx, conn, "ExecServerControl")
		if status != websocket.StatusNormalClosure {
			w.t.Fatalf("logs with follow=false: close %d", status)
		}
		// The PUT that redefined it restarted it: its output goes on
		// across restarts, so it may say hello more than once.
		if strings.HasPrefix(output(fs, api.StreamStdout), "hello\n") && strings.HasPrefix(output(fs, api.StreamStderr), "oops\n") {
			return nil
		}
		return fmt.Errorf("stdout %q, stderr %q", output(fs, 1), output(fs, 2))
	})
	w.errorCode(req{route: logs, path: base + "/logger/logs?follow=maybe"}, api.CodeInvalid)
	w.errorCode(req{route: logs, path: base + "/logger/logs"}, api.CodeUpgradeRequired)
	for _, action := range []string{"stop", "start", "restart"} {
		w.call(req{route: "POST " + svc + "/" + action, path: base + "/logger/" + action}, 200)
		w.errorCode(req{route: "POST " + svc + "/" + action, path: base + "/nope/" + action}, api.CodeNotFound)
	}
	w.call(req{route: "GET /v1/sandboxes/{sandbox}/services", path: base}, 200)
	w.call(req{route: "DELETE " + svc, path: base + "/logger"}, 204)
	w.errorCode(req{route: "GET " + svc, path: base + "/logger"}, api.CodeNotFound)
	w.errorCode(req{route: "DELETE " + svc, path: base + "/logger"}, api.CodeNotFound)
}

func walkFiles(ctx context.Context, w *walker) {
	const sb = "/v1/sandboxes/scratch"
	files := "/v1/sandboxes/{sandbox}/files"
	content := files + "/content"
	w.call(req{route: "PUT " + content, path: sb + "/files/content?path=/home/loam/notes/a.txt&mode=0600", body: "hello\n", ctype: "application/octet-stream"}, 200)
	if got := w.call(req{route: "GET " + content, path: sb + "/files/content?path=/home/loam/notes/a.txt"}, 200); string(got) != "hello\n" {
		w.t.Errorf("read back %q", got)
	}
	w.errorCode(req{route: "GET " + content, path: sb + "/files/content?path=/home/loam/nope"}, api.CodeNotFound)
	w.errorCode(req{route: "PUT " + content, path: sb + "/files/content?path=relative", body: "x", ctype: "application/octet-stream"}, api.CodeInvalid)
	w.d.Run("scratch", "ln", "-s", "a.txt", "/home/loam/notes/link")
	w.d.Run("scratch", "python3", "-c", "import os\nos.mkdir('/tmp/many')\nfor i in range(10001): open('/tmp/many/%d' % i, 'w').close()")
	var info api.FileInfo
	w.json(req{route: "GET " + files, path: sb + "/files?path=/home/loam/notes&depth=2"}, 200, &info)
	if len(info.Entries) != 2 || info.Entries[1].Target != "a.txt" {
		w.t.Errorf("listing %+v", info)
	}
	w.json(req{route: "GET " + files, path: sb + "/files?path=/tmp/many"}, 200, &info)
	if !info.Truncated {
		w.t.Errorf("a listing of 10001 entries is not truncated")
	}
	w.errorCode(req{route: "GET " + files, path: sb + "/files"}, api.CodeInvalid)
	w.errorCode(req{route: "GET " + files, path: sb + "/files?path=/home/loam&depth=99"}, api.CodeInvalid)
	w.errorCode(req{route: "GET " + files, path: sb + "/files?path=/home/loam/nope"}, api.CodeNotFound)
	w.errorCode(req{route: "GET " + files, path: sb + "/files?path=/root/x"}, api.CodeForbidden)
	w.call(req{route: "POST " + files + "/mkdir", path: sb + "/files/mkdir", body: `{"path":"/home/loam/notes/sub","mode":"0750"}`}, 200)
	w.errorCode(req{route: "POST " + files + "/mkdir", path: sb + "/files/mkdir", body: `{"path":"sub"}`}, api.CodeInvalid)
	w.call(req{route: "POST " + files + "/move", path: sb + "/files/move", body: `{"from":"/home/loam/notes/a.txt","to":"/home/loam/notes/sub/b.txt"}`}, 200)
	w.errorCode(req{route: "POST " + files + "/move", path: sb + "/files/move", body: `{"from":"/home/loam/nope","to":"/home/loam/nope2"}`}, api.CodeNotFound)
	tar := w.call(req{route: "GET " + files + "/archive", path: sb + "/files/archive?path=/home/loam/notes"}, 200)
	w.call(req{route: "PUT " + files + "/archive", path: sb + "/files/archive?path=/home/loam/copy", body: string(tar), ctype: "application/x-tar"}, 204)
	w.errorCode(req{route: "GET " + files + "/archive", path: sb + "/files/archive?path=/home/loam/nope"}, api.CodeNotFound)
	w.call(req{route: "DELETE " + files, path: sb + "/files?path=/home/loam/copy&recursive=true"}, 204)
	w.errorCode(req{route: "DELETE " + files, path: sb + "/files?path=/home/loam/copy"}, api.CodeNotFound)
	w.errorCode(req{route: "DELETE " + files, path: sb + "/files?path=/home/loam/notes&recursive=maybe"}, api.CodeInvalid)

	watch := "GET " + files + "/watch"
	conn := w.dial(ctx, watch, sb+"/files/watch?path=/home/loam/notes&recursive=true")
	defer conn.CloseNow()
	w.call(req{route: "PUT " + content, path: sb + "/files/content?path=/home/loam/notes/c.txt", body: "c", ctype: "application/octet-stream"}, 200)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	typ, data, err := conn.Read(rctx)
	if err != nil || typ != websocket.MessageText {
		w.t.Fatalf("watch: %v", err)
	}
	if ev := w.c.message(w.t, "WatchEvent", data); ev["path"] == nil {
		w.t.Errorf("watch event %s names no path", data)
	}
	conn.Close(websocket.StatusNormalClosure, "")
	w.errorCode(req{route: watch, path: sb + "/files/watch?path=/home/loam/notes"}, api.CodeUpgradeRequired)
	w.errorCode(req{route: watch, path: sb + "/files/watch?path=/home/loam/nope"}, api.CodeNotFound)
}

func walkPorts(ctx context.Context, w *walker) {
	const sb = "/v1/sandboxes/scratch"
	// The web service of the create listens on 8080.
	harness.Eventually(w.t, 10*time.Second, "port 8080 listed", func() error {
		var pl api.PortList
		w.json(req{route: "GET /v1/sandboxes/{sandbox}/ports", path: sb + "/ports"}, 200, &pl)
		if len(pl.Ports) > 0 && pl.Ports[0].Port == 8080 {
			return nil
		}
		return fmt.Errorf("ports: %+v", pl)
	})
	watch := "GET /v1/sandboxes/{sandbox}/ports/watch"
	conn := w.dial(ctx, watch, sb+"/ports/watch")
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, data, err := conn.Read(rctx)
	if err != nil {
		w.t.Fatalf("port watch: %v", err)
	}
	if ev := w.c.message(w.t, "PortEvent", data); ev["type"] != "open" || ev["port"] != 8080.0 {
		w.t.Errorf("first port event %s, want open 8080", data)
	}
	conn.Close(websocket.StatusNormalClosure, "")
	w.errorCode(req{route: watch, path: sb + "/ports/watch"}, api.CodeUpgradeRequired)
	w.errorCode(req{route: watch, path: "/v1/sandboxes/nope/ports/watch"}, api.CodeNotFound)

	stream := "GET /v1/sandboxes/{sandbox}/ports/{port}/stream"
	conn = w.dial(ctx, stream, sb+"/ports/8080/stream")
	if err := conn.Write(ctx, websocket.MessageBinary, []byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
		w.t.Fatal(err)
	}
	fs, _, status := w.frames(ctx, conn, "")
	var got bytes.Buffer
	for _, f := range fs {
		if f.typ != websocket.MessageBinary {
			w.t.Errorf("a port stream sent a text message %q", f.data)
		}
		got.Write(f.data)
	}
	if status != websocket.StatusNormalClosure || !strings.HasPrefix(got.String(), "HTTP/1.0 200") {
		w.t.Errorf("port stream: close %d, got %.100q", status, got.String())
	}
	w.errorCode(req{route: stream, path: sb + "/ports/0/stream"}, api.CodeInvalid)
	w.errorCode(req{route: stream, path: sb + "/ports/8080/stream"}, api.CodeUpgradeRequired)
	// What the sandbox refuses comes after the upgrade is asked for.
	w.dialRefused(ctx, stream, sb+"/ports/"+strconv.Itoa(agent.DefaultPort)+"/stream", api.CodeForbidden)
	w.dialRefused(ctx, stream, sb+"/ports/9/stream", api.CodeNotFound)
}

// dialRefused asks for the WebSocket of route at path, which must be
// refused before the upgrade with an error of code.
func (w *walker) dialRefused(ctx context.Context, route, path string, code api.Code) {
	w.t.Helper()
	conn, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(w.d.URL, "http")+path, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + w.d.Token}},
	})
	if err == nil {
		conn.CloseNow()
		w.t.Fatalf("%s was accepted, want %s", path, code)
	}
	if resp == nil {
		w.t.Fatalf("%s: %v", path, err)
	}
	body, _ := io.ReadAll(resp.Body)
	var eb api.ErrorBody
	if resp.StatusCode != code.HTTPStatus() || json.Unmarshal(body, &eb) != nil || eb.Error == nil || eb.Error.Code != code {
		w.t.Errorf("%s: %d %s, want %s", path, resp.StatusCode, body, code)
	}
	w.c.answer(w.t, route, resp, body)
}

// closeStatus reads conn in the background; its channel gets the status
// conn closes with.
func closeStatus(ctx context.Context, conn *websocket.Conn) <-chan websocket.StatusCode {
	ch := make(chan websocket.StatusCode, 1)
	go func() {
		for {
			if _, _, err := conn.Read(ctx); err != nil {
				ch <- websocket.CloseStatus(err)
				return
			}
		}
	}()
	return ch
}

var seedForkRefusal = `{"error":{"code":"invalid","message":"a fork takes its template or image and its resources from the checkpoint; don't give them"}}` + "\n"

func walkCheckpoints(ctx context.Context, w *walker) {
	const base = "/v1/sandboxes/scratch/checkpoints"
	cps := "/v1/sandboxes/{sandbox}/checkpoints"
	cp := cps + "/{checkpoint}"

	// A memory checkpoint ends every stream on the sandbox with 1011.
	var sleeper api.Session
	w.json(req{route: "POST /v1/sandboxes/{sandbox}/sessions", path: "/v1/sandboxes/scratch/sessions", body: `{"cmd":["sleep","600"],"detachable":true}`}, 201, &sleeper)
	var open []<-chan websocket.StatusCode
	var names []string
	for _, s := range []struct{ route, path string }{
		{"GET /v1/sandboxes/{sandbox}/sessions/{session}/attach", "/v1/sandboxes/scratch/sessions/" + sleeper.ID + "/attach"},
		{"GET /v1/sandboxes/{sandbox}/services/{service}/logs", "/v1/sandboxes/scratch/services/web/logs"},
		{"GET /v1/sandboxes/{sandbox}/files/watch", "/v1/sandboxes/scratch/files/watch?path=/home/loam"},
		{"GET /v1/sandboxes/{sandbox}/ports/{port}/stream", "/v1/sandboxes/scratch/ports/8080/stream"},
		{"GET /v1/sandboxes/{sandbox}/ports/watch", "/v1/sandboxes/scratch/ports/watch"},
		{"GET /v1/sandboxes/{sandbox}/exec", "/v1/sandboxes/scratch/exec"},
	} {
		conn := w.dial(ctx, s.route, s.path)
		defer conn.CloseNow()
		if strings.HasSuffix(s.path, "/exec") {
			// The command runs, and so the socket is the sandbox's to
			// end, once "started" comes.
			writeJSON(ctx, w.t, conn, api.ExecRequest{Cmd: []string{"sleep", "600"}})
			if _, data, err := conn.Read(ctx); err != nil || w.c.message(w.t, "ExecServerControl", data)["type"] != "started" {
				w.t.Fatalf("exec of sleep: %v %s", err, data)
			}
		}
		open = append(open, closeStatus(ctx, conn))
		names = append(names, s.route)
	}
	var v1 api.Checkpoint
	w.json(req{route: "POST " + cps, path: base, body: `{"comment":"site up, state v1","name":"site-v1"}`}, 201, &v1)
	if v1.ID != "v1" || !v1.Memory {
		w.t.Errorf("first checkpoint %+v, want v1 with memory", v1)
	}
	for i, ch := range open {
		select {
		case st := <-ch:
			if st != websocket.StatusInternalError {
				w.t.Errorf("%s closed with %d through a memory checkpoint, want 1011", names[i], st)
			}
		case <-time.After(30 * time.Second):
			w.t.Errorf("%s still open after a memory checkpoint", names[i])
		}
	}
	var v2 api.Checkpoint
	w.json(req{route: "POST " + cps, path: base, body: `{"comment":"disk only","memory":false}`}, 201, &v2)
	if v2.ID != "v2" || v2.Memory {
		w.t.Errorf("disk-only checkpoint %+v, want v2 without memory", v2)
	}
	w.errorCode(req{route: "POST " + cps, path: base, body: `{"name":"site-v1"}`}, api.CodeConflict)
	w.errorCode(req{route: "POST " + cps, path: base, body: `{"memory":"yes"}`}, api.CodeInvalid)
	w.errorCode(req{route: "POST " + cps, path: "/v1/sandboxes/nope/checkpoints"}, api.CodeNotFound)
	w.call(req{route: "GET " + cp, path: base + "/v1"}, 200)
	w.call(req{route: "GET " + cp, path: base + "/site-v1"}, 200)
	w.errorCode(req{route: "GET " + cp, path: base + "/v9"}, api.CodeNotFound)

	var restored api.Sandbox
	w.json(req{route: "POST " + cp + "/restore", path: base + "/v1/restore"}, 200, &restored)
	if restored.State != api.StateRunning {
		w.t.Errorf("restored %+v", restored)
	}
	w.errorCode(req{route: "POST " + cp + "/restore", path: base + "/v9/restore"}, api.CodeNotFound)
	var list api.CheckpointList
	w.json(req{route: "GET " + cps, path: base}, 200, &list)
	ids := []string{}
	for _, c := range list.Checkpoints {
		ids = append(ids, c.ID)
	}
	if strings.Join(ids, " ") != "v1 v2 auto-1" || !list.Checkpoints[2].Auto {
		w.t.Errorf("checkpoints after a restore: %+v, want v1 v2 auto-1", list.Checkpoints)
	}

	// A warm pool of v1: the reserve keeps it from filling.
	pool := "/pool"
	w.call(req{route: "PUT " + cp + pool, path: base + "/v1" + pool, body: `{"size":1}`}, 200)
	w.errorCode(req{route: "PUT " + cp + pool, path: base + "/v1" + pool, body: `{"size":65}`}, api.CodeInvalid)
	w.errorCode(req{route: "GET " + cp + pool, path: base + "/v9" + pool}, api.CodeNotFound)
	waitHeld(w, req{route: "GET " + cp + pool, path: base + "/v1" + pool})
	w.call(req{route: "PUT " + cp + pool, path: base + "/v1" + pool, body: `{"size":0}`}, 200)

	// A fork of v2, and the seed's refusal of a fork that gives a template.
	fork := `{"name":"scratch-disk","from":{"sandbox":"scratch","checkpoint":"v2"}}`
	if got := w.call(req{route: "POST /v1/sandboxes", path: "/v1/sandboxes", body: `{"template":"base","from":{"sandbox":"scratch","checkpoint":"v2"}}`}, 400); string(got) != seedForkRefusal {
		w.t.Errorf("fork with a template: %s", got)
	}
	var f api.Sandbox
	w.json(req{route: "POST /v1/sandboxes", path: "/v1/sandboxes", body: fork}, 201, &f)
	if f.From == nil || f.From.Checkpoint != "v2" || f.State != api.StateRunning {
		w.t.Errorf("fork %+v", f)
	}

	// Forks with a count: one, then two of which the first's name is
	// taken (a list with a sandbox and an error); a count that makes none
	// answers the first fork's error, and one out of range is refused.
	var forks api.ForkList
	w.json(req{route: "POST /v1/sandboxes", path: "/v1/sandboxes", body: `{"name":"walk","count":1,"from":{"sandbox":"scratch","checkpoint":"v1"}}`}, 201, &forks)
	if len(forks.Forks) != 1 || forks.Forks[0].Sandbox == nil {
		w.t.Errorf("a count of 1: %+v", forks)
	}
	w.json(req{route: "POST /v1/sandboxes", path: "/v1/sandboxes", body: `{"name":"walk","count":2,"from":{"sandbox":"scratch","checkpoint":"v1"}}`}, 201, &forks)
	if len(forks.Forks) != 2 || forks.Forks[0].Error == nil || forks.Forks[1].Sandbox == nil {
		w.t.Errorf("a count of 2 with walk-1 taken: %+v", forks)
	}
	w.errorCode(req{route: "POST /v1/sandboxes", path: "/v1/sandboxes", body: `{"name":"walk","count":2,"from":{"sandbox":"scratch","checkpoint":"v9"}}`}, api.CodeNotFound)
	w.errorCode(req{route: "POST /v1/sandboxes", path: "/v1/sandboxes", body: `{"count":65,"from":{"sandbox":"scratch","checkpoint":"v1"}}`}, api.CodeInvalid)
	for _, name := range []string{"walk-1", "walk-2"} {
		w.call(req{route: "DELETE /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/" + name}, 204)
	}

	w.call(req{route: "DELETE " + cp, path: base + "/v2"}, 204)
	w.errorCode(req{route: "GET " + cp, path: base + "/v2"}, api.CodeNotFound)
	w.call(req{route: "DELETE " + cp, path: base + "/auto-1"}, 204)
	w.errorCode(req{route: "DELETE " + cp, path: base + "/auto-1"}, api.CodeNotFound)
}

// walkImages logs in to a private registry served by the test, pulls an
// image from it and one it lacks, makes a sandbox of the first, and
// deletes them.
func walkImages(w *walker) {
	reg := imagetest.Registry(w.t, "alice", "s3cret")
	ref := reg + "/bb:v1"
	imagetest.Push(w.t, ref, imagetest.Image(w.t, imagetest.BusyboxConfig, imagetest.Busybox(w.t)), "alice", "s3cret")
	regRoute, regPath := "/v1/registries/{registry}", "/v1/registries/"+reg
	w.call(req{route: "PUT " + regRoute, path: regPath, body: `{"username":"alice","password":"s3cret"}`}, 200)
	w.errorCode(req{route: "PUT " + regRoute, path: regPath, body: `{"username":"alice"`}, api.CodeInvalid)
	w.call(req{route: "GET /v1/registries", path: "/v1/registries"}, 200)

	var im api.Image
	w.json(req{route: "POST /v1/images", path: "/v1/images", body: `{"ref":"` + ref + `"}`}, 202, &im)
	w.errorCode(req{route: "POST /v1/images", path: "/v1/images", body: `{"ref":"Not A Ref"}`}, api.CodeInvalid)
	var missing api.Image
	w.json(req{route: "POST /v1/images", path: "/v1/images", body: `{"ref":"` + reg + `/missing:v1"}`}, 202, &missing)
	for _, want := range []struct {
		id    string
		state api.ImageState
	}{{im.ID, api.ImageReady}, {missing.ID, api.ImageError}} {
		var got api.Image
		harness.Eventually(w.t, time.Minute, "image "+want.id+" pulled or failed", func() error {
			w.json(req{route: "GET /v1/images/{image}", path: "/v1/images/" + want.id}, 200, &got)
			if got.State == api.ImagePulling {
				return fmt.Errorf("%s still pulling", got.Ref)
			}
			return nil
		})
		if got.State != want.state {
			w.t.Errorf("image %s: %+v, want %s", got.Ref, got, want.state)
		}
	}
	w.call(req{route: "GET /v1/images", path: "/v1/images"}, 200)
	w.errorCode(req{route: "GET /v1/images/{image}", path: "/v1/images/im-nope"}, api.CodeNotFound)
	// Images are templates too: one ready, one failed with its reason.
	var tl api.TemplateList
	w.json(req{route: "GET /v1/templates", path: "/v1/templates"}, 200, &tl)
	states := map[string]string{}
	for _, tpl := range tl.Templates {
		if tpl.Kind == api.TemplateImage {
			states[tpl.Name] = tpl.State
		}
	}
	if states[ref] != api.TemplateReady || states[reg+"/missing:v1"] != api.TemplateFailed {
		w.t.Errorf("image templates: %v", states)
	}

	w.call(req{route: "POST /v1/sandboxes", path: "/v1/sandboxes", body: `{"name":"from-image","image":"` + ref + `"}`}, 201)
	w.call(req{route: "GET /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/from-image"}, 200)
	w.errorCode(req{route: "DELETE /v1/images/{image}", path: "/v1/images/" + im.ID}, api.CodeConflict)
	w.call(req{route: "DELETE /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/from-image"}, 204)
	w.call(req{route: "DELETE /v1/images/{image}", path: "/v1/images/" + im.ID}, 204)
	w.call(req{route: "DELETE /v1/images/{image}", path: "/v1/images/" + missing.ID}, 204)
	w.errorCode(req{route: "DELETE /v1/images/{image}", path: "/v1/images/" + im.ID}, api.CodeNotFound)
	w.call(req{route: "DELETE " + regRoute, path: regPath}, 204)
	w.errorCode(req{route: "DELETE " + regRoute, path: regPath}, api.CodeNotFound)
	w.errorCode(req{route: "DELETE " + regRoute, path: "/v1/registries/bad%2Fname"}, api.CodeInvalid)
}

// walkTemplates keeps a disk-only checkpoint of scratch as a template,
// makes a sandbox of it, exports it and imports it again.
func walkTemplates(w *walker) {
	var cp api.Checkpoint
	w.json(req{route: "POST /v1/sandboxes/{sandbox}/checkpoints", path: "/v1/sandboxes/scratch/checkpoints", body: `{"memory":false}`}, 201, &cp)
	create := `{"name":"scratch-tpl","from":{"sandbox":"scratch","checkpoint":"` + cp.ID + `"}}`
	var tpl api.Template
	w.json(req{route: "POST /v1/templates", path: "/v1/templates", body: create}, 201, &tpl)
	if tpl.Kind != api.TemplateCheckpoint || tpl.Memory || tpl.From != "scratch/"+cp.ID {
		w.t.Errorf("template %+v", tpl)
	}
	w.errorCode(req{route: "POST /v1/templates", path: "/v1/templates", body: create}, api.CodeConflict)
	w.errorCode(req{route: "POST /v1/templates", path: "/v1/templates", body: `{"name":"Bad Name","from":{"sandbox":"scratch","checkpoint":"v1"}}`}, api.CodeInvalid)
	w.errorCode(req{route: "POST /v1/templates", path: "/v1/templates", body: `{"name":"x"}`}, api.CodeInvalid)
	w.errorCode(req{route: "POST /v1/templates", path: "/v1/templates", body: `{"name":"x","from":{"sandbox":"nope","checkpoint":"v1"}}`}, api.CodeNotFound)
	w.call(req{route: "POST /v1/sandboxes", path: "/v1/sandboxes", body: `{"name":"from-tpl","template":"scratch-tpl"}`}, 201)
	w.call(req{route: "GET /v1/templates", path: "/v1/templates"}, 200)

	const one = "/v1/templates/{template}"
	w.call(req{route: "PUT " + one + "/pool", path: "/v1/templates/scratch-tpl/pool", body: `{"size":2}`}, 200)
	w.errorCode(req{route: "PUT " + one + "/pool", path: "/v1/templates/nope/pool", body: `{"size":1}`}, api.CodeNotFound)
	waitHeld(w, req{route: "GET " + one + "/pool", path: "/v1/templates/scratch-tpl/pool"})
	w.call(req{route: "PUT " + one + "/pool", path: "/v1/templates/scratch-tpl/pool", body: `{"size":0}`}, 200)
	w.errorCode(req{route: "DELETE " + one, path: "/v1/templates/scratch-tpl"}, api.CodeConflict)
	w.errorCode(req{route: "DELETE " + one, path: "/v1/templates/base"}, api.CodeForbidden)
	w.errorCode(req{route: "DELETE " + one, path: "/v1/templates/nope"}, api.CodeNotFound)

	archive := w.call(req{route: "GET " + one + "/export", path: "/v1/templates/scratch-tpl/export"}, 200)
	w.errorCode(req{route: "GET " + one + "/export", path: "/v1/templates/base/export"}, api.CodeInvalid)
	w.errorCode(req{route: "GET " + one + "/export", path: "/v1/templates/nope/export"}, api.CodeNotFound)
	imp := req{route: "PUT " + one + "/import", path: "/v1/templates/scratch-copy/import", body: string(archive), ctype: "application/zstd"}
	w.json(imp, 201, &tpl)
	if tpl.Name != "scratch-copy" || tpl.SizeBytes == 0 {
		w.t.Errorf("imported %+v", tpl)
	}
	w.errorCode(imp, api.CodeConflict)
	w.errorCode(req{route: "PUT " + one + "/import", path: "/v1/templates/broken/import", body: string(archive[:len(archive)/2]), ctype: "application/zstd"}, api.CodeInvalid)

	w.call(req{route: "DELETE /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/from-tpl"}, 204)
	w.call(req{route: "DELETE " + one, path: "/v1/templates/scratch-tpl"}, 204)
	w.call(req{route: "DELETE " + one, path: "/v1/templates/scratch-copy"}, 204)
}

// waitHeld reads a pool until it says why it holds back.
func waitHeld(w *walker, r req) {
	harness.Eventually(w.t, 10*time.Second, "the pool at "+r.path+" held (host memory short)", func() error {
		var p api.Pool
		w.json(r, 200, &p)
		if p.Held == "" {
			return fmt.Errorf("%+v", p)
		}
		return nil
	})
}

func walkCleanup(w *walker) {
	var sb api.Sandbox
	w.json(req{route: "POST /v1/sandboxes/{sandbox}/sleep", path: "/v1/sandboxes/scratch-disk/sleep"}, 200, &sb)
	if sb.State != api.StateSleeping {
		w.t.Errorf("slept: %s", sb.State)
	}
	w.json(req{route: "POST /v1/sandboxes/{sandbox}/wake", path: "/v1/sandboxes/scratch-disk/wake"}, 200, &sb)
	if sb.State != api.StateRunning {
		w.t.Errorf("woken: %s", sb.State)
	}
	// A sandbox whose sandbox process died shows why (reason), and a wake
	// boots it again on its disk.
	killSentry(w.t, w.d, sb.ID)
	w.json(req{route: "GET /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/scratch-disk"}, 200, &sb)
	if sb.State != api.StateError || sb.Reason == "" {
		w.t.Errorf("killed: %s %q", sb.State, sb.Reason)
	}
	w.json(req{route: "POST /v1/sandboxes/{sandbox}/wake", path: "/v1/sandboxes/scratch-disk/wake"}, 200, &sb)
	if sb.State != api.StateRunning {
		w.t.Errorf("booted again: %s", sb.State)
	}
	w.errorCode(req{route: "POST /v1/sandboxes/{sandbox}/wake", path: "/v1/sandboxes/nope/wake"}, api.CodeNotFound)
	w.errorCode(req{route: "POST /v1/sandboxes/{sandbox}/sleep", path: "/v1/sandboxes/nope/sleep"}, api.CodeNotFound)

	secret := "/v1/secrets/{name}"
	w.errorCode(req{route: "DELETE " + secret, path: "/v1/secrets/api-key"}, api.CodeConflict)
	w.errorCode(req{route: "DELETE " + secret, path: "/v1/secrets/api-key?force=maybe"}, api.CodeInvalid)
	w.call(req{route: "DELETE " + secret, path: "/v1/secrets/api-key?force=true"}, 204)
	w.errorCode(req{route: "DELETE " + secret, path: "/v1/secrets/api-key"}, api.CodeNotFound)

	w.call(req{route: "DELETE /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/scratch-disk"}, 204)
	w.errorCode(req{route: "DELETE /v1/sandboxes/{sandbox}", path: "/v1/sandboxes/scratch-disk"}, api.CodeNotFound)
}

// paramValue fills each path parameter of a route for a request that must
// be refused before anything reads it.
var paramValue = strings.NewReplacer("{sandbox}", "scratch", "{checkpoint}", "v1", "{session}", "s-abc",
	"{service}", "web", "{port}", "8080", "{name}", "api-key", "{image}", "im-0123456789ab", "{registry}", "localhost:5000",
	"{template}", "scratch-tpl", "{org}", "default", "{key}", "key-0123456789ab", "{node}", "node-2")

// walkUnauthorized sends every route of the server without a token, and
// with a wrong one: each /v1 route but the document refuses it with 401.
func walkUnauthorized(w *walker) {
	for _, route := range server.Routes() {
		method, pattern, _ := strings.Cut(route, " ")
		if pattern == "/healthz" || pattern == "/v1/openapi.yaml" {
			continue
		}
		path := paramValue.Replace(pattern)
		if strings.Contains(path, "{") {
			w.t.Errorf("route %s has a parameter the walk cannot fill", route)
			continue
		}
		for _, token := range []string{"", "wrong"} {
			hr, _ := http.NewRequest(method, w.d.URL+path, nil)
			if token != "" {
				hr.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := http.DefaultClient.Do(hr)
			if err != nil {
				w.t.Fatal(err)
			}
			body := readBody(w.t, resp)
			var eb api.ErrorBody
			if resp.StatusCode != 401 || json.Unmarshal(body, &eb) != nil || eb.Error == nil || eb.Error.Code != api.CodeUnauthorized {
				w.t.Errorf("%s without the token: %d %s", route, resp.StatusCode, body)
			}
			w.c.answer(w.t, route, resp, body)
		}
	}
}
