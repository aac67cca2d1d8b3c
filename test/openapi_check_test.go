package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/server"
)

// conformance checks a daemon's answers against api/openapi.yaml. It is
// kin-openapi for the document and its JSON Schema 2020-12 validation; what
// it adds is the bookkeeping: which routes were walked, and which
// properties of the documented schemas the daemon ever sent, so that a
// documented field no answer holds fails the test as much as an answer the
// document does not allow.
type conformance struct {
	doc *openapi3.T

	mu sync.Mutex
	// walked holds the routes ("GET /v1/sandboxes/{sandbox}") that gave at
	// least one checked successful answer.
	walked map[string]bool
	// props holds every property ("Sandbox.url") of every schema an
	// answer was checked against; seen those an answer held.
	props, seen map[string]bool
}

func newConformance(t *testing.T) *conformance {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatalf("loading api/openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	return &conformance{doc: doc, walked: map[string]bool{}, props: map[string]bool{}, seen: map[string]bool{}}
}

// clusterOnly marks the documented fields and routes whose successful
// answers only a cluster gives (a daemon alone never does) as seen and
// walked: TestCluster checks those answers against the document.
func (c *conformance) clusterOnly(props, routes []string) {
	for _, p := range props {
		c.seen[p] = true
	}
	for _, r := range routes {
		c.walked[r] = true
	}
}

// operation is the documented operation of route ("METHOD /path/{param}").
func (c *conformance) operation(route string) (*openapi3.Operation, error) {
	method, path, _ := strings.Cut(route, " ")
	item := c.doc.Paths.Find(path)
	if item == nil {
		return nil, fmt.Errorf("path %s is not documented", path)
	}
	op := item.GetOperation(method)
	if op == nil {
		return nil, fmt.Errorf("%s is not documented", route)
	}
	return op, nil
}

// matches reports whether a request path is an instance of a route's path.
func matches(pattern, path string) bool {
	ps, xs := strings.Split(pattern, "/"), strings.Split(path, "/")
	if len(ps) != len(xs) {
		return false
	}
	for i := range ps {
		if ps[i] != xs[i] && !(strings.HasPrefix(ps[i], "{") && xs[i] != "") {
			return false
		}
	}
	return true
}

// answer checks one answer of route: its status is documented for the
// operation, its content type is one the document gives, and a JSON body
// is valid against the response's schema. WebSocket routes' 101 carries no
// body.
func (c *conformance) answer(t *testing.T, route string, resp *http.Response, body []byte) {
	t.Helper()
	op, err := c.operation(route)
	if err != nil {
		t.Errorf("%v", err)
		return
	}
	ref := op.Responses.Status(resp.StatusCode)
	if ref == nil || ref.Value == nil {
		t.Errorf("%s answered %d, which the document does not give (body %.300q)", route, resp.StatusCode, body)
		return
	}
	c.checkHeaders(t, route, resp, ref.Value)
	if resp.StatusCode < 400 {
		// A route counts as walked once it has answered with success:
		// its errors alone say little of its real answers.
		c.mu.Lock()
		c.walked[route] = true
		c.mu.Unlock()
	}
	c.checkContent(t, route, resp, ref.Value, body)
}

// checkHeaders checks that an answer carries every header the document
// gives its response, with a value its schema allows.
func (c *conformance) checkHeaders(t *testing.T, what string, resp *http.Response, r *openapi3.Response) {
	t.Helper()
	for name, h := range r.Headers {
		v := resp.Header.Get(name)
		if v == "" {
			t.Errorf("%s %d: no %s header, which the document gives", what, resp.StatusCode, name)
			continue
		}
		if s := h.Value.Schema; s != nil && s.Value != nil {
			if err := s.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
				t.Errorf("%s %d: header %s: %v", what, resp.StatusCode, name, err)
			}
		}
	}
}

// methodNotAllowed checks a 405 against the document's MethodNotAllowed
// response, which any path may give.
func (c *conformance) methodNotAllowed(t *testing.T, resp *http.Response, body []byte) {
	t.Helper()
	ref := c.doc.Components.Responses["MethodNotAllowed"]
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") == "" {
		t.Errorf("status %d, Allow %q; want 405 with Allow", resp.StatusCode, resp.Header.Get("Allow"))
	}
	c.checkHeaders(t, "405", resp, ref.Value)
	c.checkContent(t, "405", resp, ref.Value, body)
}

