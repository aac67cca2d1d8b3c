package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/store/sqlite"
)

// keyServer is a server over the fake sandboxes with real API keys and a
// real audit log in SQLite, and a key of each scope.
type keyServer struct {
	base  string
	fake  *fakeSandboxes
	keys  *auth.Keys
	store *sqlite.Store
	// secrets of the keys by name: "admin", "write", "read", and
	// "red" (write, limited to team=red: the fake's sandbox "box").
	secrets map[string]string
}

func newKeyServer(t *testing.T) *keyServer {
	t.Helper()
	st, err := sqlite.Open(context.Background(), t.TempDir()+"/loam.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ks := &keyServer{fake: newFake(), store: st, secrets: map[string]string{}}
	ks.keys = auth.NewKeys(DefaultOrg, testToken, st, discardLog())
	opts := append(fakeServices(ks.fake), WithKeys(ks.keys), WithAudit(st), WithPools(fuzzSandboxes{ks.fake}))
	ks.base = serve(t, New(ks.fake, testToken, discardLog(), opts...))
	admin := ks.keys.Admin()
	for name, req := range map[string]api.CreateKey{
		"admin": {Name: "admin", Scope: api.ScopeAdmin},
		"write": {Name: "write", Scope: api.ScopeWrite},
		"read":  {Name: "read", Scope: api.ScopeRead},
		"red":   {Name: "red", Scope: api.ScopeWrite, Labels: map[string]string{"team": "red"}},
	} {
		k, err := ks.keys.Create(context.Background(), admin, DefaultOrg, req)
		if err != nil {
			t.Fatal(err)
		}
		ks.secrets[name] = k.Secret
	}
	return ks
}

// routeRequest is a request to rt's pattern about the fake's sandbox
// (box, or sb when given) and its checkpoint v1.
func routeRequest(rt RouteInfo, sb string) request {
	method, path, _ := strings.Cut(rt.Pattern, " ")
	if sb == "" {
		sb = "box"
	}
	path = strings.NewReplacer(
		"{sandbox}", sb, "{checkpoint}", "v1", "{template}", "busybox", "{image}", "img",
		"{registry}", "ghcr.io", "{name}", "S", "{service}", "web", "{session}", "s1",
		"{port}", "8080", "{key}", "key-nosuchkey000",
	).Replace(path)
	body := ""
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		body = "{}"
	}
	return request{method: method, path: path, body: body}
}

