package disk

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"loam.dev/loam/api"
)

func TestIsNoSpace(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"ENOSPC wrapped", fmt.Errorf("writing: %w", syscall.ENOSPC), true},
		{"EDQUOT", syscall.EDQUOT, true},
		{"runsc's words", errors.New("runsc checkpoint: exit status 128: closing state file failed: no space left on device"), true},
		{"cp's words", errors.New("cp: error writing 'x': No space left on device"), true},
		{"sqlite's words", errors.New("database or disk is full (13)"), true},
		{"another errno", syscall.EIO, false},
		{"another error", errors.New("runsc checkpoint: exit status 1"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsNoSpace(tt.err); got != tt.want {
				t.Errorf("IsNoSpace(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestRequireSpace(t *testing.T) {
	dir := t.TempDir()
	free, err := FreeBytes(dir)
	if err != nil || free <= 0 {
		t.Fatalf("FreeBytes(%s) = %d, %v", dir, free, err)
	}
	// A directory not made yet is measured on its nearest parent.
	if got, err := FreeBytes(filepath.Join(dir, "not", "yet")); err != nil || got <= 0 {
		t.Errorf("FreeBytes of a missing dir = %d, %v; want its parent's", got, err)
	}
	if err := RequireSpace(dir, "a test", 1<<20); err != nil && free > 1<<30 {
		t.Errorf("RequireSpace of 1 MiB with %d free: %v", free, err)
	}
	err = RequireSpace(dir, "a memory checkpoint", free+(1<<40))
	if !errors.Is(err, api.ErrInsufficientStorage) {
		t.Fatalf("RequireSpace of more than is free: %v, want insufficient_storage", err)
	}
	if !strings.Contains(err.Error(), "not enough space in the data dir for a memory checkpoint of") || !strings.Contains(err.Error(), "free") {
		t.Errorf("message %q does not say what was short", err)
	}
	// Within the free space but not beside the reserve.
	if free > ReserveBytes {
		err := RequireSpace(dir, "an upload", free-ReserveBytes/2)
		if !errors.Is(err, api.ErrInsufficientStorage) || !strings.Contains(err.Error(), "kept in reserve") {
			t.Errorf("RequireSpace into the reserve: %v, want insufficient_storage naming the reserve", err)
		}
	}
	if err := SpaceError(errors.New("other"), dir, "x"); errors.Is(err, api.ErrInsufficientStorage) {
		t.Errorf("SpaceError of another error: %v", err)
	}
	if err := SpaceError(fmt.Errorf("w: %w", syscall.ENOSPC), dir, "a fork"); !errors.Is(err, api.ErrInsufficientStorage) || !strings.Contains(err.Error(), "during a fork") {
		t.Errorf("SpaceError of ENOSPC: %v", err)
	}
}
