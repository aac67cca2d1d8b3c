package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"time"

	"loam.dev/loam/api"
)

// Templates is what the server needs of the template catalog
// (template.Catalog has it): list the templates, keep checkpoints as
// templates and move them between hosts.
type Templates interface {
	List(ctx context.Context) []api.Template
	Create(ctx context.Context, req api.CreateTemplate) (*api.Template, error)
	Delete(ctx context.Context, name string) error
	// Export writes the template as one archive to w.
	Export(ctx context.Context, name string, w io.Writer) error
	// Import makes the template from an archive Export wrote.
	Import(ctx context.Context, name string, r io.Reader) (*api.Template, error)
}

// WithTemplates serves the templates routes from the catalog t; without
// it the list is empty and the other routes answer unavailable.
func WithTemplates(t Templates) Option {
	return func(s *Server) { s.catalog = t }
}

// ArchiveType is the media type of a template archive (a zstd-compressed tar).
const ArchiveType = "application/zstd"

// templateRoutes serves the template catalog: list, create and delete
// templates, and move them between hosts as archives.
type templateRoutes struct {
	// catalog is nil on a server without templates (see WithTemplates).
	catalog Templates
	log     *slog.Logger
	// writeTimeout is the server's (see WithWriteTimeout).
	writeTimeout time.Duration
}

// register adds the template routes with v1.
func (tr *templateRoutes) register(v1 addRoute) {
	v1("GET /v1/templates", api.ScopeRead, "", tr.listTemplates)
	v1("POST /v1/templates", api.ScopeWrite, "template.create", tr.createTemplate)
	v1("DELETE /v1/templates/{template}", api.ScopeWrite, "template.delete", tr.deleteTemplate)
	v1("GET /v1/templates/{template}/export", api.ScopeWrite, "", tr.exportTemplate)
	v1("PUT /v1/templates/{template}/import", api.ScopeWrite, "template.import", tr.importTemplate)
}

func (tr *templateRoutes) templates() (Templates, error) {
	t := tr.catalog
	if t == nil {
		return nil, api.Errorf(api.CodeUnavailable, "this server keeps no templates of its own")
	}
	return t, nil
}

func (tr *templateRoutes) listTemplates(w http.ResponseWriter, r *http.Request) error {
	list := []api.Template{}
	if tr.catalog != nil {
		list = tr.catalog.List(r.Context())
	}
	api.WriteJSON(w, http.StatusOK, api.TemplateList{Templates: list})
	return nil
}

func (tr *templateRoutes) createTemplate(w http.ResponseWriter, r *http.Request) error {
	t, err := tr.templates()
	if err != nil {
		return err
	}
	var req api.CreateTemplate
	if err := decode(w, r, &req); err != nil {
		return err
	}
	tpl, err := t.Create(r.Context(), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusCreated, tpl)
	return nil
}

func (tr *templateRoutes) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	t, err := tr.templates()
	if err != nil {
		return err
	}
	if err := t.Delete(r.Context(), r.PathValue("template")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// exportTemplate streams the archive. An error found before the first byte
// is sent is an ordinary error response; one after it can only cut the
// stream short, which the archive's checksums make sure an import notices.
func (tr *templateRoutes) exportTemplate(w http.ResponseWriter, r *http.Request) error {
	t, err := tr.templates()
	if err != nil {
		return err
	}
	lw := &lazyWriter{w: w, idle: newIdleWriter(w, r, tr.writeTimeout)}
	defer lw.idle.done()
	err = t.Export(r.Context(), r.PathValue("template"), lw)
	if err != nil && !lw.started {
		return err
	}
	if err != nil {
		if !clientGone(r) {
			tr.log.Error("template export cut short", "request_id", RequestID(r.Context()), "err", err)
		}
		panic(http.ErrAbortHandler) // the client must see a broken stream, not an end
	}
	if !lw.started {
		lw.start()
	}
	return nil
}

// lazyWriter sends the response's headers with its first byte.
// Each write has the server's write timeout (idleWriter).
type lazyWriter struct {
	w       http.ResponseWriter
	idle    *idleWriter
	started bool
}

func (l *lazyWriter) start() {
	l.started = true
	l.w.Header().Set("Content-Type", ArchiveType)
	l.w.WriteHeader(http.StatusOK)
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.start()
	}
	return l.idle.Write(p)
}

func (tr *templateRoutes) importTemplate(w http.ResponseWriter, r *http.Request) error {
	t, err := tr.templates()
	if err != nil {
		return err
	}
	body := newIdleReader(w, r, tr.writeTimeout)
	defer body.done()
	tpl, err := t.Import(r.Context(), r.PathValue("template"), body)
	if err != nil {
		return body.clientError(err)
	}
	api.WriteJSON(w, http.StatusCreated, tpl)
	return nil
}
