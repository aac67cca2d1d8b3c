// Package image pulls OCI images (from a registry, an OCI layout directory
// or a `docker save` tarball) and unpacks each into a read-only disk
// template, cached by digest, that the sandboxes made from it share copy
// on write. Pulls run in the background in Service.Run; their records are
// in the metadata store and their progress, in bytes, in memory.
package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/store"
)

// Records is what the Service needs of the metadata store (store/sqlite
// has it): images by org, "" listing every org's.
type Records interface {
	PutImage(ctx context.Context, im *store.Image) error
	GetImage(ctx context.Context, org, id string) (*store.Image, error)
	ListImages(ctx context.Context, org string) ([]*store.Image, error)
	DeleteImage(ctx context.Context, org, id string) error
}

// Sandboxes lists the sandboxes (store/sqlite has it): an image that one
// of them uses is not deleted.
type Sandboxes interface {
	ListSandboxes(ctx context.Context, f store.Filter) ([]*store.Sandbox, error)
}

// Config configures a Service.
type Config struct {
	Records Records
	// Sandboxes are the sandboxes Delete checks; nil checks none.
	Sandboxes Sandboxes
	// Pool is where the images' templates are imported; CacheDir is where
	// they are unpacked first (with the built-in templates' disk.Cache).
	Pool     disk.Pool
	CacheDir string
	// Org is the daemon's own org (loam serve --org): the org of calls
	// that name no caller, and the one whose images a sandbox of any org
	// finds when its own has none (Lookup).
	Org string
	// Keychain gives the registry credentials of an org's pulls;
	// authn.DefaultKeychain for every org when nil.
	Keychain func(org string) authn.Keychain
	// Workers is how many pulls run at once; 2 when 0.
	Workers int
	Log     *slog.Logger
}

// Service pulls images and keeps their records. Start Run before Pull;
// every method is safe for concurrent use.
type Service struct {
	cfg   Config
	cache disk.Cache
	queue chan imageKey

	mu      sync.Mutex
	pulling map[imageKey]*pull // pulls queued or running

	// inUse keeps an image from being deleted while a create of it is
	// between its pull and the end of its boot: creates hold the read
	// side (Hold), Delete the write side.
	inUse sync.RWMutex
}

// imageKey names an image: its id within its org.
type imageKey struct{ org, id string }

// pull is one pull in progress.
type pull struct {
	read atomic.Int64  // compressed bytes of layers read
	done chan struct{} // closed when it ends, with the record stored
	err  error         // why it failed, set before done is closed
}

// Resolved is an image ready for sandboxes: its template and its config.
type Resolved struct {
	Ref      string
	Template string
	Config   api.ImageConfig
}

