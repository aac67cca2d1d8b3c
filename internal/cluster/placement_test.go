package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/store"
)

// fakeSandboxes are the sandbox records placement reads, by name.
type fakeSandboxes map[string]*store.Sandbox

func (f fakeSandboxes) GetSandbox(ctx context.Context, org, ref string) (*store.Sandbox, error) {
	if sb, ok := f[ref]; ok {
		return sb, nil
	}
	return nil, store.ErrNotFound
}

func (f fakeSandboxes) GetImage(ctx context.Context, org, id string) (*store.Image, error) {
	return nil, store.ErrNotFound
}

// fakeShared are the records placement reads: sandboxes by name, and
// images by org and id.
type fakeShared struct {
	fakeSandboxes
	images []*store.Image
}

func (f fakeShared) GetImage(ctx context.Context, org, id string) (*store.Image, error) {
	for _, im := range f.images {
		if im.Org == org && im.ID == id {
			return im, nil
		}
	}
	return nil, store.ErrNotFound
}

// allStored says every checkpoint is in the object store.
type allStored struct{}

func (allStored) Stored(ctx context.Context, sandboxID, ref string) (bool, error) { return true, nil }

// node is a ready sandbox node with free MiB of memory free and cpus CPUs.
func node(name string, free int64, cpus int) *store.Node {
	return &store.Node{Name: name, Address: "http://" + name + ".invalid", LeaseUntil: time.Now().Add(time.Hour),
		Load: api.NodeLoad{Role: RoleNode, CPUs: cpus, MemoryMiB: 8192, MemoryFreeMiB: free}}
}

