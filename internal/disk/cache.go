package disk

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/crash"
)

// Cache builds templates once per recipe and imports them into pools.
//
// A cache directory holds one tree per template recipe,
// <name>-<first 12 hex digits of sha256(Recipe)>, plus a lock file per
// recipe and at most one .<name>-<hash>.building tree of a build in
// progress or killed. A tree appears under its final name only once it is
// complete and flushed, so a killed build is rebuilt rather than reused.
// Builds of one recipe are serialized across processes with flock(2), so
// parallel test packages build a template once and the others wait for it.
// Trees of old recipes are not removed.
//
// The zero Cache is ready to use and safe for concurrent use.
type Cache struct {
	imports keyedLock // one import per pool and template at a time

	mu       sync.Mutex
	progress map[string]*preparation // by template name, those under way in this process
}

// preparation is how far the preparation of a template has got, and how
// many callers are at it (EnsureTemplate calls EnsureBuilt: both count).
type preparation struct {
	done  float64
	users int
}

// Shares of a template's preparation (see Cache.Progress) after its build,
// which reports up to buildShare, and before its import into a pool.
const (
	buildShare  = 0.95
	importShare = 0.97
)

// Progress reports how far the preparation of template name (its build
// and its import into a pool, by EnsureBuilt or EnsureTemplate) has got in
// this process, from 0 to 1, and false when none is under way here. A
// build another process runs, which this one waits for, stays at 0.
func (c *Cache) Progress(name string) (float64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.progress[name]; ok {
		return p.done, true
	}
	return 0, false
}

// start records that the preparation of template name is under way and
// returns the function that reports its progress and the one that ends it.
// Several preparations of one name at once share the figure.
func (c *Cache) start(ctx context.Context, name string) (report func(float64), end func()) {
	c.mu.Lock()
	if c.progress == nil {
		c.progress = map[string]*preparation{}
	}
	p, ok := c.progress[name]
	if !ok {
		p = &preparation{}
		c.progress[name] = p
	}
	p.users++
	c.mu.Unlock()
	report = func(f float64) {
		c.mu.Lock()
		prev := p.done
		p.done = max(p.done, f)
		c.mu.Unlock()
		// A line every tenth of a build, for whoever watches the daemon's
		// log; an import (from importShare) says so itself.
		if f <= buildShare && int(f*10) > int(prev*10) {
			slog.InfoContext(ctx, "building template", "template", name, "progress", fmt.Sprintf("%.0f%%", f*100))
		}
	}
	return report, func() {
		c.mu.Lock()
		if p.users--; p.users == 0 {
			delete(c.progress, name)
		}
		c.mu.Unlock()
	}
}

// lockPoll is how often a build waits for another process's build lock;
// flock cannot be interrupted by a context.
const lockPoll = 100 * time.Millisecond

// Key returns the name of t's tree in a cache directory.
func (t Template) Key() string {
	sum := sha256.Sum256([]byte(t.Recipe))
	return t.Name + "-" + hex.EncodeToString(sum[:])[:12]
}

// EnsureBuilt returns the directory in cacheDir holding t's tree, building
// it first unless it is there already.
func (c *Cache) EnsureBuilt(ctx context.Context, cacheDir string, t Template) (string, error) {
	if err := t.check(); err != nil {
		return "", fmt.Errorf("building template: %w", err)
	}
	dir := filepath.Join(cacheDir, t.Key())
	if ok, err := exists(dir); err != nil {
		return "", fmt.Errorf("building template %s: %w", t.Name, err)
	} else if ok {
		return dir, nil
	}
	unlock, err := c.lockTree(ctx, cacheDir, t)
	if err != nil {
		return "", err
	}
	defer unlock()
	return c.buildLocked(ctx, cacheDir, t)
}

// check refuses a template the cache cannot build: a name that is no
// path component (it names the tree and its lock), or no Build.
func (t Template) check() error {
	if err := validName(t.Name); err != nil {
		return err
	}
	if t.Build == nil {
		return fmt.Errorf("%s: no Build function", t.Name)
	}
	return nil
}

// lockTree takes t's tree in cacheDir for this process: to build it, to
// import it into a pool, or to remove it (RemoveBuilt), each of which
// another daemon sharing the cache may be doing to the same tree.
func (c *Cache) lockTree(ctx context.Context, cacheDir string, t Template) (unlock func(), err error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("building template %s: %w", t.Name, err)
	}
	unlock, err = lockFile(ctx, filepath.Join(cacheDir, "."+t.Key()+".lock"), func() {
		slog.InfoContext(ctx, "waiting for another daemon's use of the template's tree", "template", t.Name)
	})
	if err != nil {
		return nil, fmt.Errorf("building template %s: %w", t.Name, err)
	}
	return unlock, nil
}

