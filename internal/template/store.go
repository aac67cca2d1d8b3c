// Package template is the catalog of the templates sandboxes are made
// from, of three kinds (Kinds): the built-in ones (base builds, built once
// per host and imported into the disk pool: Builtins), the OCI images the
// daemon pulled (package image), and checkpoint templates (a checkpoint
// kept under a name, which outlives its sandbox: Store).
//
// Store is what the sandbox core asks when it makes a sandbox (resolve a
// name to a disk template, hold a template while a sandbox of it is
// stored); Catalog is what the API serves (list, create, delete, export,
// import), made over the core.
package template

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/disk"
)

// Kinds are the kinds of template, in the order the catalog lists them.
var Kinds = []string{api.TemplateBuiltin, api.TemplateCheckpoint, api.TemplateImage}

// Builder knows the built-in templates and makes sure one is in the disk
// pool (Builtins is one).
type Builder interface {
	// List lists the built-in templates; Ready tells whether each is built.
	List(ctx context.Context) []api.Template
	// Ensure builds the template if needed and imports it into the pool.
	Ensure(ctx context.Context, name string) error
	// Has reports whether name is a built-in template.
	Has(name string) bool
}

// Store keeps the templates of this host: the built-in ones (through its
// Builder), which every org uses, and the checkpoint templates, each
// org's own (a name is unique within its org). Each checkpoint template
// is a directory
//
//	DATA_DIR/checkpoint-templates/<name>/manifest.json   checkpoint.Manifest
//	DATA_DIR/checkpoint-templates/<name>/mem/            memory image (memory templates)
//
// for the daemon's own org (where they were before orgs), and
// DATA_DIR/org-templates/<org>/<name>/… for another org's, plus the disk
// pool's read-only snapshot the manifest names (tpl.<name>.<random>). A template is made in a .tmp-… directory beside
// the others and appears by one rename once its snapshot and files are
// durable, and goes by one rename before its data is removed, so a crash
// never leaves a half-made (or half-deleted) template visible: start-up
// sweeps what such a crash left (see Sweep). Every method is safe for
// concurrent use.
type Store struct {
	builtins Builder
	disks    disk.Pool
	dataDir  string
	// org is the daemon's own (loam serve --org): the org of calls that
	// name no caller.
	org string
	log *slog.Logger

	// mu orders changes to the checkpoint templates: held for writing to
	// publish or delete one, for reading while a sandbox is made from one
	// (Use) or one is exported.
	mu sync.RWMutex
	// exporting counts the exports in progress of each template (by
	// exportKey), under exportMu.
	exportMu  sync.Mutex
	exporting map[string]int
}

// NewStore makes the Store of the data dir dataDir, whose templates'
// disks are in disks; org is the daemon's own.
func NewStore(dataDir, org string, builtins Builder, disks disk.Pool, log *slog.Logger) *Store {
	return &Store{builtins: builtins, disks: disks, dataDir: dataDir, org: org, log: log, exporting: map[string]int{}}
}

// orgOf is the org of a call: its caller's, or the daemon's own.
func (s *Store) orgOf(ctx context.Context) string { return auth.OrgOr(ctx, s.org) }

func exportKey(org, name string) string { return org + "/" + name }

// snapPrefix starts the name of every template's disk snapshot; no
// checkpoint's snapshot (sandbox id "." checkpoint id) starts with it.
const snapPrefix = "tpl."

// memDir is where a memory template keeps its memory image, inside its
// directory (as a checkpoint does).
const memDir = "mem"

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// CheckName refuses a name that cannot name a template.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return api.Errorf(api.CodeInvalid, "name %q: a template name is 1-63 lower-case letters, digits, '.', '_' and '-', starting with a letter or digit", name)
	}
	return nil
}

// dir is the directory of the daemon's own org's checkpoint templates.
func (s *Store) dir() string { return filepath.Join(s.dataDir, "checkpoint-templates") }

// orgsDir holds the directories of the other orgs' checkpoint templates.
func (s *Store) orgsDir() string { return filepath.Join(s.dataDir, "org-templates") }

// dirOf is the directory of org's checkpoint templates. Org names are
// checked where orgs are made (sandbox.CheckOrg): a path component.
func (s *Store) dirOf(org string) string {
	if org == "" || org == s.org {
		return s.dir()
	}
	return filepath.Join(s.orgsDir(), org)
}

// Builtin reports whether name is a template the daemon provides.
func (s *Store) Builtin(name string) bool { return s.builtins.Has(name) }

