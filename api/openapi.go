package api

import _ "embed"

// OpenAPI is the OpenAPI 3.1 description of the daemon's API (openapi.yaml
// beside this file): every route, body, error and WebSocket of /healthz and
// /v1. The daemon serves it at GET /v1/openapi.yaml; docs/reference/rest.md
// is generated from it.
//
//go:generate go run ../tools/docgen -in openapi.yaml -out ../docs/reference/rest.md
//go:embed openapi.yaml
var OpenAPI []byte
