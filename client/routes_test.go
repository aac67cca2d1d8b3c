package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/server"
)

// routeCall is one call of the Go client and the route of the API it must
// reach.
type routeCall struct {
	route string // the server's pattern, "METHOD /path"
	name  string // the Client method called
	// query is the query the call must send; nil for none. The calls give
	// every parameter a value, so that each one is seen to reach the wire.
	query url.Values
	call  func(ctx context.Context, c *client.Client) error
}

// madeBodies are the calls that make the JSON body of their request from
// their own arguments, by name, each with a zero value of the body's API
// type: every field of it must be sent, or the client has no way to give
// it. (The other calls take the API's type itself.)
var madeBodies = map[string]any{
	"Mkdir":          new(api.MkdirRequest),
	"MoveFile":       new(api.MoveRequest),
	"SignalSession":  new(api.SignalSession),
	"PutSecret":      new(api.PutSecret),
	"PullImage":      new(api.PullImage),
	"LoginRegistry":  new(api.RegistryLogin),
	"CreateTemplate": new(api.CreateTemplate),
}

// routeCalls are the client's calls, at least one per route of the API.
var routeCalls = []routeCall{
	{"GET /healthz", "Health", nil, func(ctx context.Context, c *client.Client) error {
		return c.Health(ctx)
	}},
	{"GET /v1/templates", "Templates", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.Templates(ctx)
		return err
	}},
	{"POST /v1/templates", "CreateTemplate", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.CreateTemplate(ctx, "warm", "sb", "v1", client.WithPool(2))
		return err
	}},
	{"DELETE /v1/templates/{template}", "DeleteTemplate", nil, func(ctx context.Context, c *client.Client) error {
		return c.DeleteTemplate(ctx, "warm")
	}},
	{"GET /v1/templates/{template}/export", "ExportTemplate", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ExportTemplate(ctx, "warm", io.Discard)
		return err
	}},
	{"PUT /v1/templates/{template}/import", "ImportTemplate", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ImportTemplate(ctx, "warm", strings.NewReader("archive"))
		return err
	}},
	{"POST /v1/sandboxes", "CreateSandbox", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "sb"})
		return err
	}},
	{"POST /v1/sandboxes", "Fork", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.Fork(ctx, "sb", "v1", "sb-2")
		return err
	}},
	{"POST /v1/sandboxes", "ForkWith", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ForkWith(ctx, "sb", "v1", api.CreateSandbox{Name: "sb-2"})
		return err
	}},
	{"POST /v1/sandboxes", "ForkMany", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ForkMany(ctx, "sb", "v1", api.CreateSandbox{Name: "sb", Count: 3})
		return err
	}},
	{"GET /v1/sandboxes", "ListSandboxes", url.Values{"label": {"owner=docs", "team=red"}}, func(ctx context.Context, c *client.Client) error {
		_, err := c.ListSandboxes(ctx, client.ListOptions{Labels: map[string]string{"team": "red", "owner": "docs"}})
		return err
	}},
	{"GET /v1/sandboxes/{sandbox}", "GetSandbox", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.GetSandbox(ctx, "sb")
		return err
	}},
	{"PATCH /v1/sandboxes/{sandbox}", "UpdateSandbox", nil, func(ctx context.Context, c *client.Client) error {
		public := true
		_, err := c.UpdateSandbox(ctx, "sb", api.UpdateSandbox{Public: &public})
		return err
	}},
	{"GET /v1/openapi.yaml", "OpenAPI", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.OpenAPI(ctx)
		return err
	}},
	{"DELETE /v1/sandboxes/{sandbox}", "DeleteSandbox", nil, func(ctx context.Context, c *client.Client) error {
		return c.DeleteSandbox(ctx, "sb")
	}},
	{"GET /v1/sandboxes/{sandbox}/access-token", "AccessToken", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.AccessToken(ctx, "sb")
		return err
	}},
	{"GET /v1/sandboxes/{sandbox}/exec", "Exec", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.Exec(ctx, "sb", client.ExecOptions{Cmd: []string{"true"}})
		return err
	}},
	{"GET /v1/sandboxes/{sandbox}/exec", "Output", nil, func(ctx context.Context, c *client.Client) error {
		_, _, _, err := c.Output(ctx, "sb", "true")
		return err
	}},
	{"POST /v1/sandboxes/{sandbox}/sleep", "Sleep", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.Sleep(ctx, "sb")
		return err
	}},
	{"POST /v1/sandboxes/{sandbox}/wake", "Wake", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.Wake(ctx, "sb")
		return err
	}},

	{"POST /v1/sandboxes/{sandbox}/checkpoints", "CreateCheckpoint", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.CreateCheckpoint(ctx, "sb", api.CreateCheckpoint{Comment: "c"})
		return err
	}},
	{"GET /v1/sandboxes/{sandbox}/checkpoints", "ListCheckpoints", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ListCheckpoints(ctx, "sb")
		return err
	}},
	{"GET /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}", "GetCheckpoint", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.GetCheckpoint(ctx, "sb", "v1")
		return err
	}},
	{"DELETE /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}", "DeleteCheckpoint", nil, func(ctx context.Context, c *client.Client) error {
		return c.DeleteCheckpoint(ctx, "sb", "v1")
	}},
	{"POST /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}/restore", "RestoreCheckpoint", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.RestoreCheckpoint(ctx, "sb", "v1")
		return err
	}},
	{"GET /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}/pool", "CheckpointPool", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.CheckpointPool(ctx, "sb", "v1")
		return err
	}},
	{"PUT /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}/pool", "SetCheckpointPool", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.SetCheckpointPool(ctx, "sb", "v1", 4)
		return err
	}},
	{"GET /v1/templates/{template}/pool", "TemplatePool", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.TemplatePool(ctx, "base")
		return err
	}},
	{"PUT /v1/templates/{template}/pool", "SetTemplatePool", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.SetTemplatePool(ctx, "base", 4)
		return err
	}},

	{"GET /v1/sandboxes/{sandbox}/files", "StatFile", url.Values{"path": {"/f"}, "user": {"root"}, "depth": {"0"}}, func(ctx context.Context, c *client.Client) error {
		_, err := c.StatFile(ctx, "sb", "/f", &client.FileOptions{User: "root"})
		return err
	}},
	{"GET /v1/sandboxes/{sandbox}/files", "ListFiles", url.Values{"path": {"/d"}, "user": {"root"}, "depth": {"2"}}, func(ctx context.Context, c *client.Client) error {
		_, err := c.ListFiles(ctx, "sb", "/d", &client.FileOptions{User: "root", Depth: 2})
		return err
	}},
	{"DELETE /v1/sandboxes/{sandbox}/files", "RemoveFile", url.Values{"path": {"/d"}, "user": {"root"}, "recursive": {"true"}}, func(ctx context.Context, c *client.Client) error {
		return c.RemoveFile(ctx, "sb", "/d", &client.FileOptions{User: "root", Recursive: true})
	}},
	{"GET /v1/sandboxes/{sandbox}/files/content", "ReadFile", url.Values{"path": {"/f"}, "user": {"root"}}, func(ctx context.Context, c *client.Client) error {
		_, err := c.ReadFile(ctx, "sb", "/f", &client.FileOptions{User: "root"})
		return err
	}},
	{"PUT /v1/sandboxes/{sandbox}/files/content", "WriteFile", url.Values{"path": {"/f"}, "user": {"root"}, "mode": {"0600"}}, func(ctx context.Context, c *client.Client) error {
		_, err := c.WriteFile(ctx, "sb", "/f", strings.NewReader("x"), &client.FileOptions{User: "root", Mode: 0o600})
		return err
	}},
	{"POST /v1/sandboxes/{sandbox}/files/mkdir", "Mkdir", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.Mkdir(ctx, "sb", "/d", &client.FileOptions{User: "root", Mode: 0o700})
		return err
	}},
	{"POST /v1/sandboxes/{sandbox}/files/move", "MoveFile", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.MoveFile(ctx, "sb", "/a", "/b", &client.FileOptions{User: "root"})
		return err
	}},
	{"GET /v1/sandboxes/{sandbox}/files/archive", "ReadArchive", url.Values{"path": {"/d"}, "user": {"root"}}, func(ctx context.Context, c *client.Client) error {
		_, err := c.ReadArchive(ctx, "sb", "/d", &client.FileOptions{User: "root"})
		return err
	}},
	{"PUT /v1/sandboxes/{sandbox}/files/archive", "WriteArchive", url.Values{"path": {"/d"}, "user": {"root"}}, func(ctx context.Context, c *client.Client) error {
		return c.WriteArchive(ctx, "sb", "/d", strings.NewReader("tar"), &client.FileOptions{User: "root"})
	}},
	{"GET /v1/sandboxes/{sandbox}/files/watch", "Watch", url.Values{"path": {"/d"}, "user": {"root"}, "recursive": {"true"}}, func(ctx context.Context, c *client.Client) error {
		_, err := c.Watch(ctx, "sb", "/d", &client.FileOptions{User: "root", Recursive: true})
		return err
	}},

	{"POST /v1/sandboxes/{sandbox}/sessions", "CreateSession", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.CreateSession(ctx, "sb", api.ExecRequest{Cmd: []string{"true"}})
		return err
	}},
	{"GET /v1/sandboxes/{sandbox}/sessions", "ListSessions", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ListSessions(ctx, "sb")
		return err
	}},
	{"GET /v1/sandboxes/{sandbox}/sessions/{session}", "GetSession", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.GetSession(ctx, "sb", "s-1")
		return err
	}},
	{"DELETE /v1/sandboxes/{sandbox}/sessions/{session}", "DeleteSession", nil, func(ctx context.Context, c *client.Client) error {
		return c.DeleteSession(ctx, "sb", "s-1")
	}},
	{"GET /v1/sandboxes/{sandbox}/sessions/{session}/attach", "Attach", url.Values{"offset": {"5"}, "stderr_offset": {"7"}, "follow": {"false"}}, func(ctx context.Context, c *client.Client) error {
		out, errOut := int64(5), int64(7)
		_, err := c.Attach(ctx, "sb", "s-1", client.AttachOptions{Offset: &out, StderrOffset: &errOut, NoFollow: true})
		return err
	}},
	{"POST /v1/sandboxes/{sandbox}/sessions/{session}/wait", "WaitSession", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.WaitSession(ctx, "sb", "s-1")
		return err
	}},
	{"POST /v1/sandboxes/{sandbox}/sessions/{session}/signal", "SignalSession", nil, func(ctx context.Context, c *client.Client) error {
		return c.SignalSession(ctx, "sb", "s-1", "TERM")
	}},

	{"GET /v1/sandboxes/{sandbox}/services", "ListServices", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ListServices(ctx, "sb")
		return err
	}},
	{"PUT /v1/sandboxes/{sandbox}/services/{service}", "PutService", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.PutService(ctx, "sb", api.Service{Name: "web", Cmd: []string{"true"}})
		return err
	}},
	{"GET /v1/sandboxes/{sandbox}/services/{service}", "GetService", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.GetService(ctx, "sb", "web")
		return err
	}},
	{"DELETE /v1/sandboxes/{sandbox}/services/{service}", "DeleteService", nil, func(ctx context.Context, c *client.Client) error {
		return c.DeleteService(ctx, "sb", "web")
	}},
	{"GET /v1/sandboxes/{sandbox}/services/{service}/logs", "ServiceLogs", url.Values{"offset": {"5"}, "stderr_offset": {"7"}, "follow": {"false"}}, func(ctx context.Context, c *client.Client) error {
		out, errOut := int64(5), int64(7)
		return c.ServiceLogs(ctx, "sb", "web", client.ServiceLogsOptions{Offset: &out, StderrOffset: &errOut})
	}},
	{"POST /v1/sandboxes/{sandbox}/services/{service}/start", "StartService", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.StartService(ctx, "sb", "web")
		return err
	}},
	{"POST /v1/sandboxes/{sandbox}/services/{service}/stop", "StopService", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.StopService(ctx, "sb", "web")
		return err
	}},
	{"POST /v1/sandboxes/{sandbox}/services/{service}/restart", "RestartService", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.RestartService(ctx, "sb", "web")
		return err
	}},

	{"GET /v1/sandboxes/{sandbox}/ports", "ListPorts", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ListPorts(ctx, "sb")
		return err
	}},
	{"GET /v1/sandboxes/{sandbox}/ports/watch", "WatchPorts", nil, func(ctx context.Context, c *client.Client) error {
		for _, err := range c.WatchPorts(ctx, "sb") {
			return err
		}
		return nil
	}},
	{"GET /v1/sandboxes/{sandbox}/ports/{port}/stream", "DialPort", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.DialPort(ctx, "sb", 8080)
		return err
	}},

	{"PUT /v1/secrets/{name}", "PutSecret", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.PutSecret(ctx, "tok", "value")
		return err
	}},
	{"POST /v1/images", "PullImage", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.PullImage(ctx, "alpine:3")
		return err
	}},
	{"GET /v1/images", "ListImages", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ListImages(ctx)
		return err
	}},
	{"GET /v1/images/{image}", "GetImage", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.GetImage(ctx, "im-1")
		return err
	}},
	{"GET /v1/images/{image}", "WaitImage", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.WaitImage(ctx, "im-1", 0, nil)
		return err
	}},
	{"DELETE /v1/images/{image}", "DeleteImage", nil, func(ctx context.Context, c *client.Client) error {
		return c.DeleteImage(ctx, "im-1")
	}},
	{"PUT /v1/registries/{registry}", "LoginRegistry", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.LoginRegistry(ctx, "localhost:5000", "alice", "s3cret")
		return err
	}},
	{"GET /v1/registries", "ListRegistries", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ListRegistries(ctx)
		return err
	}},
	{"DELETE /v1/registries/{registry}", "LogoutRegistry", nil, func(ctx context.Context, c *client.Client) error {
		return c.LogoutRegistry(ctx, "localhost:5000")
	}},
	{"POST /v1/keys", "CreateKey", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.CreateKey(ctx, api.CreateKey{Name: "ci", Scope: api.ScopeRead, ExpiresIn: "30d", Labels: map[string]string{"owner": "agent"}})
		return err
	}},
	{"GET /v1/keys", "ListKeys", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ListKeys(ctx)
		return err
	}},
	{"DELETE /v1/keys/{key}", "RevokeKey", nil, func(ctx context.Context, c *client.Client) error {
		return c.RevokeKey(ctx, "key-0123456789ab")
	}},
	{"GET /v1/audit", "Audit", url.Values{"since": {"2026-12-05T10:00:00Z"}, "since_seq": {"7"}, "action": {"sandbox.create"}, "org": {"docs"}, "limit": {"50"}}, func(ctx context.Context, c *client.Client) error {
		_, err := c.Audit(ctx, client.AuditOptions{Since: time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC), SinceSeq: 7, Action: "sandbox.create", Org: "docs", Limit: 50})
		return err
	}},
	{"GET /v1/org", "Org", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.Org(ctx)
		return err
	}},
	{"GET /v1/nodes", "ListNodes", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ListNodes(ctx)
		return err
	}},
	{"POST /v1/nodes/{node}/cordon", "CordonNode", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.CordonNode(ctx, "node-2", true)
		return err
	}},
	{"POST /v1/nodes/{node}/uncordon", "CordonNode", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.CordonNode(ctx, "node-2", false)
		return err
	}},
	{"POST /v1/nodes/{node}/drain", "DrainNode", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.DrainNode(ctx, "node-2")
		return err
	}},
	{"POST /v1/sandboxes/{sandbox}/move", "MoveSandbox", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.MoveSandbox(ctx, "scratch", "node-2")
		return err
	}},
	{"DELETE /v1/nodes/{node}", "RemoveNode", url.Values{"force": {"true"}}, func(ctx context.Context, c *client.Client) error {
		_, err := c.RemoveNode(ctx, "node-2")
		return err
	}},
	{"GET /v1/orgs", "ListOrgs", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ListOrgs(ctx)
		return err
	}},
	{"POST /v1/orgs", "CreateOrg", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.CreateOrg(ctx, "docs")
		return err
	}},
	{"DELETE /v1/orgs/{org}", "DeleteOrg", url.Values{"all": {"true"}}, func(ctx context.Context, c *client.Client) error {
		return c.DeleteOrg(ctx, "docs", true)
	}},
	{"POST /v1/orgs/{org}/keys", "CreateOrgKey", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.CreateOrgKey(ctx, "docs", api.CreateKey{Name: "docs-admin", Scope: api.ScopeAdmin})
		return err
	}},
	{"PUT /v1/orgs/{org}/quota", "SetQuota", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.SetQuota(ctx, "docs", api.Quota{})
		return err
	}},
	{"GET /v1/secrets", "ListSecrets", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.ListSecrets(ctx)
		return err
	}},
	{"DELETE /v1/secrets/{name}", "DeleteSecret", url.Values{"force": {"true"}}, func(ctx context.Context, c *client.Client) error {
		return c.DeleteSecret(ctx, "tok", true)
	}},

	{"PUT /v1/sandboxes/{sandbox}/network", "SetNetwork", nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.SetNetwork(ctx, "sb", api.NetworkPolicy{Egress: api.EgressNone})
		return err
	}},
}

