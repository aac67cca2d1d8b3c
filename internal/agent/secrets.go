package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"loam.dev/loam/internal/agent/account"
)

// secretFilesList, in the identity dir (root's, mode 0600), lists the
// secret files the agent wrote last, one path a line, so that the next
// identity removes those it no longer names: a fork that gives its own
// secrets wakes up with its source's files on its disk.
const secretFilesList = "secret_files"

// secretEnv is the request's env over the sandbox's secrets as the daemon
// last sent them (see Identity), for every process: exec sessions and
// services alike.
func (h *handler) secretEnv(req map[string]string) map[string]string {
	id := h.identity.Load()
	if id == nil || len(id.SecretEnv) == 0 {
		return req
	}
	env := maps.Clone(id.SecretEnv)
	maps.Copy(env, req)
	return env
}

// writeSecretFiles writes the identity's secret files: each whole (write,
// chown, rename), mode 0400, owned by the default user (root if the
// sandbox has none), its directory made (0755) if missing. Files the agent
// wrote before and the identity no longer names are removed. Only the init
// of a sandbox writes them: an agent run elsewhere (in tests) leaves its
// machine alone.
func (h *handler) writeSecretFiles(files map[string]string) error {
	if os.Getpid() != 1 {
		return nil
	}
	idir, err := openDir(h.identityDir, true)
	if err != nil {
		return fmt.Errorf("writing secret files: %w", err)
	}
	defer unix.Close(idir)
	if old, err := readAt(idir, secretFilesList, maxSecretFilesList); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(old))
		for sc.Scan() {
			if p := sc.Text(); p != "" && filepath.IsAbs(p) {
				if _, keep := files[p]; !keep {
					removeAt(p)
				}
			}
		}
	}
	uid, gid := 0, 0
	if a, err := account.Lookup(h.passwdPath, h.groupPath, h.user); err == nil {
		uid, gid = int(a.UID), int(a.GID)
	}
	paths := slices.Sorted(maps.Keys(files))
	// The list first: a crash midway leaves no file it does not name.
	if err := replaceAt(idir, secretFilesList, []byte(strings.Join(paths, "\n")+"\n"), 0o600, 0, 0); err != nil {
		return fmt.Errorf("writing secret files: %w", err)
	}
	var full []error
	for _, p := range paths {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return fmt.Errorf("writing secret files: %q is not a clean absolute path", p)
		}
		// The directory may be the user's (its home): opened without
		// following a link it planted, and the file made in it anew.
		err := func() error {
			dir, err := openDir(filepath.Dir(p), true)
			if err != nil {
				return err
			}
			defer unix.Close(dir)
			return replaceAt(dir, filepath.Base(p), []byte(files[p]), 0o400, uid, gid)
		}()
		switch {
		case isNoSpace(err):
			// The others may fit (one may be unchanged); a full
			// disk is said once all are tried.
			full = append(full, fmt.Errorf("writing secret file %s: %w", p, err))
		case err != nil:
			return fmt.Errorf("writing secret file %s: %w", p, err)
		}
	}
	return errors.Join(full...)
}

// maxSecretFilesList bounds what is read of the list: 64 paths of at most
// PATH_MAX each fit it.
const maxSecretFilesList = 1 << 20

// removeAt removes the file at path (absolute) without following a link on
// the way to it; a file already gone, or a path that leads through a link,
// is left alone.
func removeAt(path string) {
	dir, err := openDir(filepath.Dir(path), false)
	if err != nil {
		return
	}
	defer unix.Close(dir)
	_ = unix.Unlinkat(dir, filepath.Base(path), 0)
}
