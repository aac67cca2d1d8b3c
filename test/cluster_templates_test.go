package test

import (
	"fmt"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store/postgres/pgtest"
	"loam.dev/loam/test/harness"
)

// TestClusterTemplates: until templates travel, a checkpoint template is
// on one node. Made through the node that does not hold its checkpoint, it
// is made on the one that does (b), which reports it with its lease; both
// nodes list it, naming b; a sandbox of it made through either is placed
// on b,
// and with b cordoned a create of it answers limit, naming b and why. A
// delete through a is b's to answer. A sandbox asking for more CPUs than
// any node has answers limit, naming each node's.
func TestClusterTemplates(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	a := startNode(t, url, "a", "")
	b := startNode(t, url, "b", a.Token)
	ctx := harness.Ctx(t)

	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "tsrc", Node: "b"}); err != nil {
		t.Fatal(err)
	}
	a.Run("tsrc", "sh", "-c", "echo kept-on-b > /home/loam/mark")
	diskOnly := false
	cp, err := a.C.CreateCheckpoint(ctx, "tsrc", api.CreateCheckpoint{Memory: &diskOnly})
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := a.C.CreateTemplate(ctx, "kept", "tsrc", cp.ID)
	if err != nil {
		t.Fatalf("a template of b's checkpoint through a: %v", err)
	}
	if tpl.Node != "b" || tpl.From != "tsrc/"+cp.ID {
		t.Errorf("the template made through a: %+v, want it on b", tpl)
	}
	if _, err := b.C.CreateTemplate(ctx, "kept", "tsrc", cp.ID); harness.APICode(err) != api.CodeConflict {
		t.Errorf("the template's name again through b: %v, want conflict", err)
	}
	// b's lease tells of it (the answer against the API's document).
	(&walker{t: t, d: a.Daemon, c: newConformance(t)}).json(req{route: "GET /v1/nodes", path: "/v1/nodes"}, 200, &api.NodeList{})
	if nd := a.nodes(t)["b"]; !slices.ContainsFunc(nd.CheckpointTemplates, func(k string) bool { return strings.HasSuffix(k, "/kept") }) {
		t.Errorf("b's lease: checkpoint templates %v, want kept", nd.CheckpointTemplates)
	}
	if nd := a.nodes(t)["a"]; len(nd.CheckpointTemplates) != 0 {
		t.Errorf("a's lease: checkpoint templates %v, want none", nd.CheckpointTemplates)
	}
	for _, n := range []*clusterNode{a, b} {
		// The answers, against the API's document.
		doc := &walker{t: t, d: n.Daemon, c: newConformance(t)}
		harness.Eventually(t, 10*time.Second, "kept listed through "+n.name, func() error {
			var tl api.TemplateList
			doc.json(req{route: "GET /v1/templates", path: "/v1/templates"}, 200, &tl)
			for _, t := range tl.Templates {
				if t.Name == "kept" {
					if t.Node != "b" || t.Kind != api.TemplateCheckpoint {
						return fmt.Errorf("kept listed as %+v, want a checkpoint template on b", t)
					}
					return nil
				}
			}
			return fmt.Errorf("kept not listed")
		})
	}

	// A sandbox of it, through a, is made on b.
	sb, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "of-kept", Template: "kept"})
	if err != nil {
		t.Fatalf("a sandbox of template kept through a: %v", err)
	}
	if sb.Node != "b" || sb.Template != "kept" {
		t.Errorf("a sandbox of template kept through a: node %q template %q, want on b", sb.Node, sb.Template)
	}
	if out := a.Run("of-kept", "cat", "/home/loam/mark"); strings.TrimSpace(out) != "kept-on-b" {
		t.Errorf("of-kept's disk: %q, want the checkpoint's", out)
	}
	// Through b, which keeps it, it is made there without passing on.
	if sb, err := b.C.CreateSandbox(ctx, api.CreateSandbox{Name: "of-kept-b", Template: "kept"}); err != nil || sb.Node != "b" {
		t.Errorf("a sandbox of template kept through b: %+v, %v; want it on b", sb, err)
	} else if err := b.C.DeleteSandbox(ctx, "of-kept-b"); err != nil {
		t.Error(err)
	}
	if err := a.C.DeleteTemplate(ctx, "kept"); harness.APICode(err) != api.CodeConflict || !strings.Contains(err.Error(), "of-kept") {
		t.Errorf("a delete through a of the template of-kept uses: %v, want b's conflict", err)
	}

	// More CPUs than any node has: limit, naming each.
	want := goruntime.NumCPU() + 1
	_, err = a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "wide", Resources: &api.Resources{CPUs: float64(want)}})
	if harness.APICode(err) != api.CodeLimit || !strings.Contains(err.Error(), fmt.Sprintf("a has %d CPUs", want-1)) || !strings.Contains(err.Error(), fmt.Sprintf("b has %d CPUs", want-1)) {
		t.Errorf("a sandbox of %d CPUs: %v, want limit naming each node's CPUs", want, err)
	}

	// b cordoned: a sandbox of its template has nowhere to go.
	if _, err := a.C.CordonNode(ctx, "b", true); err != nil {
		t.Fatal(err)
	}
	i := 0
	harness.Eventually(t, 10*time.Second, "a create of kept refused with b cordoned", func() error {
		i++
		name := fmt.Sprintf("nowhere-%d", i)
		sb, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: name, Template: "kept"})
		if err == nil {
			// a had not read the cordon yet.
			_ = a.C.DeleteSandbox(ctx, name)
			return fmt.Errorf("made on %s", sb.Node)
		}
		if harness.APICode(err) != api.CodeLimit || !strings.Contains(err.Error(), "the template is on node b, which is cordoned") {
			t.Fatalf("a create of kept with b cordoned: %v, want limit naming b", err)
		}
		return nil
	})
	if _, err := a.C.CordonNode(ctx, "b", false); err != nil {
		t.Fatal(err)
	}

	if err := a.C.DeleteSandbox(ctx, "of-kept"); err != nil {
		t.Fatal(err)
	}
	if err := a.C.DeleteTemplate(ctx, "kept"); err != nil {
		t.Fatalf("a delete through a of b's template: %v", err)
	}
	list, err := b.C.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range list {
		if tp.Name == "kept" {
			t.Errorf("kept listed through b after its delete: %+v", tp)
		}
	}
}