// TestEveryRouteHasAClientCall fails when a route of the API (server.Routes)
// has no call of the Go client. Each call is made against a server that
// routes the API's own patterns and answers every one with an API error,
// so each call must reach its route (method, path and query) and give the
// error back as an *api.Error.
func TestEveryRouteHasAClientCall(t *testing.T) {
	routes := server.Routes()

	var (
		mu     sync.Mutex
		hits   []string // the routes reached by the current call
		qs     []url.Values
		bodies [][]byte
	)
	mux := http.NewServeMux()
	for _, route := range routes {
		mux.HandleFunc(route, func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			hits = append(hits, route)
			qs = append(qs, r.URL.Query())
			bodies = append(bodies, body)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			fmt.Fprintf(w, `{"error":{"code":"conflict","message":"reached %s"}}`, route)
		})
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := client.New(srv.URL, "tok")

	covered := map[string]bool{}
	for _, rc := range routeCalls {
		t.Run(rc.name, func(t *testing.T) {
			if _, ok := reflect.TypeFor[*client.Client]().MethodByName(rc.name); !ok {
				t.Errorf("routeCalls names %s, which is no method of *client.Client", rc.name)
			}
			mu.Lock()
			hits, qs, bodies = nil, nil, nil
			mu.Unlock()
			err := rc.call(t.Context(), c)
			var ae *api.Error
			if !errors.As(err, &ae) || !errors.Is(err, api.ErrConflict) {
				t.Errorf("%s: err = %v, want the server's *api.Error of code conflict", rc.name, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(hits) != 1 || hits[0] != rc.route {
				t.Fatalf("%s reached %q, want exactly %q", rc.name, hits, rc.route)
			}
			if (len(rc.query) > 0 || len(qs[0]) > 0) && !reflect.DeepEqual(qs[0], rc.query) {
				t.Fatalf("%s sent the query %v, want %v", rc.name, qs[0], rc.query)
			}
			if body, ok := madeBodies[rc.name]; ok {
				if err := json.Unmarshal(bodies[0], body); err != nil {
					t.Fatalf("%s sent the body %q: %v", rc.name, bodies[0], err)
				}
				v := reflect.ValueOf(body).Elem()
				for i := range v.NumField() {
					if v.Field(i).IsZero() {
						t.Errorf("%s sent no %s in its body %s: the client has no way to give it", rc.name, v.Type().Field(i).Name, bodies[0])
					}
				}
			}
			covered[rc.route] = true
		})
	}
	for _, route := range routes {
		if !covered[route] {
			t.Errorf("the route %q has no call of the Go client in routeCalls (or its call failed above)", route)
		}
	}
}