// Builtins lists the built-in templates.
func (s *Store) Builtins(ctx context.Context) []api.Template { return s.builtins.List(ctx) }

// Ensure builds built-in template name if needed and imports it into the
// disk pool.
func (s *Store) Ensure(ctx context.Context, name string) error { return s.builtins.Ensure(ctx, name) }

// MemDir is where checkpoint template name of org keeps its memory image.
func (s *Store) MemDir(org, name string) string {
	return filepath.Join(s.dirOf(org), name, memDir)
}

// Kept reads the manifest of org's checkpoint template name; nil when
// there is none.
func (s *Store) Kept(org, name string) (*checkpoint.Manifest, error) {
	if CheckName(name) != nil {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(s.dirOf(org), name, checkpoint.ManifestEntry))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading template %s: %w", name, err)
	}
	var man checkpoint.Manifest
	if err := json.Unmarshal(b, &man); err != nil {
		return nil, fmt.Errorf("reading template %s: %w", name, err)
	}
	man.Name = name
	man.Org = org
	if org == "" {
		man.Org = s.org
	}
	return &man, nil
}

// Use holds org's checkpoint template name against deletion until release
// is called: a sandbox of it is being made, and counts as its use once
// stored. man is nil (and release nil) when there is no such template.
func (s *Store) Use(org, name string) (man *checkpoint.Manifest, release func(), err error) {
	s.mu.RLock()
	if man, err = s.Kept(org, name); err != nil || man == nil {
		s.mu.RUnlock()
		return nil, nil, err
	}
	return man, s.mu.RUnlock, nil
}

// list reads every checkpoint template of org, sorted by name.
func (s *Store) list(org string) ([]*checkpoint.Manifest, error) {
	entries, err := os.ReadDir(s.dirOf(org))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	var out []*checkpoint.Manifest
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		man, err := s.Kept(org, e.Name())
		if err != nil {
			return nil, err
		}
		if man != nil {
			out = append(out, man)
		}
	}
	return out, nil
}

// checkFree refuses name when a template of that name exists in org.
func (s *Store) checkFree(org, name string) error {
	if s.Builtin(name) {
		return api.Errorf(api.CodeConflict, "template %q exists (a built-in)", name)
	}
	if have, err := s.Kept(org, name); err != nil {
		return err
	} else if have != nil {
		return api.Errorf(api.CodeConflict, "template %q exists", name)
	}
	return nil
}

// publish makes checkpoint template man.Name of org: fill puts its memory
// image (if any) in tmp and its disk in snapshot snap, then the manifest
// is written and all is made durable, and the template appears by one
// rename. On an error nothing is left.
func (s *Store) publish(ctx context.Context, org string, man *checkpoint.Manifest, fill func(tmp, snap string) error) (err error) {
	if err := s.checkFree(org, man.Name); err != nil {
		return err
	}
	dir, err := s.makeDirOf(org)
	if err != nil {
		return fmt.Errorf("making template %s: %w", man.Name, err)
	}
	tmp, err := os.MkdirTemp(dir, ".tmp-"+man.Name+"-")
	if err != nil {
		return fmt.Errorf("making template %s: %w", man.Name, err)
	}
	snap := snapPrefix + man.Name + "." + randomHex(6)
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
			_ = s.disks.DeleteSnapshot(context.WithoutCancel(ctx), snap)
		}
	}()
	if err := fill(tmp, snap); err != nil {
		return fmt.Errorf("making template %s: %w", man.Name, err)
	}
	crash.Point("template.filled")
	man.Snapshot = snap
	man.SizeBytes = checkpoint.TreeBytes(s.disks.SnapshotPath(snap)) + checkpoint.TreeBytes(filepath.Join(tmp, memDir))
	body, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, checkpoint.ManifestEntry), body, 0o600); err != nil {
		return fmt.Errorf("making template %s: %w", man.Name, err)
	}
	if err := checkpoint.SyncVolume(s.disks.SnapshotPath(snap)); err != nil {
		return err
	}
	if err := checkpoint.SyncTree(tmp); err != nil {
		return err
	}
	crash.Point("template.synced")
	s.mu.Lock()
	defer s.mu.Unlock()
	final := filepath.Join(dir, man.Name)
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
			return api.Errorf(api.CodeConflict, "template %q exists", man.Name)
		}
		return fmt.Errorf("making template %s: %w", man.Name, err)
	}
	man.Org = org
	return checkpoint.SyncDirs(dir, s.dataDir)
}

