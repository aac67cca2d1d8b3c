package test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/console"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/image/imagetest"
	"loam.dev/loam/internal/server"
	"loam.dev/loam/test/harness"
)

// routePath is rt's pattern made a request about sandbox sb (its
// checkpoint v1, service web, …), with a body for the methods that take
// one.
func routePath(pattern, sb string) (method, path, body string) {
	method, path, _ = strings.Cut(pattern, " ")
	path = strings.NewReplacer(
		"{sandbox}", sb, "{checkpoint}", "v1", "{template}", "busybox", "{image}", "img",
		"{registry}", "ghcr.io", "{name}", "S", "{service}", "web", "{session}", "s1",
		"{port}", "8080", "{key}", "key-nosuchkey000", "{org}", "docs",
	).Replace(path)
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		body = "{}"
	}
	return method, path, body
}

// TestOrgs holds orgs to their promises on real sandboxes: the operator
// makes orgs and their first keys; the same name in two orgs is two
// sandboxes, each at its own URL; every route about a sandbox, called with
// another org's key (as a bearer, and through a console session), answers
// exactly as for a sandbox that does not exist (generated from the route
// table, so a new route cannot be missed), as does the in-sandbox API of
// another org's sandbox, and changes nothing; warm pools are each org's; the front door does the same; an org with sandboxes is
// deleted only with all=true, and its keys with it.
func TestOrgs(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	op := client.New(d.URL, d.Token)

	keys := map[string]string{}
	for _, org := range []string{"docs", "ops"} {
		if o, err := op.CreateOrg(ctx, org); err != nil || o.Name != org {
			t.Fatalf("CreateOrg(%s): %+v, %v", org, o, err)
		}
		k, err := op.CreateOrgKey(ctx, org, api.CreateKey{Name: org + "-admin", Scope: api.ScopeAdmin})
		if err != nil || k.Org != org || k.Secret == "" {
			t.Fatalf("CreateOrgKey(%s): %+v, %v", org, k, err)
		}
		keys[org] = k.Secret
	}
	if _, err := op.CreateOrg(ctx, "docs"); harness.APICode(err) != api.CodeConflict {
		t.Errorf("CreateOrg(docs) again: %v, want conflict", err)
	}
	if _, err := op.CreateOrg(ctx, "Bad--Org"); harness.APICode(err) != api.CodeInvalid {
		t.Errorf("CreateOrg(Bad--Org): %v, want invalid", err)
	}
	if _, err := op.CreateOrgKey(ctx, "nosuch", api.CreateKey{Name: "x"}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("CreateOrgKey(nosuch): %v, want not_found", err)
	}
	docs, ops := client.New(d.URL, keys["docs"]), client.New(d.URL, keys["ops"])
	if o, err := docs.Org(ctx); err != nil || o.Name != "docs" {
		t.Errorf("the docs key's org: %+v, %v", o, err)
	}

	// The same name in two orgs: two sandboxes, each at its org's URL.
	serve := func(c *client.Client, org string) *api.Sandbox {
		t.Helper()
		sb, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "web"})
		if err != nil {
			t.Fatalf("web in %s: %v", org, err)
		}
		if _, _, code, err := c.Output(ctx, "web", "sh", "-c", "mkdir -p www && echo "+org+" > www/index.html"); err != nil || code != 0 {
			t.Fatalf("web in %s: %d %v", org, code, err)
		}
		if _, err := c.PutService(ctx, "web", api.Service{Name: "web", Cmd: []string{"httpd", "-f", "-p", "8080", "-h", "www"}}); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	docsWeb, opsWeb := serve(docs, "docs"), serve(ops, "ops")
	if docsWeb.ID == opsWeb.ID || !strings.HasPrefix(docsWeb.URL, "http://web--docs.") || !strings.HasPrefix(opsWeb.URL, "http://web--ops.") {
		t.Fatalf("web in two orgs: %s %s, %s %s", docsWeb.ID, docsWeb.URL, opsWeb.ID, opsWeb.URL)
	}
	only, err := docs.CreateSandbox(ctx, api.CreateSandbox{Name: "only"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, code, err := docs.Output(ctx, "only", "sh", "-c", "echo kept > mark"); err != nil || code != 0 {
		t.Fatalf("writing a mark: %d %v", code, err)
	}
	if _, err := docs.CreateCheckpoint(ctx, "only", api.CreateCheckpoint{}); err != nil {
		t.Fatal(err)
	}

	// Secrets are the org's: the same name in two orgs is two secrets,
	// and a sandbox has its own org's.
	for org, c := range map[string]*client.Client{"docs": docs, "ops": ops} {
		if _, err := c.PutSecret(ctx, "db", org+"-pass"); err != nil {
			t.Fatalf("PutSecret(db) in %s: %v", org, err)
		}
	}
	if _, err := docs.PutSecret(ctx, "docs-only", "x"); err != nil {
		t.Fatal(err)
	}
	if list, err := ops.ListSecrets(ctx); err != nil || len(list) != 1 || list[0].Name != "db" {
		t.Errorf("ops's secrets: %v, %v; want its db alone", list, err)
	}
	if _, err := ops.CreateSandbox(ctx, api.CreateSandbox{Name: "thief", Secrets: map[string]string{"X": "docs-only"}}); harness.APICode(err) != api.CodeInvalid {
		t.Errorf("a sandbox of ops given docs' secret: %v, want invalid (no such secret)", err)
	}
	if err := ops.DeleteSecret(ctx, "docs-only", true); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("ops deleting docs' secret: %v, want not_found", err)
	}
	if _, err := docs.CreateSandbox(ctx, api.CreateSandbox{Name: "withdb", Secrets: map[string]string{"DB": "db"}}); err != nil {
		t.Fatal(err)
	}
	if out, _, _, err := docs.Output(ctx, "withdb", "sh", "-c", "echo $DB"); err != nil || strings.TrimSpace(string(out)) != "docs-pass" {
		t.Errorf("docs' sandbox's DB: %q, %v; want docs' own value", out, err)
	}

	// The built-in templates are every org's, and no org's to delete;
	// images and registry credentials are each org's (TestOrgImages).
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/v1/templates", 200},
		{"DELETE", "/v1/templates/busybox", 403},
		{"GET", "/v1/registries", 200},
		{"PUT", "/v1/registries/ghcr.io", 400},
	} {
		if st, body := d.CurlAs(keys["ops"], tc.method, tc.path, "{}"); st != tc.status {
			t.Errorf("%s %s with a key of ops: %d %s, want %d", tc.method, tc.path, st, body, tc.status)
		}
	}

	uc := urlClient(d)
	for _, tc := range []struct {
		url, key string
		status   int
		body     string
	}{
		{docsWeb.URL, keys["docs"], 200, "docs"},
		{opsWeb.URL, keys["ops"], 200, "ops"},
		{docsWeb.URL, keys["ops"], 404, ""},
		{strings.Replace(docsWeb.URL, "web--docs", "only--docs", 1), keys["ops"], 404, ""},
	} {
		harness.Eventually(t, 30*time.Second, "the URL answers", func() error {
			status, body, _, err := fetch(ctx, uc, "GET", tc.url+"/", http.Header{"Authorization": {"Bearer " + tc.key}}, "")
			if err != nil || status != tc.status || !strings.Contains(body, tc.body) {
				return errors.New(tc.url + ": " + http.StatusText(status) + " " + body)
			}
			return nil
		})
	}
	// The front door answers a key of another org as for no such sandbox.
	_, none, _, _ := fetch(ctx, uc, "GET", strings.Replace(docsWeb.URL, "web--docs", "nosuch--docs", 1)+"/", http.Header{"Authorization": {"Bearer " + keys["ops"]}}, "")
	_, got, _, _ := fetch(ctx, uc, "GET", strings.Replace(docsWeb.URL, "web--docs", "only--docs", 1)+"/", http.Header{"Authorization": {"Bearer " + keys["ops"]}}, "")
	if strings.ReplaceAll(got, "only", "nosuch") != none {
		t.Errorf("the front door, org docs' sandbox with a key of ops: %q; for no such sandbox: %q", got, none)
	}

	// The isolation matrix: every route about a sandbox, with org ops's
	// key (as a bearer token, and through a console session it logged in
	// with), about org docs's sandbox (by name and by id) answers as about
	// one that does not exist.
	n := 0
	cookie, csrf := d.ConsoleLogin(keys["ops"])
	for via, call := range map[string]func(method, path, body string) (int, string){
		"a key of ops": func(method, path, body string) (int, string) { return d.CurlAs(keys["ops"], method, path, body) },
		"ops's console session": func(method, path, body string) (int, string) {
			return consoleCall(t, d, cookie, csrf, method, path, body)
		},
	} {
		for _, rt := range server.RouteTable() {
			if !strings.Contains(rt.Pattern, "{sandbox}") {
				continue
			}
			for _, ref := range []string{"only", only.ID} {
				method, path, body := routePath(rt.Pattern, ref)
				st, gotBody := call(method, path, body)
				method, path, body = routePath(rt.Pattern, "nosuch")
				wantSt, wantBody := call(method, path, body)
				if st != wantSt || strings.ReplaceAll(gotBody, ref, "nosuch") != wantBody {
					t.Errorf("%s about org docs' %s with %s: %d %s; for no such sandbox: %d %s", rt.Pattern, ref, via, st, gotBody, wantSt, wantBody)
				}
				n++
			}
		}
	}
	// The in-sandbox API of ops's sandbox: its credential reaches its own
	// sandbox alone, and docs' answers as one that does not exist.
	for _, args := range [][]string{{"checkpoint", "ls"}, {"checkpoint", "create"}, {"checkpoint", "restore", "-y"}} {
		inside := func(ref string) string {
			cmd := append([]string{"loam"}, args...)
			cmd = append(cmd, ref)
			if args[1] == "restore" {
				cmd = append(cmd, "v1")
			}
			out, errOut, code, err := ops.Output(ctx, "web", cmd...)
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("%d %s %s", code, out, errOut)
		}
		want := inside("nosuch")
		for _, ref := range []string{"only", only.ID} {
			if got := inside(ref); strings.ReplaceAll(got, ref, "nosuch") != want || strings.HasPrefix(got, "0 ") {
				t.Errorf("loam %v %s inside ops's web: %q; for no such sandbox: %q", args, ref, got, want)
			}
			n++
		}
	}
	for _, ref := range []string{"only", only.ID} {
		_, err := ops.CreateSandbox(ctx, api.CreateSandbox{Name: "stolen", From: &api.ForkSource{Sandbox: ref, Checkpoint: "v1"}})
		if !errors.Is(err, api.ErrNotFound) {
			t.Errorf("a fork of org docs' %s by ops: %v, want not_found", ref, err)
		}
	}
	t.Logf("%d calls about another org's sandbox, each as for none", n)
	// The streams (WebSockets) alike: exec, a port stream, a watch.
	for _, ref := range []string{"only", only.ID} {
		if _, err := ops.Exec(ctx, ref, client.ExecOptions{Cmd: []string{"true"}}); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("an exec stream in org docs' %s with a key of ops: %v, want not_found", ref, err)
		}
		if c, err := ops.DialPort(ctx, ref, 8080); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("a port stream to org docs' %s with a key of ops: %v, want not_found", ref, err)
			if c != nil {
				c.Close()
			}
		}
		if w, err := ops.Watch(ctx, ref, "/home/loam", nil); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("a watch of org docs' %s with a key of ops: %v, want not_found", ref, err)
			if w != nil {
				w.Close()
			}
		}
	}
	if list, err := ops.ListSandboxes(ctx, client.ListOptions{}); err != nil || len(list) != 1 || list[0].ID != opsWeb.ID {
		t.Errorf("ops's list: %v, %v; want its web alone", list, err)
	}

	// Nothing of docs changed.
	if sb, err := docs.GetSandbox(ctx, "only"); err != nil || sb.State != api.StateRunning {
		t.Errorf("docs' only after ops's calls: %+v, %v; want it running", sb, err)
	}
	if cps, err := docs.ListCheckpoints(ctx, "only"); err != nil || len(cps) != 1 {
		t.Errorf("docs' only's checkpoints: %v, %v; want its one", cps, err)
	}
	if out, _, code, err := docs.Output(ctx, "only", "cat", "mark"); err != nil || code != 0 || strings.TrimSpace(string(out)) != "kept" {
		t.Errorf("docs' only's mark: %q %d %v", out, code, err)
	}

	// Checkpoint templates are the org's: docs' is not ops's, by list,
	// create or delete, and a sandbox of it has docs' data.
	cps, err := docs.ListCheckpoints(ctx, "only")
	if err != nil || len(cps) != 1 {
		t.Fatalf("docs' only's checkpoints: %v, %v", cps, err)
	}
	// A template is admitted to the org's disk quota by what it will
	// hold before it is made, and counts in its use once made.
	before, err := docs.Org(ctx)
	if err != nil {
		t.Fatal(err)
	}
	disk := before.Use.DiskMiB
	if _, err := op.SetQuota(ctx, "docs", api.Quota{DiskMiB: &disk}); err != nil {
		t.Fatal(err)
	}
	if _, err := docs.CreateTemplate(ctx, "kept", "only", cps[0].ID); harness.APICode(err) != api.CodeLimit || !strings.Contains(err.Error(), "disk") {
		t.Errorf("docs' template at its disk quota's edge: %v, want limit naming the disk", err)
	}
	if _, err := op.SetQuota(ctx, "docs", api.Quota{}); err != nil {
		t.Fatal(err)
	}
	if _, err := docs.CreateTemplate(ctx, "kept", "only", cps[0].ID); err != nil {
		t.Fatalf("docs' template: %v", err)
	}
	if after, err := docs.Org(ctx); err != nil || after.Use.DiskMiB <= disk {
		t.Errorf("docs' disk use with its template: %+v, %v; want more than %d MiB", after, err, disk)
	}
	if _, err := docs.CreateSandbox(ctx, api.CreateSandbox{Name: "of-kept", Template: "kept"}); err != nil {
		t.Fatalf("docs' sandbox of its template: %v", err)
	}
	if out, _, code, err := docs.Output(ctx, "of-kept", "cat", "mark"); err != nil || code != 0 || strings.TrimSpace(string(out)) != "kept" {
		t.Errorf("the mark in docs' sandbox of its template: %q %d %v", out, code, err)
	}
	if st, body := d.CurlAs(keys["ops"], "GET", "/v1/templates", ""); st != 200 || strings.Contains(body, `"kept"`) {
		t.Errorf("ops's templates: %d %s; want none of docs'", st, body)
	}
	if _, err := ops.CreateSandbox(ctx, api.CreateSandbox{Name: "of-kept", Template: "kept"}); harness.APICode(err) != api.CodeInvalid {
		t.Errorf("ops's sandbox of docs' template: %v, want invalid, as for a template that does not exist", err)
	}
	if err := ops.DeleteTemplate(ctx, "kept"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("ops deleting docs' template: %v, want not_found", err)
	}
	if err := docs.DeleteSandbox(ctx, "of-kept"); err != nil {
		t.Fatal(err)
	}

	// Warm pools of templates are each org's, of a built-in too: ops's
	// pool of busybox is its own, counted in its use and claimed by its
	// creates alone; docs keeps one of its own template, which ops cannot
	// see. docs' goes with docs (below).
	if p, err := ops.SetTemplatePool(ctx, "busybox", 1); err != nil || p.Size != 1 {
		t.Fatalf("ops's pool of busybox: %+v, %v", p, err)
	}
	if p, err := docs.SetTemplatePool(ctx, "kept", 1); err != nil || p.Size != 1 {
		t.Fatalf("docs' pool of its template: %+v, %v", p, err)
	}
	if _, err := ops.TemplatePool(ctx, "kept"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("ops reading docs' template's pool: %v, want not_found", err)
	}
	if _, err := ops.SetTemplatePool(ctx, "kept", 1); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("ops sizing docs' template's pool: %v, want not_found", err)
	}
	harness.Eventually(t, 2*time.Minute, "both orgs' pools filled", func() error {
		o, err := ops.TemplatePool(ctx, "busybox")
		if err != nil {
			return err
		}
		k, err := docs.TemplatePool(ctx, "kept")
		if err != nil {
			return err
		}
		if o.Ready != 1 || k.Ready != 1 {
			return fmt.Errorf("ops's busybox %+v, docs' kept %+v", o, k)
		}
		return nil
	})
	if p, err := docs.TemplatePool(ctx, "busybox"); err != nil || p.Size != 0 || p.Ready != 0 {
		t.Errorf("docs' pool of busybox: %+v, %v; want none (ops's is ops's)", p, err)
	}
	for c, want := range map[*client.Client]int{ops: 1, docs: 1, op: 0} {
		if o, err := c.Org(ctx); err != nil || o.Use.PoolMembers != want {
			t.Errorf("the pool members of %+v: %v; want %d", o, err, want)
		}
	}
	if _, err := ops.CreateSandbox(ctx, api.CreateSandbox{Name: "pooled", Template: "busybox"}); err != nil {
		t.Fatal(err)
	}
	if p, err := ops.TemplatePool(ctx, "busybox"); err != nil || p.Claimed != 1 {
		t.Errorf("ops's pool after its create: %+v, %v; want its member claimed", p, err)
	}
	if p, err := docs.TemplatePool(ctx, "kept"); err != nil || p.Claimed != 0 || p.Ready != 1 {
		t.Errorf("docs' pool after ops's create: %+v, %v; want its member there", p, err)
	}
	if _, err := ops.SetTemplatePool(ctx, "busybox", 0); err != nil {
		t.Fatal(err)
	}
	if err := ops.DeleteSandbox(ctx, "pooled"); err != nil {
		t.Fatal(err)
	}

	// An org with sandboxes goes only with everything in it; its keys
	// and templates with it. The daemon's own org never goes.
	if err := op.DeleteOrg(ctx, "docs", false); harness.APICode(err) != api.CodeConflict {
		t.Errorf("DeleteOrg(docs) with sandboxes: %v, want conflict", err)
	}
	if err := op.DeleteOrg(ctx, "default", true); harness.APICode(err) != api.CodeConflict {
		t.Errorf("DeleteOrg(default): %v, want conflict", err)
	}
	if err := docs.DeleteOrg(ctx, "ops", true); harness.APICode(err) != api.CodeForbidden {
		t.Errorf("DeleteOrg by an org's key: %v, want forbidden", err)
	}
	if err := op.DeleteOrg(ctx, "docs", true); err != nil {
		t.Fatalf("DeleteOrg(docs, all): %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.DataDir, "org-templates", "docs")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the templates of deleted org docs: %v, want them gone", err)
	}
	if b, err := os.ReadFile(filepath.Join(d.DataDir, "pools.json")); err != nil || strings.Contains(string(b), `"docs"`) {
		t.Errorf("the pools kept after docs went: %s, %v; want none of docs'", b, err)
	}
	if _, err := docs.ListSandboxes(ctx, client.ListOptions{}); harness.APICode(err) != api.CodeUnauthorized {
		t.Errorf("the key of a deleted org: %v, want unauthorized", err)
	}
	if err := op.DeleteOrg(ctx, "docs", true); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("DeleteOrg(docs) again: %v, want not_found", err)
	}
	orgs, err := op.ListOrgs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range orgs {
		names = append(names, o.Name)
	}
	if strings.Join(names, ",") != "default,ops" {
		t.Errorf("orgs after deleting docs: %v, want default,ops", names)
	}
	if sb, err := ops.GetSandbox(ctx, "web"); err != nil || sb.ID != opsWeb.ID || sb.State != api.StateRunning {
		t.Errorf("ops's web after docs went: %+v, %v", sb, err)
	}
	for _, m := range harness.MountsUnder(d.DataDir) {
		if strings.Contains(m, docsWeb.ID) || strings.Contains(m, only.ID) {
			t.Errorf("a mount of a deleted org's sandbox is left: %s", m)
		}
	}
}

