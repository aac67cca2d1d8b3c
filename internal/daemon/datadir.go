package daemon

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/secret"
)

// lockFile, in the data dir, is held (flock) by the daemon that owns it.
const lockFile = "lock"

// secretFile, in the data dir, holds the key agent and in-sandbox tokens
// are derived from.
const secretFile = "secret"

// ErrDataDirInUse is returned when another daemon holds the data dir.
var ErrDataDirInUse = errors.New("data dir in use")

// lockDataDir makes dir (0700), tightening the mode of one that exists, and
// takes an exclusive lock on it, held until the returned func runs or the
// process ends. It fails at once, naming the holder's pid, when another
// daemon holds it: two daemons on one data dir would each take the other's
// sandboxes back, and sweep each other's work in progress.
func lockDataDir(dir string, log *slog.Logger) (unlock func() error, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("making data dir: %w", err)
	}
	if err := restrictMode(dir, 0o700, log); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking data dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			b, _ := os.ReadFile(path)
			holder := "unknown pid"
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				holder = "pid " + strconv.Itoa(pid)
			}
			return nil, fmt.Errorf("%w: data dir %s is used by another loam daemon (%s); stop it, or give this one another --data-dir", ErrDataDirInUse, dir, holder)
		}
		return nil, fmt.Errorf("locking data dir: %w", err)
	}
	// The pid is for the message above only; the lock is the flock.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f.Close, nil
}

// restrictMode takes every permission of group and others off path when
// it has more than mode allows, with a log line: an old data dir (or a
// token file made by hand) may have been readable by all.
func restrictMode(path string, mode fs.FileMode, log *slog.Logger) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.Mode().Perm()&^mode == 0 {
		return nil
	}
	if err := os.Chmod(path, st.Mode().Perm()&mode); err != nil {
		return fmt.Errorf("tightening the mode of %s: %w", path, err)
	}
	log.Warn("tightened the mode of a file of the daemon's; only root should read it",
		"path", path, "was", st.Mode().Perm().String(), "now", (st.Mode().Perm() & mode).String())
	return nil
}

// loadSecret reads the daemon's secret from the data dir, making it on the
// first start. It is what every agent token and in-sandbox token is derived
// from, so it must outlive restarts; the store holds no token at all.
func loadSecret(dir string, log *slog.Logger) ([]byte, error) {
	path := filepath.Join(dir, secretFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key := make([]byte, 32)
		_, _ = rand.Read(key) // never fails on Linux
		if err := atomicfile.WriteFile(path, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("storing the daemon's secret: %w", err)
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the daemon's secret: %w", err)
	}
	if err := restrictMode(path, 0o600, log); err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) < 16 {
		return nil, fmt.Errorf("reading the daemon's secret: %s is not a hex key of 16 bytes or more", path)
	}
	return key, nil
}

// secretsKeyFile, in the data dir, holds the key secrets are sealed with
// (internal/secret). It is apart from secretFile: that one derives tokens
// and this one only encrypts, and losing it loses every secret's value.
const secretsKeyFile = "secrets.key"

// loadSecretsKey reads the key secrets are sealed with, making it (mode
// 0600) on the first start.
func loadSecretsKey(dir string, log *slog.Logger) ([]byte, error) {
	path := filepath.Join(dir, secretsKeyFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key := make([]byte, secret.KeySize)
		_, _ = rand.Read(key) // never fails on Linux
		if err := atomicfile.WriteFile(path, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("storing the secrets key: %w", err)
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the secrets key: %w", err)
	}
	if err := restrictMode(path, 0o600, log); err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) != secret.KeySize {
		return nil, fmt.Errorf("reading the secrets key: %s is not a hex key of %d bytes", path, secret.KeySize)
	}
	return key, nil
}

// canonicalDir is dir as an absolute path with no symlinks.
func canonicalDir(dir string) (string, error) {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("resolving the data dir: %w", err)
	}
	return filepath.Abs(real)
}