// placer is the router of node "a" in a cluster of nodes.
func placer(t *testing.T, recs *fakeRecords, sbs SandboxRecords) *Router {
	t.Helper()
	load := func(context.Context) api.NodeLoad { return api.NodeLoad{Role: RoleNode} }
	m, err := Join(context.Background(), recs, Config{Name: "a", Address: "http://a.invalid", Load: load}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return NewRouter(m, sbs, []byte("key"), slog.New(slog.DiscardHandler))
}

// TestPlace: where a create goes, and the answer when nowhere can take it,
// naming each node and what it lacks.
func TestPlace(t *testing.T) {
	cordoned := func(n *store.Node) *store.Node { n.Cordoned = true; return n }
	gone := func(n *store.Node) *store.Node { n.LeaseUntil = time.Now().Add(-time.Minute); return n }
	keeps := func(n *store.Node, held ...string) *store.Node { n.Load.CheckpointTemplates = held; return n }
	cached := func(n *store.Node, tpl ...string) *store.Node { n.Load.Templates = tpl; return n }
	sandboxes := fakeSandboxes{
		"src":  {Sandbox: api.Sandbox{Name: "src", Node: "b", Resources: api.Resources{MemoryMiB: 1024, CPUs: 1}}},
		"big":  {Sandbox: api.Sandbox{Name: "big", Node: "b", Resources: api.Resources{MemoryMiB: 4096, CPUs: 1}}},
		"gone": {Sandbox: api.Sandbox{Name: "gone", Node: "c", Resources: api.Resources{MemoryMiB: 512}}},
	}
	mem := func(mib int, cpus float64) *api.Resources { return &api.Resources{MemoryMiB: mib, CPUs: cpus} }
	// Images of acme: one from a registry and one from a path on a host,
	// unpacked on the nodes whose leases list their trees, and one from a
	// path still being pulled; a path on this test's host is never pulled.
	const (
		regRef  = "index.docker.io/library/python:3.12"
		pathRef = "/srv/images/app.tar"
		pulling = "/srv/images/new.tar"
	)
	here := t.TempDir()
	unpacked := func(n *store.Node, trees ...string) *store.Node { n.Load.Images = trees; return n }
	sbs := fakeShared{fakeSandboxes: sandboxes, images: []*store.Image{
		{Image: api.Image{ID: image.ID(regRef), Ref: regRef, State: api.ImageReady}, Org: "acme", Template: "image-0123456789abcdef"},
		{Image: api.Image{ID: image.ID(pathRef), Ref: pathRef, State: api.ImageReady}, Org: "acme", Template: "image-fedcba9876543210"},
		{Image: api.Image{ID: image.ID(pulling), Ref: pulling, State: api.ImagePulling}, Org: "acme"},
	}}
	const (
		regTree  = "image-0123456789abcdef-0a1b2c3d4e5f"
		pathTree = "image-fedcba9876543210-5f4e3d2c1b0a"
	)
	for _, tc := range []struct {
		name  string
		nodes []*store.Node
		req   api.CreateSandbox
		want  string // the node, or else
		why   string // in the reason
		code  api.Code
		msg   []string // in the message
		// stored: every checkpoint is in the object store.
		stored bool
	}{
		{name: "most memory free", nodes: []*store.Node{node("a", 1000, 2), node("b", 3000, 2)}, want: "b"},
		{name: "the template cached wins a near tie", nodes: []*store.Node{node("a", 1000, 2), cached(node("b", 900, 2), "base-1f2e")},
			req: api.CreateSandbox{Template: "base"}, want: "b"},
		{name: "too few CPUs", nodes: []*store.Node{node("a", 4000, 2), node("b", 1000, 4)}, req: api.CreateSandbox{Resources: mem(512, 4)}, want: "b"},
		{name: "no node has the CPUs", nodes: []*store.Node{node("a", 4000, 2), node("b", 4000, 2)}, req: api.CreateSandbox{Resources: mem(512, 3)},
			code: api.CodeLimit, msg: []string{"512 MiB and 3 CPU", "a has 2 CPUs", "b has 2 CPUs"}},
		{name: "no node has the memory", nodes: []*store.Node{cordoned(node("a", 4000, 2)), node("b", 300, 2), gone(node("c", 9000, 8))},
			code: api.CodeLimit, msg: []string{"a cordoned", "b has 300 MiB free", "c unreachable"}},
		{name: "a fork goes to its checkpoint", nodes: []*store.Node{node("a", 9000, 2), cordoned(node("b", 2000, 2))},
			req: api.CreateSandbox{From: &api.ForkSource{Sandbox: "src", Checkpoint: "cp"}}, want: "b"},
		{name: "a fork whose checkpoint's node is full", nodes: []*store.Node{node("a", 9000, 2), node("b", 2000, 2)},
			req:  api.CreateSandbox{From: &api.ForkSource{Sandbox: "big", Checkpoint: "cp"}},
			code: api.CodeLimit, msg: []string{"its checkpoint is on node b, which has 2000 MiB free", "4096 MiB"}},
		{name: "a fork whose checkpoint's node is down", nodes: []*store.Node{node("a", 9000, 2), gone(node("c", 9000, 2))},
			req:  api.CreateSandbox{From: &api.ForkSource{Sandbox: "gone", Checkpoint: "cp"}},
			code: api.CodeUnavailable, msg: []string{"the checkpoint is on node c, which stopped answering"}},
		{name: "a checkpoint template's node", nodes: []*store.Node{node("a", 9000, 2), keeps(node("b", 1000, 2), "acme/warm")},
			req: api.CreateSandbox{Template: "warm"}, want: "b"},
		{name: "another org's template of the name", nodes: []*store.Node{node("a", 9000, 2), keeps(node("b", 1000, 2), "other/warm")},
			req: api.CreateSandbox{Template: "warm"}, want: "a"},
		{name: "a checkpoint template's node cordoned", nodes: []*store.Node{node("a", 9000, 2), cordoned(keeps(node("b", 9000, 2), "acme/warm"))},
			req:  api.CreateSandbox{Template: "warm"},
			code: api.CodeLimit, msg: []string{"template warm", "the template is on node b, which is cordoned"}},
		{name: "a checkpoint template's node full", nodes: []*store.Node{node("a", 9000, 2), keeps(node("b", 100, 2), "acme/warm")},
			req:  api.CreateSandbox{Template: "warm"},
			code: api.CodeLimit, msg: []string{"the template is on node b, which has 100 MiB free"}},
		{name: "a checkpoint template's node down", nodes: []*store.Node{node("a", 9000, 2), gone(keeps(node("b", 9000, 2), "acme/warm"))},
			req:  api.CreateSandbox{Template: "warm"},
			code: api.CodeUnavailable, msg: []string{"the template is on node b, which stopped answering"}},
		{name: "pinned by the operator", nodes: []*store.Node{node("a", 9000, 2), node("b", 10, 1)},
			req: api.CreateSandbox{Node: "b", Resources: mem(4096, 2)}, want: "b"},
		{name: "a fork pinned to its checkpoint's node", nodes: []*store.Node{node("a", 9000, 2), node("b", 9000, 2)},
			req: api.CreateSandbox{Node: "b", From: &api.ForkSource{Sandbox: "src", Checkpoint: "cp"}}, want: "b"},
		{name: "a fork pinned to another node", nodes: []*store.Node{node("a", 9000, 2), node("b", 9000, 2)},
			req:  api.CreateSandbox{Node: "a", From: &api.ForkSource{Sandbox: "src", Checkpoint: "cp"}},
			code: api.CodeInvalid, msg: []string{"the fork's checkpoint is on node b", "pin it to b"}},
		{name: "a fork pinned to another node, its checkpoint stored", nodes: []*store.Node{node("a", 9000, 2), node("b", 9000, 2)},
			req: api.CreateSandbox{Node: "a", From: &api.ForkSource{Sandbox: "src", Checkpoint: "cp"}}, stored: true,
			want: "a", why: "its checkpoint is stored"},
		{name: "a checkpoint template pinned to another node", nodes: []*store.Node{node("a", 9000, 2), keeps(node("b", 9000, 2), "acme/warm")},
			req:  api.CreateSandbox{Node: "a", Template: "warm"},
			code: api.CodeInvalid, msg: []string{`template "warm" is on node b`}},
		{name: "the image cached wins a near tie", nodes: []*store.Node{node("a", 1000, 2), unpacked(node("b", 900, 2), "image-1111111111111111-000000000000", regTree)},
			req: api.CreateSandbox{Image: regRef}, want: "b", why: "has image " + regRef + " cached"},
		{name: "the image cached by its short reference", nodes: []*store.Node{node("a", 1000, 2), unpacked(node("b", 900, 2), regTree)},
			req: api.CreateSandbox{Image: "python:3.12"}, want: "b"},
		{name: "the image cached loses to far more memory", nodes: []*store.Node{node("a", 3000, 2), unpacked(node("b", 900, 2), regTree)},
			req: api.CreateSandbox{Image: regRef}, want: "a"},
		{name: "another image cached", nodes: []*store.Node{node("a", 1000, 2), unpacked(node("b", 900, 2), pathTree)},
			req: api.CreateSandbox{Image: regRef}, want: "a"},
		{name: "an image not pulled yet", nodes: []*store.Node{unpacked(node("a", 1000, 2), regTree), node("b", 3000, 2)},
			req: api.CreateSandbox{Image: "python:3.13"}, want: "b"},
		{name: "an image from a path goes where it was pulled", nodes: []*store.Node{node("a", 9000, 2), unpacked(node("b", 1000, 2), pathTree)},
			req: api.CreateSandbox{Image: pathRef}, want: "b", why: "from a path on its host"},
		{name: "an image from a path whose node is full", nodes: []*store.Node{node("a", 9000, 2), unpacked(node("b", 100, 2), pathTree)},
			req:  api.CreateSandbox{Image: pathRef},
			code: api.CodeLimit, msg: []string{"image " + pathRef, "it is on node b, which has 100 MiB free"}},
		{name: "an image from a path whose node is down", nodes: []*store.Node{node("a", 9000, 2), gone(unpacked(node("b", 9000, 2), pathTree))},
			req:  api.CreateSandbox{Image: pathRef},
			code: api.CodeUnavailable, msg: []string{"it is on node b, which stopped answering"}},
		{name: "an image from a path being pulled elsewhere", nodes: []*store.Node{node("a", 9000, 2), node("b", 9000, 2)},
			req:  api.CreateSandbox{Image: pulling},
			code: api.CodeConflict, msg: []string{pulling + " is still being pulled"}},
		{name: "an image from a path on this host", nodes: []*store.Node{node("a", 1000, 2), node("b", 9000, 2)},
			req: api.CreateSandbox{Image: here}, want: "a", why: "a path on this node's host"},
		{name: "an image from a path on no host known", nodes: []*store.Node{node("a", 1000, 2), node("b", 9000, 2)},
			req: api.CreateSandbox{Image: "/srv/images/unknown.tar"}, want: "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := placer(t, &fakeRecords{nodes: tc.nodes}, sbs)
			if tc.stored {
				rt.SetStored(allStored{})
			}
			ctx := auth.WithPrincipal(context.Background(), auth.Principal{Org: "acme", Operator: true})
			r := httptest.NewRequestWithContext(ctx, "POST", "/v1/sandboxes", nil)
			got, why, err := rt.choose(r, &tc.req, auth.Principal{Org: "acme", Operator: true})
			if tc.code == "" {
				if err != nil || got != tc.want || !strings.Contains(why, tc.why) {
					t.Fatalf("placed on %q (%s), err %v; want %q (%s)", got, why, err, tc.want, tc.why)
				}
				return
			}
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != tc.code {
				t.Fatalf("placed on %q, err %v; want %s", got, err, tc.code)
			}
			for _, m := range tc.msg {
				if !strings.Contains(ae.Message, m) {
					t.Errorf("message %q lacks %q", ae.Message, m)
				}
			}
		})
	}
}

