package sleep

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
)

// The sleep images on disk. A sleeping sandbox's memory is one image in
// DATA_DIR/sandboxes/ID/sleep/mem, with the agent token generation it
// holds in sleep/held; the runtime writes it into a temporary dir of the
// sleep dir (sleep/.tmp-*/mem), from which it is renamed once synced. An
// image that is dropped leaves by one rename to sandboxes/ID/.sleep-dropped
// first, so that a crash never leaves half an image where a restart would
// take it for one. None of these names may change: a daemon of another
// version takes back the sandboxes this one put to sleep.
const (
	sleepDir   = "sleep"
	droppedDir = ".sleep-dropped"
	// memDir is the memory image inside a sleep dir (and inside its
	// temporary dirs), as inside a checkpoint's dir.
	memDir = "mem"
	// heldFile holds the token generation the sleeping agent holds: memory
	// checkpoints taken while it sleeps move the sandbox's on.
	heldFile = "held"
	// tmpPrefix names the temporary dirs an image is written into; the
	// core's recovery looks for an unfinished image there (sleep/.tmp-*/mem).
	tmpPrefix = ".tmp-"
)

// Images keeps the memory images of sleeping sandboxes under a daemon's
// data dir. It holds no state of its own but the files: every method may
// be called at any time, and the caller orders the calls on one sandbox
// (the core holds the sandbox's operation around them).
type Images struct {
	dataDir string
}

// NewImages keeps the sleep images under dataDir, the daemon's data dir.
func NewImages(dataDir string) *Images {
	return &Images{dataDir: dataDir}
}

// sandboxDir is sandbox id's own directory, the core's.
func (i *Images) sandboxDir(id string) string {
	return filepath.Join(i.dataDir, "sandboxes", id)
}

// Dir is sandbox id's sleep dir: there from the start of a sleep until the
// sandbox runs again, so that a crash between the two is seen.
func (i *Images) Dir(id string) string { return filepath.Join(i.sandboxDir(id), sleepDir) }

// Image is the durable memory image of sleeping sandbox id.
func (i *Images) Image(id string) string { return filepath.Join(i.Dir(id), memDir) }

// Has reports whether sandbox id has a durable sleep image.
func (i *Images) Has(id string) (bool, error) {
	_, err := os.Stat(i.Image(id))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Begin makes sandbox id's sleep dir afresh (what an earlier sleep left is
// dropped) and returns where the runtime is to write the image: inside a
// temporary dir of it, taken for an image only once Commit renames it.
func (i *Images) Begin(id string) (img string, err error) {
	dir := i.Dir(id)
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, tmpPrefix)
	if err != nil {
		return "", err
	}
	return filepath.Join(tmp, memDir), nil
}

// Commit makes the image Begin gave (img), written, sandbox id's durable
// sleep image, holding token generation gen: synced, with its generation,
// then renamed and the rename synced. Once it returns nil the sandbox
// sleeps, whatever comes after; until then a crash leaves no image. The
// disk the image expects must be synced before (the core's volume).
func (i *Images) Commit(id, img string, gen int) error {
	dir, tmp := i.Dir(id), filepath.Dir(img)
	if err := checkpoint.SyncTree(tmp); err != nil {
		return fmt.Errorf("syncing the sleep image: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, heldFile), []byte(strconv.Itoa(gen)), 0o600); err != nil {
		return err
	}
	if err := os.Rename(img, i.Image(id)); err != nil {
		return err
	}
	if err := checkpoint.SyncTree(dir); err != nil {
		return fmt.Errorf("syncing the sleep dir: %w", err)
	}
	crash.Point("sleep.durable")
	// Empty now: what is left of the write.
	_ = os.RemoveAll(tmp)
	return nil
}

// Drop removes sandbox id's sleep dir, if it has one (an image, or what a
// sleep cut short left): gone at once by a rename, then removed.
func (i *Images) Drop(id string) error {
	gone := filepath.Join(i.sandboxDir(id), droppedDir)
	if err := os.RemoveAll(gone); err != nil {
		return err
	}
	if err := os.Rename(i.Dir(id), gone); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.RemoveAll(gone)
}

// Sweep removes what a Drop cut short by a crash left of sandbox id's
// image. It reports whether there was any.
func (i *Images) Sweep(id string) (bool, error) {
	gone := filepath.Join(i.sandboxDir(id), droppedDir)
	if _, err := os.Stat(gone); err != nil {
		return false, nil
	}
	return true, os.RemoveAll(gone)
}

// HeldGen is the token generation the agent in sandbox id's sleep image
// holds; fallback (the sandbox's own) when the image says none.
func (i *Images) HeldGen(id string, fallback int) int {
	b, err := os.ReadFile(filepath.Join(i.Dir(id), heldFile))
	if err != nil {
		return fallback
	}
	gen, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fallback
	}
	return gen
}
