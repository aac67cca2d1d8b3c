package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"loam.dev/loam/api"
)

// TestReferenceFresh fails when docs/reference/rest.md is not what
// api/openapi.yaml generates: the document changed and the reference was
// not regenerated, or the reference was edited by hand.
func TestReferenceFresh(t *testing.T) {
	want, err := render(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/reference/rest.md")
	if err != nil {
		t.Fatalf("reading the reference: %v (run go generate ./api)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("docs/reference/rest.md is stale: run go generate ./api")
	}
}

// TestRenderEveryRoute checks that the reference has a section for every
// operation and every schema of the document.
func TestRenderEveryRoute(t *testing.T) {
	md, err := render(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			n++
			if !strings.Contains(string(md), "### `"+method+" "+path+"`\n") {
				t.Errorf("no section for %s %s", method, path)
			}
		}
	}
	for name := range doc.Components.Schemas {
		if !strings.Contains(string(md), "\n### "+name+"\n") {
			t.Errorf("no section for schema %s", name)
		}
	}
	if n == 0 {
		t.Fatal("the document has no operations")
	}
}
