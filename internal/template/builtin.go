package template

import (
	"context"
	"log/slog"
	"sync"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/disk"
)

// Builtins are the built-in templates (kind api.TemplateBuiltin: the base
// builds), built into a cache shared by daemons on this host and imported
// into this pool.
type Builtins struct {
	pool     disk.Pool
	cacheDir string
	def      string
	opts     disk.TemplateOptions
	cache    disk.Cache
	log      *slog.Logger

	mu       sync.Mutex
	building map[string]int    // name -> builds in progress
	failed   map[string]string // name -> why its last build failed
}

// NewBuiltins makes the built-in templates of opts, imported into pool
// from a build cache in cacheDir; def is the default one.
func NewBuiltins(pool disk.Pool, cacheDir, def string, opts disk.TemplateOptions, log *slog.Logger) *Builtins {
	return &Builtins{pool: pool, cacheDir: cacheDir, def: def, opts: opts, log: log,
		building: map[string]int{}, failed: map[string]string{}}
}

// List lists the templates; Ready says which are imported already, and
// Progress how far the others have got.
func (t *Builtins) List(ctx context.Context) []api.Template {
	var out []api.Template
	for _, tp := range disk.Templates(t.opts) {
		ready, _ := t.pool.HasTemplate(ctx, tp.Name)
		v := api.Template{Name: tp.Name, Description: tp.Description, Default: tp.Name == t.def, Ready: ready,
			Kind: api.TemplateBuiltin, State: api.TemplatePending, Progress: t.progress(tp.Name, ready)}
		t.mu.Lock()
		switch {
		case ready:
			v.State = api.TemplateReady
		case t.building[tp.Name] > 0:
			v.State = api.TemplateBuilding
		case t.failed[tp.Name] != "":
			// Until the next try, which the next sandbox of it makes.
			v.State, v.Error = api.TemplateFailed, t.failed[tp.Name]
		}
		t.mu.Unlock()
		out = append(out, v)
	}
	return out
}

// progress is a template's Progress in percent.
func (t *Builtins) progress(name string, ready bool) int {
	if ready {
		return 100
	}
	f, _ := t.cache.Progress(name)
	// Never 100 before it is ready: the import may have just ended, but
	// HasTemplate said no.
	return min(int(f*100), 99)
}

// Ensure builds (once per host) and imports (once per pool) a template.
func (t *Builtins) Ensure(ctx context.Context, name string) error {
	tp, err := disk.FindTemplate(name, t.opts)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.building[name]++
	t.mu.Unlock()
	err = t.cache.EnsureTemplate(ctx, t.pool, t.cacheDir, tp)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.building[name]--; t.building[name] == 0 {
		delete(t.building, name)
	}
	switch {
	case err == nil:
		delete(t.failed, name)
	case ctx.Err() == nil:
		t.failed[name] = err.Error()
	}
	return err
}

// Has reports whether name is a built-in template.
func (t *Builtins) Has(name string) bool {
	_, err := disk.FindTemplate(name, t.opts)
	return err == nil
}

// Run prepares the default template, so that the first sandbox does not
// wait for a build; the daemon runs it in the background, as a component
// (ctx's end cuts a build short). A failure is logged, not returned: a
// create builds the template again.
func (t *Builtins) Run(ctx context.Context) error {
	if err := t.Ensure(ctx, t.def); err != nil {
		if ctx.Err() == nil {
			t.log.Error("preparing the default template", "template", t.def, "err", err)
		}
		return nil
	}
	t.log.Info("default template ready", "template", t.def)
	return nil
}

// Builders are the nodes of a cluster that build built-in templates
// (cluster.Member has them).
type Builders interface {
	// BuiltOn are the nodes that have built-in template name in their
	// template cache, as their leases last said.
	BuiltOn(name string) []string
}

// NodeBuiltins are the built-in templates as a cluster's front end (loam
// serve --role api) sees them: it has no disk pool and builds none, and a
// node builds one for the first sandbox it makes of it. So one is listed
// ready once a node has it, and pending (a node builds it when a sandbox
// asks) until then; Ensure refuses, since nothing is made here.
type NodeBuiltins struct {
	def   string
	opts  disk.TemplateOptions
	nodes Builders
}

// NewNodeBuiltins makes the built-in templates of opts as nodes build
// them; def is the default one.
func NewNodeBuiltins(nodes Builders, def string, opts disk.TemplateOptions) *NodeBuiltins {
	return &NodeBuiltins{def: def, opts: opts, nodes: nodes}
}

// List lists the built-in templates, ready when a node has built one.
func (t *NodeBuiltins) List(context.Context) []api.Template {
	var out []api.Template
	for _, tp := range disk.Templates(t.opts) {
		v := api.Template{Name: tp.Name, Description: tp.Description, Default: tp.Name == t.def,
			Kind: api.TemplateBuiltin, State: api.TemplatePending}
		if len(t.nodes.BuiltOn(tp.Name)) > 0 {
			v.Ready, v.State, v.Progress = true, api.TemplateReady, 100
		}
		out = append(out, v)
	}
	return out
}

// Ensure refuses: a front end builds no template.
func (t *NodeBuiltins) Ensure(_ context.Context, name string) error {
	return api.Errorf(api.CodeUnavailable, "template %s: this daemon is a cluster's front end (--role api), which builds no template; a node builds it for its first sandbox of it", name)
}

// Has reports whether name is a built-in template.
func (t *NodeBuiltins) Has(name string) bool {
	_, err := disk.FindTemplate(name, t.opts)
	return err == nil
}
