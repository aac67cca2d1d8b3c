// Command docgen writes docs/reference/rest.md, the REST reference, from
// api/openapi.yaml, so that the reference says what the document says and
// never drifts from it: TestReferenceFresh fails when the file is stale.
// Run it with `go generate ./api`.
//
//	go run ./tools/docgen -in api/openapi.yaml -out docs/reference/rest.md
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
)

func main() {
	in := flag.String("in", "api/openapi.yaml", "the OpenAPI document")
	out := flag.String("out", "docs/reference/rest.md", "the Markdown reference to write")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	src, err := os.ReadFile(in)
	if err != nil {
		return fmt.Errorf("reading the document: %w", err)
	}
	md, err := render(src)
	if err != nil {
		return fmt.Errorf("rendering %s: %w", in, err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("making the reference's directory: %w", err)
	}
	if err := os.WriteFile(out, md, 0o644); err != nil {
		return fmt.Errorf("writing the reference: %w", err)
	}
	return nil
}

// methods is the order operations of one path are listed in.
var methods = []string{"GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS"}

// route is one operation with where it is.
type route struct {
	method, path string
	item         *openapi3.PathItem
	op           *openapi3.Operation
}

// render turns an OpenAPI document into the Markdown reference. The output
// depends on the document alone (everything is sorted), so a regenerated
// file differs only where the document does.
func render(src []byte) ([]byte, error) {
	doc, err := openapi3.NewLoader().LoadFromData(src)
	if err != nil {
		return nil, fmt.Errorf("parsing: %w", err)
	}
	byTag := map[string][]route{}
	paths := doc.Paths.Map()
	for _, p := range slices.Sorted(maps.Keys(paths)) {
		item := paths[p]
		ops := item.Operations()
		for _, m := range methods {
			op := ops[m]
			if op == nil {
				continue
			}
			tag := "other"
			if len(op.Tags) > 0 {
				tag = op.Tags[0]
			}
			byTag[tag] = append(byTag[tag], route{m, p, item, op})
		}
	}
	var tags []string
	for _, t := range doc.Tags {
		tags = append(tags, t.Name)
	}
	for t := range byTag {
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s reference\n\n", doc.Info.Title)
	b.WriteString("<!-- Generated from api/openapi.yaml by tools/docgen (go generate ./api). Do not edit: edit the document and regenerate. -->\n\n")
	if doc.Info.Summary != "" {
		fmt.Fprintf(&b, "%s\n\n", doc.Info.Summary)
	}
	b.WriteString("The daemon serves this description itself, as OpenAPI 3.1, at `GET /v1/openapi.yaml`.\n\n")
	fmt.Fprintf(&b, "%s\n", strings.TrimSpace(doc.Info.Description))
	b.WriteString("\n## Routes\n\n")
	for _, tag := range tags {
		for _, r := range byTag[tag] {
			fmt.Fprintf(&b, "- [`%s %s`](#%s) %s\n", r.method, r.path, anchor(r), r.op.Summary)
		}
	}
	for _, tag := range tags {
		if len(byTag[tag]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n## %s\n", capitalize(tag))
		for _, r := range byTag[tag] {
			writeRoute(&b, r)
		}
	}
	writeSchemas(&b, doc)
	return b.Bytes(), nil
}

// anchor is the id of a route's heading: its operationId, lowercased as
// Markdown renderers make ids of headings.
func anchor(r route) string { return strings.ToLower(r.op.OperationID) }

func writeRoute(b *bytes.Buffer, r route) {
	fmt.Fprintf(b, "\n<a id=\"%s\"></a>\n### `%s %s`\n\n", anchor(r), r.method, r.path)
	fmt.Fprintf(b, "**%s**", r.op.Summary)
	if r.op.Security != nil && len(*r.op.Security) == 0 {
		b.WriteString(" (no token)")
	}
	b.WriteString("\n\n")
	if d := strings.TrimSpace(r.op.Description); d != "" {
		fmt.Fprintf(b, "%s\n\n", d)
	}
	params := append(slices.Clone(r.item.Parameters), r.op.Parameters...)
	if len(params) > 0 {
		b.WriteString("| Parameter | In | Type | Required | Description |\n| --- | --- | --- | --- | --- |\n")
		for _, pr := range params {
			p := pr.Value
			fmt.Fprintf(b, "| `%s` | %s | %s | %s | %s |\n", p.Name, p.In, typeOf(p.Schema), yesNo(p.Required), cell(p.Description))
		}
		b.WriteString("\n")
	}
	if rb := r.op.RequestBody; rb != nil && rb.Value != nil {
		fmt.Fprintf(b, "Request body (%s):", map[bool]string{true: "required", false: "optional"}[rb.Value.Required])
		for _, ct := range slices.Sorted(maps.Keys(rb.Value.Content)) {
			fmt.Fprintf(b, " `%s` %s", ct, typeOf(rb.Value.Content[ct].Schema))
		}
		b.WriteString("\n\n")
		for _, ct := range slices.Sorted(maps.Keys(rb.Value.Content)) {
			writeExamples(b, rb.Value.Content[ct])
		}
	}
	b.WriteString("| Status | Meaning | Body |\n| --- | --- | --- |\n")
	resps := r.op.Responses.Map()
	for _, status := range slices.Sorted(maps.Keys(resps)) {
		resp := resps[status].Value
		var bodies []string
		for _, ct := range slices.Sorted(maps.Keys(resp.Content)) {
			bodies = append(bodies, fmt.Sprintf("`%s` %s", ct, typeOf(resp.Content[ct].Schema)))
		}
		fmt.Fprintf(b, "| %s | %s | %s |\n", status, cell(deref(resp.Description)), strings.Join(bodies, ", "))
	}
	b.WriteString("\n")
	for _, status := range slices.Sorted(maps.Keys(resps)) {
		if !strings.HasPrefix(status, "2") {
			continue
		}
		for _, ct := range slices.Sorted(maps.Keys(resps[status].Value.Content)) {
			writeExamples(b, resps[status].Value.Content[ct])
		}
	}
}

// writeExamples writes a media type's examples as JSON blocks.
func writeExamples(b *bytes.Buffer, mt *openapi3.MediaType) {
	if mt.Example != nil {
		writeJSON(b, "Example", mt.Example)
	}
	for _, name := range slices.Sorted(maps.Keys(mt.Examples)) {
		ex := mt.Examples[name].Value
		title := "Example: " + name
		if ex.Summary != "" {
			title += " (" + ex.Summary + ")"
		}
		writeJSON(b, title, ex.Value)
	}
}

func writeJSON(b *bytes.Buffer, title string, v any) {
	j, err := json.Marshal(v)
	if err != nil {
		j = []byte(fmt.Sprint(v))
	}
	fmt.Fprintf(b, "%s:\n\n```json\n%s\n```\n\n", title, j)
}

// writeSchemas writes every component schema: its description, and a table
// of its properties or its values.
func writeSchemas(b *bytes.Buffer, doc *openapi3.T) {
	b.WriteString("\n## Schemas\n\nThe JSON bodies and WebSocket messages, by name.\n")
	for _, name := range slices.Sorted(maps.Keys(doc.Components.Schemas)) {
		s := doc.Components.Schemas[name].Value
		fmt.Fprintf(b, "\n<a id=\"schema-%s\"></a>\n### %s\n\n", strings.ToLower(name), name)
		if d := strings.TrimSpace(s.Description); d != "" {
			fmt.Fprintf(b, "%s\n\n", d)
		}
		if len(s.Properties) == 0 {
			fmt.Fprintf(b, "Type: %s", typeOf(&openapi3.SchemaRef{Value: s}))
			if len(s.Enum) > 0 {
				fmt.Fprintf(b, ", one of %s", enum(s.Enum))
			}
			b.WriteString(".\n")
		} else {
			b.WriteString("| Field | Type | Required | Description |\n| --- | --- | --- | --- |\n")
			for _, p := range slices.Sorted(maps.Keys(s.Properties)) {
				ps := s.Properties[p]
				desc := ps.Value.Description
				if len(ps.Value.Enum) > 0 {
					desc = strings.TrimSpace(desc + " One of " + enum(ps.Value.Enum) + ".")
				}
				fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", p, typeOf(ps), yesNo(slices.Contains(s.Required, p)), cell(desc))
			}
		}
		for _, ex := range s.Examples {
			b.WriteString("\n")
			writeJSON(b, "Example", ex)
		}
	}
}

// typeOf names a schema's type: a link to a component, "T[]" for an array,
// "map of T" for an object of T values, "A or B" for several types.
func typeOf(sr *openapi3.SchemaRef) string {
	if sr == nil || sr.Value == nil {
		return ""
	}
	if name, ok := strings.CutPrefix(sr.Ref, "#/components/schemas/"); ok {
		return fmt.Sprintf("[%s](#schema-%s)", name, strings.ToLower(name))
	}
	s := sr.Value
	if len(s.OneOf) > 0 {
		alts := make([]string, len(s.OneOf))
		for i, alt := range s.OneOf {
			alts[i] = typeOf(alt)
		}
		return strings.Join(alts, " or ")
	}
	var types []string
	if s.Type != nil {
		types = s.Type.Slice()
	}
	var out []string
	for _, t := range types {
		switch {
		case t == "array":
			out = append(out, typeOf(s.Items)+"[]")
		case t == "object" && s.AdditionalProperties.Schema != nil:
			out = append(out, "map of "+typeOf(s.AdditionalProperties.Schema))
		case t == "string" && s.ContentMediaType != "":
			out = append(out, "bytes ("+s.ContentMediaType+")")
		case s.Format != "" && t != "null":
			out = append(out, t+" ("+s.Format+")")
		default:
			out = append(out, t)
		}
	}
	if s.Const != nil {
		out = append(out, fmt.Sprintf("`%v`", s.Const))
	}
	return strings.Join(out, " or ")
}

func enum(vs []any) string {
	var out []string
	for _, v := range vs {
		out = append(out, fmt.Sprintf("`%v`", v))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// cell makes text fit in one table cell.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
