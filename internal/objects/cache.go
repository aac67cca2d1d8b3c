package objects

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Cache keeps the blobs a node fetched, in a directory of its own, up to
// a size (loam serve --cache-size), those used least recently going
// first: a second fork of one checkpoint on a node fetches nothing. A
// file is named after its digest and is complete and checked once it is
// there (Fetch), so the directory needs no index: what is in it is the
// cache, after a restart too. It is safe for concurrent use.
type Cache struct {
	dir string
	max int64

	mu       sync.Mutex
	fetching map[string]*fetch // by digest: one fetch of a blob at a time
}

type fetch struct {
	done chan struct{}
	err  error
}

// NewCache is a cache in dir (made if need be) of at most max bytes.
func NewCache(dir string, max int64) (*Cache, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("making the object cache: %w", err)
	}
	// Leftovers of fetches a crash cut short.
	parts, _ := filepath.Glob(filepath.Join(dir, "*.part-*"))
	for _, p := range parts {
		os.Remove(p)
	}
	return &Cache{dir: dir, max: max, fetching: map[string]*fetch{}}, nil
}

// path is where the cache keeps blob b.
func (c *Cache) path(b Blob) (string, error) {
	if _, err := b.key(); err != nil {
		return "", err
	}
	return filepath.Join(c.dir, strings.Replace(b.Digest, ":", "-", 1)), nil
}

// Get is the path of blob b in the cache, fetched from s first when it is
// not there. The file is the cache's: link or copy it to keep it past
// the next Get, which may evict it (an open file stays readable).
func (c *Cache) Get(ctx context.Context, s *Store, b Blob) (string, error) {
	p, err := c.path(b)
	if err != nil {
		return "", err
	}
	for {
		if info, err := os.Stat(p); err == nil && info.Size() == b.Size {
			now := time.Now()
			_ = os.Chtimes(p, now, now) // used: last out
			return p, nil
		}
		c.mu.Lock()
		f, busy := c.fetching[b.Digest]
		if !busy {
			f = &fetch{done: make(chan struct{})}
			c.fetching[b.Digest] = f
		}
		c.mu.Unlock()
		if busy {
			select {
			case <-f.done:
			case <-ctx.Done():
				return "", ctx.Err()
			}
			if f.err != nil {
				return "", f.err
			}
			continue
		}
		f.err = c.evict(b.Size)
		if f.err == nil {
			f.err = s.Fetch(ctx, b, p)
		}
		c.mu.Lock()
		delete(c.fetching, b.Digest)
		c.mu.Unlock()
		close(f.done)
		if f.err != nil {
			return "", f.err
		}
	}
}

// evict removes the least recently used blobs until room more bytes fit
// under the cache's size. A blob bigger than the whole cache is fetched
// all the same (the cache then holds it alone): refusing it would make
// the data unusable on this node.
func (c *Cache) evict(room int64) error {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return fmt.Errorf("reading the object cache: %w", err)
	}
	type kept struct {
		path string
		size int64
		used time.Time
	}
	var all []kept
	var total int64
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), "sha256-") || strings.Contains(e.Name(), ".part-") {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		all = append(all, kept{filepath.Join(c.dir, e.Name()), info.Size(), info.ModTime()})
		total += info.Size()
	}
	sort.Slice(all, func(i, j int) bool { return all[i].used.Before(all[j].used) })
	for _, k := range all {
		if total+room <= c.max {
			break
		}
		if err := os.Remove(k.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("evicting from the object cache: %w", err)
		}
		total -= k.size
	}
	return nil
}

// Size is the bytes the cache holds now.
func (c *Cache) Size() int64 {
	entries, _ := os.ReadDir(c.dir)
	var total int64
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			total += info.Size()
		}
	}
	return total
}
