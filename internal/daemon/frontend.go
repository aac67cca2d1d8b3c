package daemon

import (
	"context"
	"io"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/cluster"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/server"
	"loam.dev/loam/internal/sleep"
	"loam.dev/loam/internal/template"
	"loam.dev/loam/internal/warmpool"
)

// A cluster's front end (loam serve --role api) runs no sandbox: it places
// creates on the nodes and passes every call for a sandbox to its owner
// (cluster.Router), and answers the rest from the records in the
// database. So it starts none of a sandbox host's parts: no runsc, no
// disk pool, no network or firewall, no template builds, warm pools, idle
// sleep or recovery, and it needs no root. Its sandbox core is made over
// frontEndRuntime, frontEndPool and frontEndNetworks, which stand in for
// the runtime, the pool and the network: a call that reaches one (none
// should: the router passes them on) answers unavailable, saying why,
// instead of acting on a host that was never set up.

// frontEnd reports whether the daemon is a cluster's front end.
func (d *Daemon) frontEnd() bool { return d.cfg.Role == cluster.RoleAPI }

// frontEndRuntime, frontEndPool and frontEndNetworks are the runtime, the
// disk pool and the network of a front end's sandbox core: it has none,
// and every call that would act on one answers unavailable (frontEndErr).
// Listing what they hold answers nothing.
type (
	frontEndRuntime  struct{ node string }
	frontEndPool     struct{ node string }
	frontEndNetworks struct{ node string }
)

var (
	_ runtime.Runtime  = frontEndRuntime{}
	_ disk.Pool        = frontEndPool{}
	_ sandbox.Networks = frontEndNetworks{}
)

// frontEndErr is the answer of a call that would need a sandbox's runtime,
// disk or network on front end node.
func frontEndErr(node string) error {
	return api.Errorf(api.CodeUnavailable, "node %s is a cluster's front end (--role api): it runs no sandbox, and keeps no disk or network of one", node)
}

func (h frontEndRuntime) Start(context.Context, runtime.Spec) error { return frontEndErr(h.node) }
func (h frontEndRuntime) State(context.Context, string) (runtime.Status, error) {
	return "", frontEndErr(h.node)
}
func (h frontEndRuntime) Delete(context.Context, string) error { return frontEndErr(h.node) }
func (h frontEndRuntime) Pause(context.Context, string) error  { return frontEndErr(h.node) }
func (h frontEndRuntime) Resume(context.Context, string) error { return frontEndErr(h.node) }
func (h frontEndRuntime) Checkpoint(context.Context, string, string, runtime.CheckpointOptions) error {
	return frontEndErr(h.node)
}
func (h frontEndRuntime) Restore(context.Context, runtime.Spec, string) error {
	return frontEndErr(h.node)
}
func (h frontEndRuntime) SetLimits(context.Context, string, runtime.Limits) error {
	return frontEndErr(h.node)
}

func (h frontEndPool) Kind() string                                      { return "none" }
func (h frontEndPool) HasTemplate(context.Context, string) (bool, error) { return false, nil }
func (h frontEndPool) ImportTemplate(context.Context, string, string) error {
	return frontEndErr(h.node)
}
func (h frontEndPool) CreateVolume(context.Context, string, string) (string, error) {
	return "", frontEndErr(h.node)
}
func (h frontEndPool) VolumePath(string) string                   { return "" }
func (h frontEndPool) DeleteVolume(context.Context, string) error { return frontEndErr(h.node) }
func (h frontEndPool) RenameVolume(context.Context, string, string) error {
	return frontEndErr(h.node)
}
func (h frontEndPool) Snapshot(context.Context, string, string) error { return frontEndErr(h.node) }
func (h frontEndPool) SyncSnapshot(context.Context, string) error     { return frontEndErr(h.node) }
func (h frontEndPool) CloneSnapshot(context.Context, string, string) (string, error) {
	return "", frontEndErr(h.node)
}
func (h frontEndPool) ImportSnapshot(context.Context, string, string) error {
	return frontEndErr(h.node)
}
func (h frontEndPool) SnapshotPath(string) string                   { return "" }
func (h frontEndPool) TemplatePath(string) string                   { return "" }
func (h frontEndPool) DeleteSnapshot(context.Context, string) error { return frontEndErr(h.node) }
func (h frontEndPool) Snapshots(context.Context) ([]string, error)  { return nil, nil }
func (h frontEndPool) Volumes(context.Context) ([]string, error)    { return nil, nil }
func (h frontEndPool) Usage(context.Context, string) (int64, error) { return 0, frontEndErr(h.node) }
func (h frontEndPool) Close() error                                 { return nil }

func (h frontEndNetworks) Endpoint(string, int) (network.Endpoint, error) {
	return network.Endpoint{}, frontEndErr(h.node)
}
func (h frontEndNetworks) MaxIndex() int { return -1 }
func (h frontEndNetworks) Create(context.Context, network.Endpoint) error {
	return frontEndErr(h.node)
}
func (h frontEndNetworks) Prepare(context.Context, network.Endpoint) error {
	return frontEndErr(h.node)
}
func (h frontEndNetworks) Delete(context.Context, network.Endpoint) error {
	return frontEndErr(h.node)
}
func (h frontEndNetworks) SetPolicy(context.Context, network.Endpoint, network.Policy) error {
	return frontEndErr(h.node)
}
func (h frontEndNetworks) RemovePolicy(context.Context, network.Endpoint) error {
	return frontEndErr(h.node)
}
func (h frontEndNetworks) PrunePolicies(context.Context, []network.Endpoint) error { return nil }