// errorCode is the code of an error answer, "" for any other.
func errorCode(b []byte) string {
	var e struct {
		Error *api.Error `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil || e.Error == nil {
		return ""
	}
	return string(e.Error.Code)
}

// TestScopeMatrix calls every route of the route table with a key of each
// scope: a key below the route's scope is refused with forbidden before
// anything happens; one at or above it gets past authorization. A new
// route is in the table, so it cannot be missed.
func TestScopeMatrix(t *testing.T) {
	ks := newKeyServer(t)
	scopes := []api.Scope{api.ScopeRead, api.ScopeWrite, api.ScopeAdmin}
	for _, rt := range RouteTable() {
		if !rt.Scope.Valid() {
			t.Errorf("%s: no scope", rt.Pattern)
			continue
		}
		for _, scope := range scopes {
			req := routeRequest(rt, "")
			req.token = ks.secrets[string(scope)]
			resp, body := do(t, ks.base, "", req)
			code := errorCode(body)
			if rt.Operator {
				// No key of an org's calls the operator's routes.
				if resp.StatusCode != http.StatusForbidden || code != string(api.CodeForbidden) {
					t.Errorf("%s (the operator's) with a %s key: %d %s, want 403 forbidden", rt.Pattern, scope, resp.StatusCode, body)
				}
				continue
			}
			if scope.Includes(rt.Scope) {
				if code == string(api.CodeForbidden) || code == string(api.CodeUnauthorized) {
					t.Errorf("%s with a %s key: %d %s; the route needs %s", rt.Pattern, scope, resp.StatusCode, body, rt.Scope)
				}
				continue
			}
			if resp.StatusCode != http.StatusForbidden || code != string(api.CodeForbidden) {
				t.Errorf("%s with a %s key: %d %s, want 403 forbidden (the route needs %s)", rt.Pattern, scope, resp.StatusCode, body, rt.Scope)
			}
		}
	}
}

// TestReadScopeReadsOnly holds the read scope to its promise: every route
// it may call is a GET that is no exec, file, log, export, URL token or
// stream.
func TestReadScopeReadsOnly(t *testing.T) {
	for _, rt := range RouteTable() {
		if rt.Scope != api.ScopeRead {
			continue
		}
		method, path, _ := strings.Cut(rt.Pattern, " ")
		if method != http.MethodGet {
			t.Errorf("%s: read scope on a %s", rt.Pattern, method)
		}
		for _, bad := range []string{"/exec", "/files", "/logs", "/export", "/access-token", "/attach", "/stream", "/keys", "/audit"} {
			if strings.Contains(path, bad) {
				t.Errorf("%s: read scope on a route that reads a sandbox's contents or the org's secrets (%s)", rt.Pattern, bad)
			}
		}
		if rt.Action != "" {
			t.Errorf("%s: read scope, but the route is audited as the change %s", rt.Pattern, rt.Action)
		}
	}
}

// TestLabelLimitedKeys calls every route about a sandbox with a key
// limited to team=red: about a sandbox outside its selector, the answer is
// exactly the one for a sandbox that does not exist; about one inside, the
// same as an unlimited key's. Org-wide changes are refused.
func TestLabelLimitedKeys(t *testing.T) {
	for _, rt := range RouteTable() {
		if !strings.Contains(rt.Pattern, "{sandbox}") || rt.Operator {
			// The operator's (a move) take no key at all.
			continue
		}
		if rt.Scope == api.ScopeAdmin {
			t.Errorf("%s: an admin route about a sandbox; the test assumes a write key may call it", rt.Pattern)
			continue
		}
		// Fresh servers: a route may change what the next one sees.
		outside := newKeyServer(t)
		req := routeRequest(rt, "sleepy") // no labels
		req.token = outside.secrets["red"]
		got, gotBody := do(t, outside.base, "", req)
		none := newKeyServer(t)
		req = routeRequest(rt, "nosuch")
		req.token = none.secrets["write"]
		want, wantBody := do(t, none.base, "", req)
		if got.StatusCode != want.StatusCode || strings.ReplaceAll(string(gotBody), "sleepy", "nosuch") != string(wantBody) {
			t.Errorf("%s about a sandbox outside the key's labels: %d %s; for one that does not exist: %d %s", rt.Pattern, got.StatusCode, gotBody, want.StatusCode, wantBody)
		}

		inside := newKeyServer(t)
		req = routeRequest(rt, "box") // team=red
		req.token = inside.secrets["red"]
		got, gotBody = do(t, inside.base, "", req)
		unlimited := newKeyServer(t)
		req.token = unlimited.secrets["write"]
		want, wantBody = do(t, unlimited.base, "", req)
		if got.StatusCode != want.StatusCode {
			t.Errorf("%s about a sandbox inside the key's labels: %d %s; an unlimited key: %d %s", rt.Pattern, got.StatusCode, gotBody, want.StatusCode, wantBody)
		}
	}

	ks := newKeyServer(t)
	for _, rt := range RouteTable() {
		if strings.Contains(rt.Pattern, "{sandbox}") || rt.Pattern == "POST /v1/sandboxes" || rt.Scope != api.ScopeWrite {
			continue
		}
		req := routeRequest(rt, "")
		req.token = ks.secrets["red"]
		resp, body := do(t, ks.base, "", req)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s with a label-limited key: %d %s, want 403: it changes what the whole org shares", rt.Pattern, resp.StatusCode, body)
		}
	}

	// A list shows the selector's sandboxes only, whatever the filter.
	for _, q := range []string{"", "?label=team=blue", "?label=team=red"} {
		resp, body := do(t, ks.base, "", request{method: "GET", path: "/v1/sandboxes" + q, token: ks.secrets["red"]})
		var list api.SandboxList
		if err := json.Unmarshal(body, &list); err != nil || resp.StatusCode != 200 {
			t.Fatalf("list%s: %d %s", q, resp.StatusCode, body)
		}
		for _, sb := range list.Sandboxes {
			if sb.Labels["team"] != "red" {
				t.Errorf("list%s with a key limited to team=red shows %s (labels %v)", q, sb.Name, sb.Labels)
			}
		}
		if q != "?label=team=blue" && len(list.Sandboxes) != 1 {
			t.Errorf("list%s: %d sandboxes, want box alone", q, len(list.Sandboxes))
		}
	}

	// What it makes gets its labels; a label at odds with them, or a fork
	// of a sandbox it may not see, is refused.
	resp, body := do(t, ks.base, "", request{method: "POST", path: "/v1/sandboxes", token: ks.secrets["red"], body: `{"name":"mine","labels":{"x":"1"}}`})
	var sb api.Sandbox
	if err := json.Unmarshal(body, &sb); err != nil || resp.StatusCode != 201 || sb.Labels["team"] != "red" || sb.Labels["x"] != "1" {
		t.Errorf("create with a limited key: %d %s, want the labels team=red and x=1", resp.StatusCode, body)
	}
	resp, body = do(t, ks.base, "", request{method: "POST", path: "/v1/sandboxes", token: ks.secrets["red"], body: `{"labels":{"team":"blue"}}`})
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("create with team=blue by a key limited to team=red: %d %s, want 403", resp.StatusCode, body)
	}
	resp, body = do(t, ks.base, "", request{method: "POST", path: "/v1/sandboxes", token: ks.secrets["red"], body: `{"from":{"sandbox":"sleepy","checkpoint":"v1"}}`})
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), `sandbox \"sleepy\" not found`) {
		t.Errorf("fork of a sandbox outside the key's labels: %d %s, want 404 as if it did not exist", resp.StatusCode, body)
	}
	resp, body = do(t, ks.base, "", request{method: "PATCH", path: "/v1/sandboxes/box", token: ks.secrets["red"], body: `{"labels":{}}`})
	if resp.StatusCode != http.StatusOK || !fakeHasLabel(ks.fake, "box", "team", "red") {
		t.Errorf("PATCH labels {} of its sandbox by a limited key: %d %s; the sandbox must keep team=red", resp.StatusCode, body)
	}
}