// New makes a Service.
func New(cfg Config) *Service {
	if cfg.Keychain == nil {
		cfg.Keychain = func(string) authn.Keychain { return authn.DefaultKeychain }
	}
	if cfg.Workers == 0 {
		cfg.Workers = 2
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Service{cfg: cfg, queue: make(chan imageKey, 1024), pulling: map[imageKey]*pull{}}
}

// orgOf is the org of a call: its caller's, or the daemon's own.
func (s *Service) orgOf(ctx context.Context) string { return auth.OrgOr(ctx, s.cfg.Org) }

// Run pulls what is asked until ctx ends, starting with the pulls a
// previous daemon left unfinished; it returns once its workers have, nil
// when ctx ended. A pull cut short stays "pulling" in the store, for the
// next Run to take up. The daemon runs it as a component.
func (s *Service) Run(ctx context.Context) error {
	list, err := s.cfg.Records.ListImages(ctx, "")
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("resuming image pulls: %w", err)
	}
	for _, im := range list {
		if im.State == api.ImagePulling {
			s.enqueue(imageKey{im.Org, im.ID})
		}
	}
	var wg sync.WaitGroup
	for range s.cfg.Workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case k := <-s.queue:
					s.pull(ctx, k)
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// enqueue starts a pull of image k unless one is under way, and returns it.
func (s *Service) enqueue(k imageKey) *pull {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.pulling[k]; ok {
		return p
	}
	p := &pull{done: make(chan struct{})}
	s.pulling[k] = p
	s.queue <- k
	return p
}

// Pull starts pulling ref for the caller's org unless it is pulled or
// being pulled, and returns the image's record as it is now. An image
// whose pull failed is pulled again. Each org pulls with its own registry
// credentials: another org's pull of the same ref is not its, though the
// layers of one digest are fetched and unpacked once.
func (s *Service) Pull(ctx context.Context, ref string) (*api.Image, error) {
	im, _, err := s.start(ctx, s.orgOf(ctx), ref)
	if err != nil {
		return nil, err
	}
	return s.view(im), nil
}

func (s *Service) start(ctx context.Context, org, ref string) (*store.Image, *pull, error) {
	ref, err := Canonical(ref)
	if err != nil {
		return nil, nil, err
	}
	if filepath.IsAbs(ref) && org != s.cfg.Org {
		return nil, nil, api.Errorf(api.CodeForbidden, "ref: %s is a path on the daemon's host, which only its own org (%s) pulls from; pull from a registry", ref, s.cfg.Org)
	}
	k := imageKey{org, ID(ref)}
	s.mu.Lock()
	p := s.pulling[k]
	s.mu.Unlock()
	im, err := s.cfg.Records.GetImage(ctx, k.org, k.id)
	if err == nil && im.State == api.ImageReady && p == nil {
		// A pool made afresh (a new data dir beside a kept template
		// cache) lacks the template: the pull makes it again.
		has, herr := s.cfg.Pool.HasTemplate(ctx, im.Template)
		if herr != nil {
			return nil, nil, fmt.Errorf("pulling %s: %w", ref, herr)
		}
		if !has {
			im.State = api.ImageError
		}
	}
	switch {
	case err == nil && (im.State == api.ImageReady || p != nil):
		return im, p, nil
	case err == nil: // failed, lost its template, or left pulling by a crash: again
		im.State, im.Error = api.ImagePulling, ""
	case errors.Is(err, store.ErrNotFound):
		im = &store.Image{Image: api.Image{ID: k.id, Ref: ref, State: api.ImagePulling, CreatedAt: store.Now()}, Org: org}
	default:
		return nil, nil, fmt.Errorf("pulling %s: %w", ref, err)
	}
	if err := s.requireSpace("an image pull", 0); err != nil {
		return nil, nil, err
	}
	if err := s.cfg.Records.PutImage(ctx, im); err != nil {
		return nil, nil, fmt.Errorf("pulling %s: %w", ref, err)
	}
	crash.Point("image.recorded")
	return im, s.enqueue(k), nil
}

// Ensure pulls ref for org if it is not ready and waits for it, then gives
// what a sandbox needs of it. A failed pull is the client's: invalid.
func (s *Service) Ensure(ctx context.Context, org, ref string) (*Resolved, error) {
	im, p, err := s.start(ctx, org, ref)
	if err != nil {
		return nil, err
	}
	if p != nil {
		select {
		case <-p.done:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		if errors.Is(p.err, api.ErrInsufficientStorage) {
			// The host's lack of room, not the image's fault: not invalid.
			return nil, p.err
		}
		if im, err = s.cfg.Records.GetImage(ctx, org, im.ID); err != nil {
			return nil, fmt.Errorf("pulling %s: %w", im.Ref, err)
		}
	}
	return resolved(im)
}

// Lookup gives what a sandbox of org needs of an image pulled already (the
// image of a sandbox or checkpoint): org's own, or else the daemon's own
// org's, for the sandboxes made from its checkpoint templates before
// templates were each org's; not_found if it is gone.
func (s *Service) Lookup(ctx context.Context, org, ref string) (*Resolved, error) {
	im, err := s.cfg.Records.GetImage(ctx, org, ID(ref))
	if errors.Is(err, store.ErrNotFound) && org != s.cfg.Org {
		im, err = s.cfg.Records.GetImage(ctx, s.cfg.Org, ID(ref))
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.Errorf(api.CodeNotFound, "image %s is not pulled", ref)
	}
	if err != nil {
		return nil, err
	}
	return resolved(im)
}

// Hold is Lookup for a create that is about to make a sandbox of ref: the
// image cannot be deleted (Delete waits) until release is called, once
// the sandbox is stored. Take it after Ensure, which may take minutes, so
// that a Delete waiting for it holds up no other create.
func (s *Service) Hold(ctx context.Context, org, ref string) (res *Resolved, release func(), err error) {
	s.inUse.RLock()
	if res, err = s.Lookup(ctx, org, ref); err != nil {
		s.inUse.RUnlock()
		return nil, nil, err
	}
	return res, s.inUse.RUnlock, nil
}

func resolved(im *store.Image) (*Resolved, error) {
	switch {
	case im.State == api.ImageError:
		return nil, api.Errorf(api.CodeInvalid, "image: pulling %s failed: %s", im.Ref, im.Error)
	case im.State != api.ImageReady:
		return nil, api.Errorf(api.CodeConflict, "image: %s is still being pulled", im.Ref)
	case im.UserMissing:
		return nil, api.Errorf(api.CodeInvalid, "image: %s runs as user %q, which its /etc/passwd lacks", im.Ref, im.Config.User)
	}
	return &Resolved{Ref: im.Ref, Template: im.Template, Config: im.Config}, nil
}

// Get is one image of the caller's org, by id.
func (s *Service) Get(ctx context.Context, id string) (*api.Image, error) {
	im, err := s.cfg.Records.GetImage(ctx, s.orgOf(ctx), id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.Errorf(api.CodeNotFound, "image %q not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("getting image %s: %w", id, err)
	}
	return s.view(im), nil
}

// List lists the images of the caller's org, oldest first.
func (s *Service) List(ctx context.Context) ([]api.Image, error) {
	list, err := s.cfg.Records.ListImages(ctx, s.orgOf(ctx))
	if err != nil {
		return nil, err
	}
	out := make([]api.Image, 0, len(list))
	for _, im := range list {
		out = append(out, *s.view(im))
	}
	return out, nil
}

// templateDeleter is a pool that can delete a template (disk.Btrfs and
// disk.Copy can).
type templateDeleter interface {
	DeleteTemplate(ctx context.Context, name string) error
}

// templateLister is a pool that can list its templates (disk.Btrfs and
// disk.Copy can).
type templateLister interface {
	Templates(ctx context.Context) ([]string, error)
}

// Sweep deletes from the pool the templates of images no record names:
// what a crash in Remove, between the record and the template, leaves.
// Call it at start-up, before Run and before any pull. Images' unpacked
// trees are in a cache daemons on this host share, and stay (as trees of
// old recipes do).
func (s *Service) Sweep(ctx context.Context) error {
	list, err := s.cfg.Records.ListImages(ctx, "")
	if err != nil {
		return fmt.Errorf("sweeping image templates: %w", err)
	}
	lister, ok1 := s.cfg.Pool.(templateLister)
	deleter, ok2 := s.cfg.Pool.(templateDeleter)
	if !ok1 || !ok2 {
		return nil
	}
	names, err := lister.Templates(ctx)
	if err != nil {
		return err
	}
	held := map[string]bool{}
	for _, im := range list {
		if im.Digest != "" {
			held[template(im.Digest, nil).Name] = true
		}
		if im.Template != "" {
			held[im.Template] = true
		}
	}
	var errs []error
	for _, name := range names {
		if !strings.HasPrefix(name, imageTemplatePrefix) || held[name] {
			continue
		}
		s.cfg.Log.Info("removing the template of an image that is gone", "template", name)
		errs = append(errs, deleter.DeleteTemplate(ctx, name))
	}
	return errors.Join(errs...)
}

// Delete forgets image id of the caller's org (see Remove), unless a
// sandbox uses it: that is a conflict naming the sandbox. No sandbox of
// the image appears meanwhile (see Hold). An image of the daemon's own
// org may be used by any org's sandboxes (see Lookup); another org's,
// only by its own.
func (s *Service) Delete(ctx context.Context, id string) error {
	s.inUse.Lock()
	defer s.inUse.Unlock()
	org := s.orgOf(ctx)
	im, err := s.Get(ctx, id)
	if err != nil {
		return err
	}
	if s.cfg.Sandboxes != nil {
		sbs, err := s.cfg.Sandboxes.ListSandboxes(ctx, store.UsersOf(org, s.cfg.Org))
		if err != nil {
			return fmt.Errorf("deleting image %s: %w", id, err)
		}
		for _, sb := range sbs {
			if sb.Image == im.Ref {
				return api.Errorf(api.CodeConflict, "image %s is used by sandbox %s", im.Ref, sb.Name)
			}
		}
	}
	return s.Remove(ctx, org, id)
}

// Remove forgets an image of org, by id, and, unless another image (of
// any org) has the same digest, its unpacked tree and its template in the
// pool, whether or not a sandbox uses it (Delete checks that): volumes and
// checkpoints made from it keep their data either way. One being pulled is
// a conflict.
func (s *Service) Remove(ctx context.Context, org, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pulling[imageKey{org, id}]; ok {
		return api.Errorf(api.CodeConflict, "image %s is being pulled", id)
	}
	im, err := s.cfg.Records.GetImage(ctx, org, id)
	if errors.Is(err, store.ErrNotFound) {
		return api.Errorf(api.CodeNotFound, "image %q not found", id)
	}
	if err != nil {
		return err
	}
	if err := s.cfg.Records.DeleteImage(ctx, org, id); err != nil {
		return fmt.Errorf("removing image %s: %w", id, err)
	}
	crash.Point("image-delete.record")
	if im.Digest == "" {
		return nil
	}
	list, err := s.cfg.Records.ListImages(ctx, "")
	if err != nil {
		return err
	}
	for _, other := range list {
		if other.Digest == im.Digest {
			return nil
		}
	}
	t := template(im.Digest, nil)
	// Under the tree's lock: another daemon sharing the cache may be
	// importing it.
	if err := s.cache.RemoveBuilt(ctx, s.cfg.CacheDir, t); err != nil {
		return fmt.Errorf("removing the unpacked tree of %s: %w", id, err)
	}
	if d, ok := s.cfg.Pool.(templateDeleter); ok {
		if err := d.DeleteTemplate(ctx, t.Name); err != nil {
			return fmt.Errorf("removing the template of %s: %w", id, err)
		}
	}
	return nil
}

func (s *Service) view(im *store.Image) *api.Image {
	v := im.Image
	if v.Config.Env == nil {
		v.Config.Env = []string{}
	}
	s.mu.Lock()
	p := s.pulling[imageKey{im.Org, im.ID}]
	s.mu.Unlock()
	switch {
	case p != nil:
		v.Pulled = min(p.read.Load(), max(v.Size, 0))
	case v.State == api.ImageReady:
		v.Pulled = v.Size
	}
	return &v
}

// pull pulls image k and stores how it went.
func (s *Service) pull(ctx context.Context, k imageKey) {
	id := k.id
	s.mu.Lock()
	p := s.pulling[k]
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.pulling, k)
		s.mu.Unlock()
		close(p.done)
	}()
	im, err := s.cfg.Records.GetImage(ctx, k.org, id)
	if err != nil {
		s.cfg.Log.Error("pulling image", "image", id, "err", err)
		return
	}
	if err := s.fetch(ctx, im, p); err != nil {
		if ctx.Err() != nil {
			return // the daemon is stopping: the next one takes it up
		}
		if disk.IsNoSpace(err) {
			s.cfg.Log.Warn("pulling image: out of space", "image", id, "err", err)
			err = disk.SpaceError(err, s.cfg.CacheDir, "the pull of "+im.Ref)
		}
		p.err = err
		s.cfg.Log.Error("pulling image", "image", id, "ref", im.Ref, "err", err)
		im.State, im.Error = api.ImageError, err.Error()
	} else {
		im.State = api.ImageReady
		s.cfg.Log.Info("image ready", "image", id, "ref", im.Ref, "digest", im.Digest)
	}
	if err := s.cfg.Records.PutImage(context.WithoutCancel(ctx), im); err != nil {
		s.cfg.Log.Error("storing image", "image", id, "err", err)
	}
}

// fetch resolves im with its org's registry credentials, unpacks it (once
// per digest) and imports its template into the pool, filling in the
// record. The manifest is always read with the org's own credentials, so
// that an org reaches no image another org's credentials pulled: only the
// layers of a digest it can read are shared.
func (s *Service) fetch(ctx context.Context, im *store.Image, p *pull) error {
	img, err := open(ctx, im.Ref, s.cfg.Keychain(im.Org))
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("reading the manifest of %s: %w", im.Ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("reading the config of %s: %w", im.Ref, err)
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("reading the layers of %s: %w", im.Ref, err)
	}
	var size int64
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return fmt.Errorf("reading the layers of %s: %w", im.Ref, err)
		}
		size += n
	}
	im.Digest, im.Size = digest.String(), size
	im.Config = api.ImageConfig{
		Env: cf.Config.Env, WorkingDir: cf.Config.WorkingDir, User: cf.Config.User,
		Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd,
	}
	if err := s.cfg.Records.PutImage(ctx, im); err != nil {
		return err
	}
	// Unpacked, the layers take about twice what they weigh compressed, in
	// the cache and again in the pool when the copy cannot share blocks.
	if err := s.requireSpace("the image "+im.Ref, 2*size); err != nil {
		return err
	}
	crash.Point("image.described")
	t := template(im.Digest, func(ctx context.Context, dir string) error {
		return unpackImage(ctx, layers, dir, &p.read)
	})
	dir, err := s.cache.EnsureBuilt(ctx, s.cfg.CacheDir, t)
	if err != nil {
		return err
	}
	p.read.Store(size) // unpacked before, by another image of this digest
	if im.UserMissing, err = userMissing(dir, im.Config.User); err != nil {
		return err
	}
	if err := s.cache.EnsureTemplate(ctx, s.cfg.Pool, s.cfg.CacheDir, t); err != nil {
		return err
	}
	im.Template = t.Name
	return nil
}

