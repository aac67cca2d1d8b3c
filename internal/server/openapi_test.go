package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"loam.dev/loam/api"
)

// TestRoutesDocumented checks that api/openapi.yaml documents every route
// the server registers and no route it lacks, so a new route without
// documentation fails here (and in test/TestOpenAPIConformance, which
// checks the answers too).
func TestRoutesDocumented(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented[method+" "+path] = true
		}
	}
	routes := Routes()
	if len(routes) < 40 {
		t.Fatalf("Routes() lists %d routes; the API has more than 40", len(routes))
	}
	for _, r := range routes {
		if !documented[r] {
			t.Errorf("route %s is not in api/openapi.yaml", r)
		}
		delete(documented, r)
	}
	for r := range documented {
		t.Errorf("api/openapi.yaml documents %s, which the server does not serve", r)
	}
}

// TestOpenAPIServed checks that the document is served as it is embedded,
// as YAML, without a token.
func TestOpenAPIServed(t *testing.T) {
	srv := httptest.NewServer(New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/yaml" {
		t.Fatalf("status %d, Content-Type %q; want 200 application/yaml", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if string(body) != string(api.OpenAPI) || !strings.HasPrefix(string(body), "openapi: 3.1") {
		t.Fatalf("body is not the embedded document (%d bytes, want %d)", len(body), len(api.OpenAPI))
	}
}
