// Package server is loam's HTTP API: the REST and WebSocket handlers. It is
// the only place where errors become HTTP statuses.
package server

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"loam.dev/loam/api"
)

// maxBody is the largest request body the API reads.
const maxBody = 1 << 20

// Server serves the API.
type Server struct {
	sandboxes Sandboxes
	token     string
	log       *slog.Logger
	mux       *http.ServeMux
}

// New makes a server over the sandbox manager. Every /v1 call must carry
// token as a bearer token.
func New(sandboxes Sandboxes, token string, log *slog.Logger) *Server {
	s := &Server{sandboxes: sandboxes, token: token, log: log, mux: http.NewServeMux()}
	s.routes()
	return s
}

func (s *Server) routes() {
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true})
	})
	v1 := func(pattern string, h func(http.ResponseWriter, *http.Request) error) {
		s.mux.Handle(pattern, s.auth(h))
	}
	v1("GET /v1/templates", s.listTemplates)
	v1("POST /v1/sandboxes", s.createSandbox)
	v1("GET /v1/sandboxes", s.listSandboxes)
	v1("GET /v1/sandboxes/{sandbox}", s.getSandbox)
	v1("DELETE /v1/sandboxes/{sandbox}", s.deleteSandbox)
	v1("GET /v1/sandboxes/{sandbox}/exec", s.exec)
	s.checkpointRoutes(v1)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, s.log, api.Errorf(api.CodeNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path))
	})
}

type ctxKey int

const requestIDKey ctxKey = 0

// RequestID is the id of the request a context belongs to, for logs.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

// ServeHTTP gives each request an id, logs it, and routes it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	r = r.WithContext(context.WithValue(r.Context(), requestIDKey, id))
	w.Header().Set("X-Request-Id", id)
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	start := time.Now()
	s.mux.ServeHTTP(rec, r)
	if r.URL.Path != "/healthz" {
		s.log.Info("request", "request_id", id, "method", r.Method, "path", r.URL.Path,
			"status", rec.status, "ms", time.Since(start).Milliseconds())
	}
}

// auth checks the bearer token, then runs h and turns its error into a response.
func (s *Server) auth(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(s.token)) != 1 {
			writeError(w, r, s.log, api.Errorf(api.CodeUnauthorized, "missing or wrong token: send Authorization: Bearer $LOAM_TOKEN"))
			return
		}
		if err := h(w, r); err != nil {
			writeError(w, r, s.log, err)
		}
	})
}

// writeError sends err as the API's error body. Errors that carry an
// *api.Error are the user's to read; any other is logged and sent as a bare
// internal error, so internal details never leak.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	var ae *api.Error
	if !errors.As(err, &ae) {
		id := RequestID(r.Context())
		log.Error("internal error", "request_id", id, "method", r.Method, "path", r.URL.Path, "err", err)
		ae = api.Errorf(api.CodeInternal, "internal error (request id %s)", id)
	} else if ae.Code == api.CodeInternal || ae.Code == api.CodeUnavailable {
		log.Error("request failed", "request_id", RequestID(r.Context()), "err", err)
	}
	writeJSON(w, ae.Code.HTTPStatus(), api.ErrorBody{Error: ae})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decode reads a JSON body into v, refusing unknown fields, trailing data
// and bodies over maxBody, with a message that says what is wrong.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	if err := decodeJSON(w, r, v); err != nil {
		return decodeError(err)
	}
	return nil
}

// decodeOptional is decode for bodies that may be empty.
func decodeOptional(w http.ResponseWriter, r *http.Request, v any) error {
	err := decodeJSON(w, r, v)
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return decodeError(err)
	}
	return nil
}

// decodeJSON decodes one JSON value and returns encoding/json's own error
// (io.EOF for an empty body), or an *api.Error for trailing data.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return api.Errorf(api.CodeInvalid, "body: more than one JSON value")
	}
	return nil
}

func decodeError(err error) error {
	var (
		syn  *json.SyntaxError
		typ  *json.UnmarshalTypeError
		size *http.MaxBytesError
	)
	var ae *api.Error
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, io.EOF):
		return api.Errorf(api.CodeInvalid, "body: empty")
	case errors.As(err, &size):
		return api.Errorf(api.CodeInvalid, "body: larger than %d bytes", size.Limit)
	case errors.As(err, &syn):
		return api.Errorf(api.CodeInvalid, "body: not valid JSON at byte %d", syn.Offset)
	case errors.As(err, &typ):
		return api.Errorf(api.CodeInvalid, "%s: must be %s, not %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no typed error for this one.
		return api.Errorf(api.CodeInvalid, "%s: unknown field", strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return api.Errorf(api.CodeInvalid, "body: truncated JSON")
	}
	return api.Errorf(api.CodeInvalid, "body: %v", err)
}

func jsonKind(k string) string {
	switch k {
	case "int", "int64", "float64", "uint", "int32":
		return "a number"
	case "map", "struct":
		return "an object"
	case "slice":
		return "an array"
	case "bool":
		return "true or false"
	}
	return "a " + k
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

// Unwrap lets http.ResponseController (and the WebSocket upgrade) reach the
// underlying writer.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