// requireSpace refuses work (what) needing need bytes when the template
// cache or the pool cannot hold it (disk.RequireSpace).
func (s *Service) requireSpace(what string, need int64) error {
	if err := disk.RequireSpace(s.cfg.CacheDir, what, need); err != nil {
		return err
	}
	// The pool's volumes directory: the filesystem the template goes on
	// (the loop image's, when the data dir is not btrfs).
	return disk.RequireSpace(filepath.Dir(s.cfg.Pool.VolumePath("probe")), what, need)
}

// imageTemplatePrefix starts the name of every image's template; no
// built-in template's name starts with it.
const imageTemplatePrefix = "image-"

// template is the disk template of the image with digest: named by it, so
// that every image of one digest shares one.
func template(digest string, build func(ctx context.Context, dir string) error) disk.Template {
	hex := strings.TrimPrefix(digest, "sha256:")
	return disk.Template{
		Name:        imageTemplatePrefix + hex[:min(len(hex), 16)],
		Description: "the OCI image " + digest,
		Build:       build,
		Recipe:      "image/1\n" + digest + "\n",
	}
}

// unpackImage applies layers onto dir, counting the bytes read in read,
// then adds what a sandbox needs and a minimal image may lack.
func unpackImage(ctx context.Context, layers []v1.Layer, dir string, read *atomic.Int64) error {
	u, err := NewUnpacker(dir)
	if err != nil {
		return err
	}
	defer u.Close()
	for i, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			return fmt.Errorf("fetching layer %d: %w", i+1, err)
		}
		err = u.ApplyCompressed(ctx, &counter{r: rc, n: read})
		rc.Close()
		if err != nil {
			return fmt.Errorf("applying layer %d: %w", i+1, err)
		}
	}
	return u.finish()
}

