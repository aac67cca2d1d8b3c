package server

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/guest"
	"loam.dev/loam/internal/sandbox"
)

// Files is the files API of sandboxes (api/files.go). Every path is the
// sandbox's, resolved inside it; ref is a sandbox's name or id; a
// FileQuery's User is the sandbox user the call acts as. Contents and
// archives stream: ReadFile and ReadArchive return a body the caller
// closes, WriteFile and WriteArchive read theirs to its end, and none of
// them holds a whole file.
type Files interface {
	StatFile(ctx context.Context, ref string, q guest.FileQuery, depth int) (*api.FileInfo, error)
	// ReadFile returns the file's bytes and their number.
	ReadFile(ctx context.Context, ref string, q guest.FileQuery) (io.ReadCloser, int64, error)
	// WriteFile writes body (size bytes, -1 when unknown) atomically; mode
	// is octal or "" to keep the file'gr.
	WriteFile(ctx context.Context, ref string, q guest.FileQuery, mode string, body io.Reader, size int64) (*api.FileInfo, error)
	Mkdir(ctx context.Context, ref string, req api.MkdirRequest) (*api.FileInfo, error)
	MoveFile(ctx context.Context, ref string, req api.MoveRequest) (*api.FileInfo, error)
	RemoveFile(ctx context.Context, ref string, q guest.FileQuery, recursive bool) error
	ReadArchive(ctx context.Context, ref string, q guest.FileQuery) (io.ReadCloser, error)
	WriteArchive(ctx context.Context, ref string, q guest.FileQuery, tar io.Reader) error
	// Watch returns a stream of api.WatchEvent text messages.
	Watch(ctx context.Context, ref string, q guest.FileQuery, recursive bool) (*sandbox.Stream, error)
}

// registerFiles adds the file routes with v1.
func (gr *guestRoutes) registerFiles(v1 addRoute) {
	v1("GET /v1/sandboxes/{sandbox}/files", api.ScopeWrite, "", gr.statFile)
	v1("DELETE /v1/sandboxes/{sandbox}/files", api.ScopeWrite, "file.delete", gr.removeFile)
	v1("GET /v1/sandboxes/{sandbox}/files/content", api.ScopeWrite, "", gr.readFile)
	v1("PUT /v1/sandboxes/{sandbox}/files/content", api.ScopeWrite, "file.write", gr.writeFile)
	v1("POST /v1/sandboxes/{sandbox}/files/mkdir", api.ScopeWrite, "file.mkdir", gr.mkdir)
	v1("POST /v1/sandboxes/{sandbox}/files/move", api.ScopeWrite, "file.move", gr.moveFile)
	v1("GET /v1/sandboxes/{sandbox}/files/archive", api.ScopeWrite, "", gr.readArchive)
	v1("PUT /v1/sandboxes/{sandbox}/files/archive", api.ScopeWrite, "file.upload", gr.writeArchive)
	v1("GET /v1/sandboxes/{sandbox}/files/watch", api.ScopeWrite, "", gr.watch)
}

// fileQuery reads path= and user= of a files request.
func fileQuery(r *http.Request) (guest.FileQuery, error) {
	q := guest.FileQuery{Path: r.URL.Query().Get("path"), User: r.URL.Query().Get("user")}
	if err := api.CheckFilePath("path", q.Path); err != nil {
		return q, err
	}
	return q, api.CheckFileUser(q.User)
}

// boolParam reads a query parameter that is "true", "false" or absent.
func boolParam(r *http.Request, name string) (bool, error) {
	switch v := r.URL.Query().Get(name); v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, api.Errorf(api.CodeInvalid, "%s: %q is neither true nor false", name, v)
	}
}

func (gr *guestRoutes) statFile(w http.ResponseWriter, r *http.Request) error {
	q, err := fileQuery(r)
	if err != nil {
		return err
	}
	depth := 1
	if d := r.URL.Query().Get("depth"); d != "" {
		if depth, err = strconv.Atoi(d); err != nil || depth < 0 || depth > api.MaxFileDepth {
			return api.Errorf(api.CodeInvalid, "depth: %q is not a number from 0 to %d", d, api.MaxFileDepth)
		}
	}
	info, err := gr.guest.StatFile(r.Context(), r.PathValue("sandbox"), q, depth)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, info)
	return nil
}