// TestPlaceTemplate: a template of a checkpoint is made on the node of
// the checkpoint, the call passed there as it came; a call about a
// template another node keeps goes to that node; a name another node's
// template has is refused.
func TestPlaceTemplate(t *testing.T) {
	var (
		mu   sync.Mutex
		hits []string
	)
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := new(bytes.Buffer)
		_, _ = body.ReadFrom(r.Body)
		mu.Lock()
		hits = append(hits, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization")+" "+body.String())
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer b.Close()
	nb := node("b", 1000, 2)
	nb.Address = b.URL
	nb.Load.CheckpointTemplates = []string{"acme/warm"}
	rt := placer(t, &fakeRecords{nodes: []*store.Node{node("a", 9000, 2), nb}}, fakeSandboxes{
		"src": {Sandbox: api.Sandbox{Name: "src", Node: "b"}}, "mine": {Sandbox: api.Sandbox{Name: "mine", Node: "a"}},
	})
	call := func(method, path string, body any, do func(http.ResponseWriter, *http.Request) bool) (bool, *httptest.ResponseRecorder) {
		b, _ := json.Marshal(body)
		ctx := auth.WithPrincipal(context.Background(), auth.Principal{Org: "acme"})
		r := httptest.NewRequestWithContext(ctx, method, path, bytes.NewReader(b))
		r.Header.Set("Authorization", "Bearer k")
		w := httptest.NewRecorder()
		return do(w, r), w
	}
	place := rt.PlaceTemplate
	if done, w := call("POST", "/v1/templates", api.CreateTemplate{Name: "t1", From: &api.ForkSource{Sandbox: "src", Checkpoint: "cp"}}, place); !done || w.Code != http.StatusCreated {
		t.Fatalf("a template of b's checkpoint through a: answered %v, %d", done, w.Code)
	}
	mu.Lock()
	if len(hits) != 1 || !strings.HasPrefix(hits[0], "POST /v1/templates Bearer k {") || !strings.Contains(hits[0], `"t1"`) {
		t.Errorf("b got %q; want the call as it came, with the caller's credentials", hits)
	}
	mu.Unlock()
	if done, _ := call("POST", "/v1/templates", api.CreateTemplate{Name: "t2", From: &api.ForkSource{Sandbox: "mine", Checkpoint: "cp"}}, place); done {
		t.Errorf("a template of a's own checkpoint is passed on")
	}
	done, w := call("POST", "/v1/templates", api.CreateTemplate{Name: "warm", From: &api.ForkSource{Sandbox: "mine", Checkpoint: "cp"}}, place)
	if !done || w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "on node b") {
		t.Errorf("a name b's template has: %v, %d %s; want conflict naming b", done, w.Code, w.Body)
	}
	forward := func(name string) func(http.ResponseWriter, *http.Request) bool {
		return func(w http.ResponseWriter, r *http.Request) bool { return rt.ForwardTemplate(w, r, name) }
	}
	if done, _ := call("DELETE", "/v1/templates/warm", nil, forward("warm")); !done {
		t.Errorf("a delete of b's template is not passed to b")
	}
	if done, _ := call("DELETE", "/v1/templates/base", nil, forward("base")); done {
		t.Errorf("a delete of a template no node keeps is passed on")
	}
	if held := rt.member.HeldElsewhere("acme"); len(held) != 1 || held["warm"] != "b" {
		t.Errorf("HeldElsewhere(acme) = %v, want warm on b", held)
	}
}