// frontEndImages are the images as a front end serves them: the records
// (every node's pulls are in the database) are listed and read, but a pull
// is a node's, which pulls an image for its first sandbox of it, and so
// is forgetting one (its template is in the nodes' pools).
type frontEndImages struct {
	*image.Service
	node string
}

func (fi frontEndImages) Pull(context.Context, string) (*api.Image, error) {
	return nil, api.Errorf(api.CodeUnavailable, "node %s is a cluster's front end (--role api), which pulls no image: create a sandbox of it (a node pulls it), or pull through a node", fi.node)
}

func (fi frontEndImages) Delete(context.Context, string) error {
	return api.Errorf(api.CodeUnavailable, "node %s is a cluster's front end (--role api), which keeps no image: delete it through a node", fi.node)
}

// frontEndTemplates are the templates as a front end serves them: the
// cluster's catalog (built-in templates as the nodes built them, the
// checkpoint templates the nodes keep, the images), and the calls about
// a checkpoint template passed to its node (cluster.Router). An import
// not under a name a node keeps would be kept here, which keeps none: it
// is refused.
type frontEndTemplates struct {
	*template.Catalog
	node string
}

func (ft frontEndTemplates) Import(_ context.Context, name string, _ io.Reader) (*api.Template, error) {
	return nil, api.Errorf(api.CodeUnavailable, "template %s: node %s is a cluster's front end (--role api), which keeps no template: import it through a node", name, ft.node)
}

// poolsOf makes the warm pools of the Manager: none on a front end, which
// makes no member (its Manager keeps noPools).
func (d *Daemon) poolsOf(*parts) func(*sandbox.Manager) sandbox.Pools {
	if d.frontEnd() {
		return nil
	}
	return func(m *sandbox.Manager) sandbox.Pools {
		d.pools = warmpool.New(sandbox.NewPoolCore(m), warmpool.Config{DataDir: d.cfg.DataDir, ReserveMiB: d.cfg.PoolReserveMiB, Org: d.cfg.Org}, d.log)
		return d.pools
	}
}

// sleepOf makes the sleep images of the Manager: none on a front end,
// where no sandbox sleeps or wakes.
func (d *Daemon) sleepOf(p *parts) func(*sandbox.Manager) sandbox.SleepImages {
	if d.frontEnd() {
		return nil
	}
	return func(m *sandbox.Manager) sandbox.SleepImages {
		d.sleep = sleep.New(sandbox.NewIdleCore(m), p.store, sleep.Config{DataDir: d.cfg.DataDir, Idle: d.cfg.Idle, Every: d.cfg.IdleEvery, Node: d.cfg.Node}, d.log)
		return d.sleep
	}
}

// templatePools are the catalog's warm pools: none on a front end (a nil
// *warmpool.Pools in an interface would not be nil). Its catalog never
// reaches them: it keeps no checkpoint template, and the calls about one
// go to its node.
func (d *Daemon) templatePools() template.Pools {
	if d.pools == nil {
		return nil
	}
	return d.pools
}

// withPools serves the warm pools' routes: a front end keeps none (those
// of a checkpoint, or of a checkpoint template, go to its node).
func (d *Daemon) withPools() server.Option {
	if d.frontEnd() {
		return server.WithPools(frontEndPools{d.cfg.Node})
	}
	return server.WithPools(d.pools)
}

// frontEndPools are a front end's warm pools: none. A pool is kept by the
// node that makes its members, so each node keeps its own pool of a
// built-in template; a call about one that reaches the front end answers
// unavailable, saying so.
type frontEndPools struct{ node string }

func (fp frontEndPools) err() error {
	return api.Errorf(api.CodeUnavailable, "node %s is a cluster's front end (--role api), which keeps no warm pool: each node keeps its own; set it through a node", fp.node)
}

func (fp frontEndPools) SetCheckpointPool(context.Context, string, string, int) (*api.Pool, error) {
	return nil, fp.err()
}
func (fp frontEndPools) CheckpointPool(context.Context, string, string) (*api.Pool, error) {
	return nil, fp.err()
}
func (fp frontEndPools) SetTemplatePool(context.Context, string, int) (*api.Pool, error) {
	return nil, fp.err()
}
func (fp frontEndPools) TemplatePool(context.Context, string) (*api.Pool, error) {
	return nil, fp.err()
}

// withCatalog serves the templates and images: a front end's own are the
// cluster's, read from the records and the nodes' leases.
func (d *Daemon) withCatalog(p *parts) server.Option {
	if !d.frontEnd() {
		return func(s *server.Server) {
			server.WithTemplates(p.catalog)(s)
			server.WithImages(p.images, p.registries)(s)
		}
	}
	return func(s *server.Server) {
		server.WithTemplates(frontEndTemplates{p.catalog, d.cfg.Node})(s)
		server.WithImages(frontEndImages{p.images, d.cfg.Node}, p.registries)(s)
	}
}
