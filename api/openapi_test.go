package api

import (
	"context"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestOpenAPIValid checks that the embedded document parses and is valid
// OpenAPI 3.1, its $refs all resolving and its examples matching their
// schemas.
func TestOpenAPIValid(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(OpenAPI)
	if err != nil {
		t.Fatalf("parsing api/openapi.yaml: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi: %q, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background(), openapi3.EnableExamplesValidation()); err != nil {
		t.Fatalf("api/openapi.yaml is not valid OpenAPI: %v", err)
	}
}

// TestOpenAPIErrorCodes checks that the document's ErrorCode lists every
// code of the API and no other.
func TestOpenAPIErrorCodes(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, v := range doc.Components.Schemas["ErrorCode"].Value.Enum {
		documented = append(documented, v.(string))
	}
	codes := []Code{CodeInvalid, CodeUnauthorized, CodeForbidden, CodeNotFound, CodeMethodNotAllowed,
		CodeConflict, CodeLimit, CodeUpgradeRequired, CodeUnavailable, CodeInsufficientStorage, CodeInternal}
	if len(documented) != len(codes) {
		t.Errorf("ErrorCode lists %v, want %v", documented, codes)
	}
	for _, c := range codes {
		found := false
		for _, d := range documented {
			found = found || d == string(c)
		}
		if !found {
			t.Errorf("ErrorCode lacks %q", c)
		}
	}
}
