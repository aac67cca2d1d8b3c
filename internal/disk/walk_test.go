package disk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOpenDirRefusesLink is the race the walk guards against, made
// deterministic: a directory is listed, then swapped for a link to a
// directory outside before the walk opens it.
func TestOpenDirRefusesLink(t *testing.T) {
	src := t.TempDir()
	mustOK(t, os.Mkdir(filepath.Join(src, "d"), 0o755))
	d, err := openRoot(src)
	mustOK(t, err)
	defer d.close()
	st, err := d.lstat("d")
	mustOK(t, err)
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Fatalf("d: mode %#o, want a directory", st.Mode)
	}
	mustOK(t, os.Rename(filepath.Join(src, "d"), filepath.Join(src, "away")))
	mustOK(t, os.Symlink(t.TempDir(), filepath.Join(src, "d")))
	sub, err := d.openDir("d")
	if err == nil {
		sub.close()
		t.Fatal("opened a symlink as a directory")
	}
	if !errors.Is(err, errChanged) {
		t.Errorf("openDir: %v, want errChanged", err)
	}
	t.Log(err)
}

// TestWalkSkips: a walk skips deleted entries always, and entries that
// changed type only when asked to; other errors end it.
func TestWalkSkips(t *testing.T) {
	tests := []struct {
		name        string
		err         error
		skipChanged bool
		wantErr     bool
	}{
		{"vanished", fmt.Errorf("x: %w", errVanished), false, false},
		{"changed", fmt.Errorf("x: %w", errChanged), false, true},
		{"changed, skipped", fmt.Errorf("x: %w", errChanged), true, false},
		{"other", unix.EIO, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := t.TempDir()
			for _, name := range []string{"a", "b", "c"} {
				write(t, filepath.Join(src, name), name, 0o644)
			}
			d, err := openRoot(src)
			mustOK(t, err)
			defer d.close()
			v := &recorder{fail: "b", err: tt.err}
			err = walk(t.Context(), d, v, walkOptions{skipChanged: tt.skipChanged})
			if (err != nil) != tt.wantErr {
				t.Fatalf("walk: %v, want error %v", err, tt.wantErr)
			}
			if want := []string{"a", "b", "c"}; !tt.wantErr && !slices.Equal(v.seen, want) {
				t.Errorf("walk saw %q, want %q", v.seen, want)
			}
		})
	}
}

// recorder records the entries it sees and fails on one.
type recorder struct {
	seen []string
	fail string
	err  error
}

func (r *recorder) entry(ctx context.Context, d *dir, name string, st *unix.Stat_t) error {
	r.seen = append(r.seen, d.join(name))
	if d.join(name) == r.fail {
		return r.err
	}
	return nil
}

func (r *recorder) enter(ctx context.Context, d *dir, name string, sub *dir) (visitor, func(error) error, error) {
	return r, nil, nil
}