// storedAll says every checkpoint is in the object store.
type storedAll struct{}

func (storedAll) Stored(ctx context.Context, sandboxID, ref string) (bool, error) { return true, nil }

// TestPlaceSpreads: the creates placed between two reports of the nodes'
// loads (a count of forks, all placed within a second) spread over equal
// nodes rather than all going to the first, forks of a checkpoint in the
// object store too, its node preferred; what was placed on a node counts
// against its memory until a newer report of the node comes.
func TestPlaceSpreads(t *testing.T) {
	sbs := fakeSandboxes{"src": {Sandbox: api.Sandbox{ID: "sb-000000000001", Name: "src", Node: "b", Resources: api.Resources{MemoryMiB: 1024, CPUs: 1}}}}
	fork := api.CreateSandbox{From: &api.ForkSource{Sandbox: "src", Checkpoint: "cp"}}
	ctx := auth.WithPrincipal(context.Background(), auth.Principal{Org: "acme"})
	r := httptest.NewRequestWithContext(ctx, "POST", "/v1/sandboxes", nil)
	three := func() []*store.Node { return []*store.Node{node("a", 8000, 4), node("b", 8000, 4), node("c", 8000, 4)} }
	place := func(t *testing.T, rt *Router, req api.CreateSandbox) string {
		t.Helper()
		got, why, err := rt.choose(r, &req, auth.Principal{Org: "acme"})
		if err != nil {
			t.Fatalf("placing: %v", err)
		}
		t.Logf("placed on %s: %s", got, why)
		return got
	}
	for _, tc := range []struct {
		name string
		req  api.CreateSandbox
		want string // the nodes picked, in order
	}{
		{name: "creates", want: "abcabcab"},
		// b holds the checkpoint: it is preferred while it is as free.
		{name: "forks of a stored checkpoint", req: fork, want: "bacbacba"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs := &fakeRecords{nodes: three()}
			rt := placer(t, recs, sbs)
			rt.SetStored(storedAll{})
			var got strings.Builder
			for range 8 {
				got.WriteString(place(t, rt, tc.req))
			}
			if got.String() != tc.want {
				t.Fatalf("8 placements went to %s, want %s", got.String(), tc.want)
			}
			// c has had the fewest; then a report of a and b, newer than
			// what went there, leaves them the freest.
			if n := place(t, rt, tc.req); n != "c" {
				t.Errorf("the 9th went to %s, want c", n)
			}
			recs.mu.Lock()
			for _, n := range recs.nodes[:2] {
				n.RenewedAt = time.Now()
			}
			recs.mu.Unlock()
			if err := rt.member.readNodes(ctx); err != nil {
				t.Fatal(err)
			}
			if n := place(t, rt, api.CreateSandbox{}); n != "a" {
				t.Errorf("after a report of a and b, a create went to %s, want a", n)
			}
		})
	}

	t.Run("what was placed is not free", func(t *testing.T) {
		rt := placer(t, &fakeRecords{nodes: []*store.Node{node("a", 1500, 4), node("b", 1200, 4)}}, sbs)
		big := api.CreateSandbox{Resources: &api.Resources{MemoryMiB: 1024}}
		if a, b := place(t, rt, big), place(t, rt, big); a != "a" || b != "b" {
			t.Fatalf("two creates of 1024 MiB went to %s and %s, want a and b", a, b)
		}
		_, _, err := rt.choose(r, &big, auth.Principal{Org: "acme"})
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeLimit || !strings.Contains(ae.Message, "a has 1500 MiB free, less 1 sandbox (1024 MiB) placed there since its last report") {
			t.Errorf("a third: %v; want limit, saying what was placed on a", err)
		}
	})

	t.Run("a stored checkpoint whose node is gone", func(t *testing.T) {
		gone := node("b", 8000, 4)
		gone.LeaseUntil = time.Now().Add(-time.Minute)
		rt := placer(t, &fakeRecords{nodes: []*store.Node{node("a", 1000, 4), gone, node("c", 3000, 4)}}, sbs)
		rt.SetStored(storedAll{})
		got, why, err := rt.choose(r, &fork, auth.Principal{Org: "acme"})
		if err != nil || got != "c" || !strings.Contains(why, "its checkpoint is stored and its node b stopped answering") {
			t.Errorf("placed on %q (%s), %v; want c, saying b stopped answering", got, why, err)
		}
	})
}