// fakeHasLabel reports whether the fake's sandbox name has k=v.
func fakeHasLabel(f *fakeSandboxes, name, k, v string) bool {
	sb, err := f.Get(context.Background(), name)
	return err == nil && sb.Labels[k] == v
}

// TestKeyCredentials: unknown, revoked and expired keys open nothing, and
// all answer alike; a key cannot make a key above its own scope.
func TestKeyCredentials(t *testing.T) {
	ks := newKeyServer(t)
	get := func(token string) (int, string) {
		resp, body := do(t, ks.base, "", request{method: "GET", path: "/v1/sandboxes", token: token})
		return resp.StatusCode, string(body)
	}
	if st, _ := get(ks.secrets["read"]); st != 200 {
		t.Fatalf("read key: %d", st)
	}
	wantStatus, wantBody := get(api.KeyPrefix + "nosuchkey")
	if wantStatus != http.StatusUnauthorized {
		t.Fatalf("unknown key: %d %s", wantStatus, wantBody)
	}

	keys, err := ks.keys.List(context.Background(), DefaultOrg)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.Secret != "" {
			t.Errorf("List shows the secret of %s", k.ID)
		}
		if k.Name == "read" {
			if k.LastUsedAt == nil {
				t.Errorf("key %s: no last use after a call", k.ID)
			}
			if err := ks.keys.Revoke(context.Background(), DefaultOrg, k.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st, body := get(ks.secrets["read"]); st != wantStatus || body != wantBody {
		t.Errorf("revoked key: %d %s, want what an unknown key gets: %d %s", st, body, wantStatus, wantBody)
	}

	resp, body := do(t, ks.base, "", request{method: "POST", path: "/v1/keys", token: ks.secrets["admin"], body: `{"name":"brief","scope":"read","expires_in":"1ms"}`})
	var brief api.Key
	if err := json.Unmarshal(body, &brief); err != nil || resp.StatusCode != 201 || brief.Secret == "" || brief.ExpiresAt == nil {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	for {
		st, body := get(brief.Secret)
		if st == 200 {
			continue // 1 ms has not passed yet
		}
		if st != wantStatus || body != wantBody {
			t.Errorf("expired key: %d %s, want %d %s", st, body, wantStatus, wantBody)
		}
		break
	}

	for _, c := range []struct{ token, body string }{
		{ks.secrets["write"], `{"name":"x","scope":"read"}`},     // write keys make no keys
		{ks.secrets["admin"], `{"name":"x","scope":"root"}`},     // no such scope
		{ks.secrets["admin"], `{"name":""}`},                     // no name
		{ks.secrets["admin"], `{"name":"x","expires_in":"-1h"}`}, // not a lifetime
	} {
		resp, body := do(t, ks.base, "", request{method: "POST", path: "/v1/keys", token: c.token, body: c.body})
		if resp.StatusCode/100 != 4 {
			t.Errorf("POST /v1/keys %s: %d %s, want a refusal", c.body, resp.StatusCode, body)
		}
	}
}

// TestAuditRecords: each change is recorded once, with the key that made
// it and its outcome; reads are not; an admin reads the log, a write key
// may not.
func TestAuditRecords(t *testing.T) {
	ks := newKeyServer(t)
	w := ks.secrets["write"]
	do(t, ks.base, "", request{method: "GET", path: "/v1/sandboxes", token: w})
	do(t, ks.base, "", request{method: "POST", path: "/v1/sandboxes/box/sleep", token: w})
	do(t, ks.base, "", request{method: "DELETE", path: "/v1/sandboxes/nosuch", token: w})
	do(t, ks.base, "", request{method: "POST", path: "/v1/sandboxes/box/checkpoints", token: ks.secrets["read"], body: "{}"})

	resp, body := do(t, ks.base, "", request{method: "GET", path: "/v1/audit", token: w})
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("audit with a write key: %d %s, want 403", resp.StatusCode, body)
	}
	resp, body = do(t, ks.base, "", request{method: "GET", path: "/v1/audit", token: ks.secrets["admin"]})
	var list api.AuditList
	if err := json.Unmarshal(body, &list); err != nil || resp.StatusCode != 200 {
		t.Fatalf("audit: %d %s", resp.StatusCode, body)
	}
	var got []string
	for _, ev := range list.Events {
		if ev.Org != DefaultOrg || ev.Client == "" || ev.Time.IsZero() || !strings.HasPrefix(ev.Key, "key-") {
			t.Errorf("event %+v: missing org, client, time or key", ev)
		}
		got = append(got, ev.Action+" "+ev.Target+" "+ev.Outcome)
	}
	want := []string{
		"sandbox.sleep sandboxes/box/sleep ok",
		"sandbox.delete sandboxes/nosuch not_found",
		"checkpoint.create sandboxes/box/checkpoints forbidden",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("audit log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