func (gr *guestRoutes) removeFile(w http.ResponseWriter, r *http.Request) error {
	q, err := fileQuery(r)
	if err != nil {
		return err
	}
	recursive, err := boolParam(r, "recursive")
	if err != nil {
		return err
	}
	if err := gr.guest.RemoveFile(r.Context(), r.PathValue("sandbox"), q, recursive); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// readFile streams a file's bytes with their length. A transfer cut once
// under way (a memory checkpoint) can only end short: the client sees fewer
// bytes than Content-Length.
func (gr *guestRoutes) readFile(w http.ResponseWriter, r *http.Request) error {
	q, err := fileQuery(r)
	if err != nil {
		return err
	}
	rng, err := api.ParseReadRange(r.URL.Query())
	if err != nil {
		return err
	}
	if rng != (api.ReadRange{Length: -1}) {
		q.Range = &rng
	}
	body, size, err := gr.guest.ReadFile(r.Context(), r.PathValue("sandbox"), q)
	if err != nil {
		return err
	}
	defer body.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	iw := newIdleWriter(w, r, gr.writeTimeout)
	defer iw.done()
	if _, err := io.Copy(iw, body); err != nil && !clientGone(r) {
		gr.log.Warn("file download cut short", "request_id", RequestID(r.Context()), "path", q.Path, "err", err)
	}
	return nil
}

func (gr *guestRoutes) writeFile(w http.ResponseWriter, r *http.Request) error {
	q, err := fileQuery(r)
	if err != nil {
		return err
	}
	body := newIdleReader(w, r, gr.writeTimeout)
	defer body.done()
	info, err := gr.guest.WriteFile(r.Context(), r.PathValue("sandbox"), q, r.URL.Query().Get("mode"), body, r.ContentLength)
	if err != nil {
		return body.clientError(err)
	}
	api.WriteJSON(w, http.StatusOK, info)
	return nil
}

func (gr *guestRoutes) mkdir(w http.ResponseWriter, r *http.Request) error {
	var req api.MkdirRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	info, err := gr.guest.Mkdir(r.Context(), r.PathValue("sandbox"), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, info)
	return nil
}

func (gr *guestRoutes) moveFile(w http.ResponseWriter, r *http.Request) error {
	var req api.MoveRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	info, err := gr.guest.MoveFile(r.Context(), r.PathValue("sandbox"), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, info)
	return nil
}

// readArchive streams a tar of a directory. A transfer cut once under way
// aborts the connection, so that the client never takes a short tar for a
// whole one.
func (gr *guestRoutes) readArchive(w http.ResponseWriter, r *http.Request) error {
	q, err := fileQuery(r)
	if err != nil {
		return err
	}
	body, err := gr.guest.ReadArchive(r.Context(), r.PathValue("sandbox"), q)
	if err != nil {
		return err
	}
	defer body.Close()
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	iw := newIdleWriter(w, r, gr.writeTimeout)
	defer iw.done()
	if _, err := io.Copy(iw, body); err != nil && !clientGone(r) {
		gr.log.Warn("archive download cut short", "request_id", RequestID(r.Context()), "path", q.Path, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

func (gr *guestRoutes) writeArchive(w http.ResponseWriter, r *http.Request) error {
	q, err := fileQuery(r)
	if err != nil {
		return err
	}
	body := newIdleReader(w, r, gr.writeTimeout)
	defer body.done()
	if err := gr.guest.WriteArchive(r.Context(), r.PathValue("sandbox"), q, body); err != nil {
		return body.clientError(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// watch upgrades to a watch WebSocket of api.WatchEvent text messages.
// The watch is set up first, so that a missing path or sandbox is a plain
// HTTP error; then the handshake (426 without the upgrade).
func (gr *guestRoutes) watch(w http.ResponseWriter, r *http.Request) error {
	q, err := fileQuery(r)
	if err != nil {
		return err
	}
	recursive, err := boolParam(r, "recursive")
	if err != nil {
		return err
	}
	ctx := r.Context()
	st, err := gr.guest.Watch(ctx, r.PathValue("sandbox"), q, recursive)
	if err != nil {
		return err
	}
	hw := &handshakeWriter{ResponseWriter: w}
	c, err := websocket.Accept(hw, r, acceptOptions)
	if err != nil {
		st.Close()
		switch hw.status {
		case 0:
			return nil
		case http.StatusUpgradeRequired:
			return api.Errorf(api.CodeUpgradeRequired, "files/watch is a WebSocket endpoint: connect with a WebSocket client (%s)", strings.TrimSpace(hw.msg.String()))
		}
		return api.Errorf(api.CodeForStatus(hw.status), "files/watch: %s", strings.TrimSpace(hw.msg.String()))
	}
	defer c.CloseNow()
	proxyStream(ctx, c, st, gr.writeTimeout)
	return nil
}