// makeDirOf makes org's directory of templates, durably, and returns it.
func (s *Store) makeDirOf(org string) (string, error) {
	dir := s.dirOf(org)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, checkpoint.SyncDirs(dir, s.dataDir)
}

// exportStart marks template name as being read, so that a delete
// meanwhile is refused, without holding mu for as long as the stream
// lasts. It gives its manifest (nil when there is none) and the func that
// ends the mark.
func (s *Store) exportStart(org, name string) (*checkpoint.Manifest, func(), error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	man, err := s.Kept(org, name)
	if err != nil || man == nil {
		return nil, func() {}, err
	}
	k := exportKey(man.Org, name)
	s.exportMu.Lock()
	s.exporting[k]++
	s.exportMu.Unlock()
	return man, func() {
		s.exportMu.Lock()
		if s.exporting[k]--; s.exporting[k] == 0 {
			delete(s.exporting, k)
		}
		s.exportMu.Unlock()
	}, nil
}

// Sweep removes what a crash left of templates being made or deleted. Of
// a disk snapshot, owned tells whether it is a template's (named so) and
// whether a published template holds it: recovery deletes the template
// snapshots none holds.
func (s *Store) Sweep() (owned func(snap string) (template, held bool), err error) {
	held := map[string]bool{}
	owned = func(snap string) (bool, bool) { return strings.HasPrefix(snap, snapPrefix), held[snap] }
	orgs := []string{s.org}
	entries, err := os.ReadDir(s.orgsDir())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("listing the orgs' templates: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			// A deleted org's templates (DropOrg), cut short.
			s.log.Info("removing a deleted org's templates", "path", e.Name())
			errs = append(errs, os.RemoveAll(filepath.Join(s.orgsDir(), e.Name())))
			continue
		}
		orgs = append(orgs, e.Name())
	}
	for _, org := range orgs {
		errs = append(errs, s.sweepOrg(org, held))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return owned, nil
}

// sweepOrg is Sweep of org's directory: what a crash left goes, and the
// snapshots of its templates are held.
func (s *Store) sweepOrg(org string, held map[string]bool) error {
	dir := s.dirOf(org)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing templates: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			s.log.Info("removing unfinished template data", "path", e.Name(), "org", org)
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
			continue
		}
		man, err := s.Kept(org, e.Name())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if man != nil {
			held[man.Snapshot] = true
		}
	}
	return errors.Join(errs...)
}

// DropOrg deletes every checkpoint template of org, deleted with it: its
// directory goes by one rename (what a crash leaves of the rest, Sweep
// removes), then their snapshots and data. The daemon's own org is never
// deleted.
func (s *Store) DropOrg(ctx context.Context, org string) error {
	if org == "" || org == s.org {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	mans, err := s.list(org)
	if err != nil {
		return err
	}
	gone := filepath.Join(s.orgsDir(), ".del-"+org+"-"+randomHex(6))
	if err := os.Rename(s.dirOf(org), gone); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("deleting the templates of org %s: %w", org, err)
	}
	var errs []error
	for _, man := range mans {
		errs = append(errs, s.disks.DeleteSnapshot(ctx, man.Snapshot))
	}
	errs = append(errs, os.RemoveAll(gone))
	if err := errors.Join(errs...); err != nil {
		s.log.Warn("removing the templates of a deleted org", "org", org, "err", err)
	}
	return nil
}

// Usage is how many checkpoint templates org has and what they hold
// (their disks' files and memory images), for its disk quota.
func (s *Store) Usage(org string) (count int, bytes int64, err error) {
	mans, err := s.list(org)
	if err != nil {
		return 0, 0, err
	}
	for _, man := range mans {
		bytes += man.SizeBytes
	}
	return len(mans), bytes, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Held names every checkpoint template of this host, of every org, as
// "org/name", sorted by org and name: what a node of a cluster reports
// with its lease, since until templates travel a sandbox of one can be
// made here alone. It reads directories only, no manifest: it runs with
// every renewal.
func (s *Store) Held() []string {
	var out []string
	add := func(org, dir string) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return // none yet, or unreadable: Sweep and List say why
		}
		for _, e := range ents {
			if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && CheckName(e.Name()) == nil {
				out = append(out, org+"/"+e.Name())
			}
		}
	}
	add(s.org, s.dir())
	orgs, _ := os.ReadDir(s.orgsDir())
	for _, o := range orgs {
		if o.IsDir() && !strings.HasPrefix(o.Name(), ".") && o.Name() != s.org {
			add(o.Name(), filepath.Join(s.orgsDir(), o.Name()))
		}
	}
	slices.Sort(out)
	return out
}