// finish gives the tree what the daemon writes into every sandbox's root
// (etc/ for its hostname and resolver) and what programs expect (a /tmp),
// and an account for root when there is no passwd file at all, so that
// the agent can run commands as the image's default user.
func (u *Unpacker) finish() error {
	for _, d := range []struct {
		name string
		mode fs.FileMode
	}{{"etc", 0o755}, {"tmp", 0o777 | fs.ModeSticky}} {
		if _, err := u.root.Lstat(d.name); errors.Is(err, fs.ErrNotExist) {
			if err := u.root.Mkdir(d.name, 0o700); err != nil {
				return err
			}
			if err := u.root.Chmod(d.name, d.mode); err != nil {
				return err
			}
		}
	}
	if _, err := u.root.Lstat("etc/passwd"); errors.Is(err, fs.ErrNotExist) {
		return u.root.WriteFile("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	}
	return nil
}

// userMissing tells whether user (USER of an image's config: name or uid,
// with an optional :group) has no line in the tree's /etc/passwd. No user
// is root, which finish made sure of.
func userMissing(dir, user string) (bool, error) {
	name, _, _ := strings.Cut(user, ":")
	if name == "" {
		name = "root"
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return false, err
	}
	defer r.Close()
	data, err := r.ReadFile("etc/passwd")
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the image's /etc/passwd: %w", err)
	}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		f := strings.Split(string(line), ":")
		if len(f) >= 7 && (f[0] == name || f[2] == name) {
			return false, nil
		}
	}
	return true, nil
}

// counter counts the bytes read through it.
type counter struct {
	r io.Reader
	n *atomic.Int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}
