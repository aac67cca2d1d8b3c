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