// RemoveBuilt removes t's tree from cacheDir, once no build or import of
// it (by any daemon sharing the cache) is under way.
func (c *Cache) RemoveBuilt(ctx context.Context, cacheDir string, t Template) error {
	unlock, err := c.lockTree(ctx, cacheDir, t)
	if err != nil {
		return err
	}
	defer unlock()
	return removeTree(filepath.Join(cacheDir, t.Key()))
}

// buildLocked is EnsureBuilt with t's tree locked (lockTree).
func (c *Cache) buildLocked(ctx context.Context, cacheDir string, t Template) (string, error) {
	key := t.Key()
	dir := filepath.Join(cacheDir, key)
	// Whoever held the lock may have built it.
	if ok, err := exists(dir); err != nil {
		return "", fmt.Errorf("building template %s: %w", t.Name, err)
	} else if ok {
		return dir, nil
	}

	// Holding the lock, we own the build directory; one found here is
	// what a killed build left.
	tmp := filepath.Join(cacheDir, "."+key+".building")
	if err := removeTree(tmp); err != nil {
		return "", fmt.Errorf("building template %s: %w", t.Name, err)
	}
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return "", fmt.Errorf("building template %s: %w", t.Name, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil { // the umask applies to Mkdir
		return "", fmt.Errorf("building template %s: %w", t.Name, err)
	}
	slog.InfoContext(ctx, "building template", "template", t.Name, "dir", dir)
	start := time.Now()
	report, end := c.start(ctx, t.Name)
	defer end()
	if err := t.Build(WithProgress(ctx, func(f float64) { report(f * buildShare) }), tmp); err != nil {
		if rerr := removeTree(tmp); rerr != nil {
			slog.WarnContext(ctx, "removing failed template build", "dir", tmp, "err", rerr)
		}
		return "", fmt.Errorf("building template %s: %w", t.Name, err)
	}
	report(buildShare)
	err := syncFS(tmp)
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		// A tree that may not be on disk whole (a full disk fails the
		// sync) is of no use to the next build: never leave it.
		if rerr := removeTree(tmp); rerr != nil {
			slog.WarnContext(ctx, "removing failed template build", "dir", tmp, "err", rerr)
		}
		return "", fmt.Errorf("building template %s: %w", t.Name, err)
	}
	crash.Point("cache.built")
	if err := atomicfile.SyncDir(cacheDir); err != nil {
		return "", fmt.Errorf("building template %s: %w", t.Name, err)
	}
	slog.InfoContext(ctx, "built template", "template", t.Name, "dir", dir, "took", time.Since(start).Round(time.Millisecond))
	return dir, nil
}

// EnsureTemplate makes sure pool has template t, building it in cacheDir
// if needed. The pool's template is named t.Name: one made from an older
// recipe is kept as it is.
func (c *Cache) EnsureTemplate(ctx context.Context, pool Pool, cacheDir string, t Template) error {
	unlock, err := c.imports.lock(ctx, fmt.Sprintf("%p/%s", pool, t.Name))
	if err != nil {
		return fmt.Errorf("ensuring template %s: %w", t.Name, err)
	}
	defer unlock()
	ok, err := pool.HasTemplate(ctx, t.Name)
	if err != nil {
		return fmt.Errorf("ensuring template %s: %w", t.Name, err)
	}
	if ok {
		return nil
	}
	report, end := c.start(ctx, t.Name)
	defer end()
	if err := t.check(); err != nil {
		return fmt.Errorf("ensuring template: %w", err)
	}
	// The tree stays locked until it is imported: another daemon sharing
	// the cache may not remove it meanwhile (RemoveBuilt).
	unlockTree, err := c.lockTree(ctx, cacheDir, t)
	if err != nil {
		return fmt.Errorf("ensuring template %s: %w", t.Name, err)
	}
	defer unlockTree()
	dir, err := c.buildLocked(ctx, cacheDir, t)
	if err != nil {
		return fmt.Errorf("ensuring template %s: %w", t.Name, err)
	}
	report(importShare)
	slog.InfoContext(ctx, "importing template", "template", t.Name, "cache", dir)
	if err := pool.ImportTemplate(ctx, t.Name, dir); err != nil {
		return fmt.Errorf("ensuring template %s: %w", t.Name, err)
	}
	crash.Point("cache.imported")
	return nil
}

// lockFile takes an exclusive flock on path, creating it, and waits until
// it is free or ctx ends; waiting is called once if it has to wait. The
// lock goes with the process, so a killed holder releases it.
func lockFile(ctx context.Context, path string, waiting func()) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	fd := int(f.Fd())
	tick := time.NewTicker(lockPoll)
	defer tick.Stop()
	for first := true; ; first = false {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if first && waiting != nil {
			waiting()
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, context.Cause(ctx))
		case <-tick.C:
		}
	}
	// Closing the file releases the lock.
	return func() { f.Close() }, nil
}
