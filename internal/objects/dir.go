package objects

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// PutDir stores every file under dir as a blob and returns them by their
// paths in dir, for a manifest. progress, when set, is told the bytes
// stored so far of all of them. dir is the node's own (a checkpoint it
// took): a symbolic link or a special file in it is refused, never
// followed.
func (s *Store) PutDir(ctx context.Context, dir string, progress func(done, total int64)) (map[string]Blob, error) {
	type file struct {
		rel  string
		size int64
	}
	var files []file
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", p)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		files = append(files, file{filepath.ToSlash(rel), info.Size()})
		total += info.Size()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("storing %s: %w", dir, err)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].rel < files[j].rel })
	out := make(map[string]Blob, len(files))
	var done int64
	for _, f := range files {
		var tell func(int64)
		if progress != nil {
			base := done
			tell = func(n int64) { progress(base+n, total) }
		}
		b, err := s.PutFile(ctx, filepath.Join(dir, filepath.FromSlash(f.rel)), tell)
		if err != nil {
			return nil, err
		}
		out[f.rel] = b
		done += b.Size
	}
	return out, nil
}

// FetchDir writes files (a manifest's) into dir, which it makes; each file
// is checked as Fetch checks it. A path that would leave dir is refused
// (GetManifest refuses such a manifest already).
func (s *Store) FetchDir(ctx context.Context, files map[string]Blob, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	for rel, b := range files {
		if !localPath(rel) {
			return fmt.Errorf("fetching into %s: file %q: %w", dir, rel, ErrCorrupt)
		}
		if sub := filepath.Dir(filepath.FromSlash(rel)); sub != "." {
			if err := root.MkdirAll(sub, 0o700); err != nil {
				return fmt.Errorf("fetching into %s: %w", dir, err)
			}
		}
		if err := s.Fetch(ctx, b, filepath.Join(dir, filepath.FromSlash(rel))); err != nil {
			return err
		}
	}
	return nil
}