func (c *conformance) checkContent(t *testing.T, what string, resp *http.Response, r *openapi3.Response, body []byte) {
	t.Helper()
	if len(r.Content) == 0 {
		if len(body) != 0 {
			t.Errorf("%s %d: the document gives no body, the daemon sent %.300q", what, resp.StatusCode, body)
		}
		return
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	mt := r.Content.Get(ct)
	if mt == nil || r.Content[ct] == nil {
		t.Errorf("%s %d: Content-Type %q is not one of the document's %v", what, resp.StatusCode, ct, slices.Sorted(maps.Keys(r.Content)))
		return
	}
	if ct != "application/json" {
		return // bytes: a file, a tar, this document
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Errorf("%s %d: body is not JSON: %v (%.300q)", what, resp.StatusCode, err, body)
		return
	}
	c.value(t, fmt.Sprintf("%s %d", what, resp.StatusCode), mt.Schema, v)
}

// message checks a WebSocket text message the daemon sent against the
// component schema name, and returns it decoded.
func (c *conformance) message(t *testing.T, name string, data []byte) map[string]any {
	t.Helper()
	ref := c.doc.Components.Schemas[name]
	if ref == nil {
		t.Fatalf("no schema %s in the document", name)
	}
	var v map[string]any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Errorf("%s message is not a JSON object: %v (%.300q)", name, err, data)
		return nil
	}
	c.value(t, name+" message", &openapi3.SchemaRef{Ref: "#/components/schemas/" + name, Value: ref.Value}, v)
	return v
}

// value validates v against schema and records which properties it held.
func (c *conformance) value(t *testing.T, what string, schema *openapi3.SchemaRef, v any) {
	t.Helper()
	if schema == nil || schema.Value == nil {
		t.Errorf("%s: the document gives no schema", what)
		return
	}
	if err := schema.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
		t.Errorf("%s: the answer does not match the document: %v\nanswer: %.1000v", what, err, v)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mark(schema, v, "")
}

// mark records the properties schema documents and those v holds, naming
// each by the component schema it belongs to ("Sandbox.url"), or by the
// path to it for an inline one.
func (c *conformance) mark(schema *openapi3.SchemaRef, v any, owner string) {
	if schema == nil || schema.Value == nil {
		return
	}
	if name, ok := strings.CutPrefix(schema.Ref, "#/components/schemas/"); ok {
		owner = name
	}
	s := schema.Value
	// An answer of several shapes (oneOf) holds the properties of the one
	// it is.
	for _, alt := range s.OneOf {
		if alt.Value != nil && alt.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()) == nil {
			c.mark(alt, v, owner)
		}
	}
	switch v := v.(type) {
	case map[string]any:
		for name := range s.Properties {
			c.props[owner+"."+name] = true
		}
		for k, x := range v {
			if p := s.Properties[k]; p != nil {
				c.seen[owner+"."+k] = true
				c.mark(p, x, owner+"."+k)
			} else if s.AdditionalProperties.Schema != nil {
				c.mark(s.AdditionalProperties.Schema, x, owner+".*")
			}
		}
	case []any:
		for _, x := range v {
			c.mark(s.Items, x, owner+"[]")
		}
	}
}

// finish fails on a route of the server that the document lacks or that
// gave no checked answer, and on a documented property no answer held.
func (c *conformance) finish(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	routes := server.Routes()
	for _, r := range routes {
		if _, err := c.operation(r); err != nil {
			t.Errorf("the server serves %s: %v", r, err)
		} else if !c.walked[r] {
			t.Errorf("route %s gave no checked answer: walk it", r)
		}
	}
	for path, item := range c.doc.Paths.Map() {
		for method := range item.Operations() {
			if !slices.Contains(routes, method+" "+path) {
				t.Errorf("the document has %s %s, which the server does not serve", method, path)
			}
		}
	}
	var unseen []string
	for p := range c.props {
		if !c.seen[p] {
			unseen = append(unseen, p)
		}
	}
	sort.Strings(unseen)
	for _, p := range unseen {
		t.Errorf("documented field %s was in no answer the daemon gave", p)
	}
	t.Logf("checked answers of %d routes; %d documented fields, %d of them seen", len(c.walked), len(c.props), len(c.props)-len(unseen))
}

// readBody reads and closes a response's body.
func readBody(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading a body: %v", err)
	}
	return b
}