// consoleCall makes an API call as the console's page does: with the
// session's cookie and CSRF token, no bearer.
func consoleCall(t *testing.T, d *harness.Daemon, cookie *http.Cookie, csrf, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, d.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(cookie)
	req.Header.Set(console.CSRFHeader, csrf)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestOrgImages: images and registry credentials are each org's. An org
// pulls with its own credentials, and another org's pull of the same
// private ref fails without its own, though the layers are on the host
// already; neither sees nor deletes the other's image or credentials;
// only the daemon's own org pulls from the host's files.
func TestOrgImages(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	reg := imagetest.Registry(t, "alice", "s3cret")
	ref := reg + "/private:v1"
	// A layer of its own: a digest no other test's image has, since the
	// daemons of the tests share one template cache.
	imagetest.Push(t, ref, imagetest.Image(t, imagetest.BusyboxConfig, imagetest.Busybox(t),
		imagetest.Layer(t, imagetest.Entry{Name: "etc/org-images", Body: []byte(t.Name() + time.Now().String())})), "alice", "s3cret")
	id := image.ID(ref)

	op := client.New(d.URL, d.Token)
	orgs := map[string]*client.Client{}
	for _, org := range []string{"docs", "ops"} {
		if _, err := op.CreateOrg(ctx, org); err != nil {
			t.Fatal(err)
		}
		k, err := op.CreateOrgKey(ctx, org, api.CreateKey{Name: org + "-admin", Scope: api.ScopeAdmin})
		if err != nil {
			t.Fatal(err)
		}
		orgs[org] = client.New(d.URL, k.Secret)
	}
	docs, ops := orgs["docs"], orgs["ops"]

	if _, err := docs.LoginRegistry(ctx, reg, "alice", "s3cret"); err != nil {
		t.Fatal(err)
	}
	if _, err := docs.CreateSandbox(ctx, api.CreateSandbox{Name: "app", Image: ref}); err != nil {
		t.Fatalf("docs' sandbox of its private image: %v", err)
	}
	if list, err := docs.ListRegistries(ctx); err != nil || len(list) != 1 {
		t.Errorf("docs' registries: %v, %v; want its login", list, err)
	}
	for who, c := range map[string]*client.Client{"ops": ops, "the daemon's org": op} {
		if list, err := c.ListRegistries(ctx); err != nil || len(list) != 0 {
			t.Errorf("%s's registries: %v, %v; want none", who, list, err)
		}
		if list, err := c.ListImages(ctx); err != nil || len(list) != 0 {
			t.Errorf("%s's images: %v, %v; want none", who, list, err)
		}
		if _, err := c.GetImage(ctx, id); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("%s getting docs' image: %v, want not_found", who, err)
		}
		if err := c.DeleteImage(ctx, id); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("%s deleting docs' image: %v, want not_found", who, err)
		}
		if err := c.LogoutRegistry(ctx, reg); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("%s logging docs out: %v, want not_found", who, err)
		}
	}
	if list, err := docs.ListImages(ctx); err != nil || len(list) != 1 || list[0].ID != id || list[0].State != api.ImageReady {
		t.Fatalf("docs' images: %+v, %v; want its pull, ready", list, err)
	}

	// The layers are on the host, but ops cannot read the manifest.
	if _, err := ops.CreateSandbox(ctx, api.CreateSandbox{Name: "thief", Image: ref}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("ops' sandbox of docs' private image, without credentials: %v, want invalid (the pull fails)", err)
	}
	if _, err := ops.PullImage(ctx, "/etc"); harness.APICode(err) != api.CodeForbidden {
		t.Errorf("ops pulling from the daemon's host: %v, want forbidden", err)
	}
	if _, err := ops.LoginRegistry(ctx, reg, "alice", "s3cret"); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.CreateSandbox(ctx, api.CreateSandbox{Name: "app", Image: ref}); err != nil {
		t.Fatalf("ops' sandbox of the image, with its own credentials: %v", err)
	}
	// Two images, one each; deleting ops' leaves docs' and its sandbox.
	if err := docs.DeleteImage(ctx, id); !errors.Is(err, api.ErrConflict) {
		t.Errorf("docs deleting its image in use: %v, want conflict", err)
	}
	if err := ops.DeleteSandbox(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if err := ops.DeleteImage(ctx, id); err != nil {
		t.Fatalf("ops deleting its image: %v", err)
	}
	if list, err := docs.ListImages(ctx); err != nil || len(list) != 1 {
		t.Errorf("docs' images after ops deleted its own: %v, %v", list, err)
	}
	if out, _, code, err := docs.Output(ctx, "app", "sh", "-c", "echo up"); err != nil || code != 0 || strings.TrimSpace(string(out)) != "up" {
		t.Errorf("docs' sandbox after ops deleted its image: %q %d %v", out, code, err)
	}
	if err := docs.DeleteSandbox(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if err := docs.DeleteImage(ctx, id); err != nil {
		t.Errorf("docs deleting its image: %v", err)
	}
}
