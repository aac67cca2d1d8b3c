package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	list := filepath.Join(h.identityDir, secretFilesList)
	if old, err := os.ReadFile(list); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(old))
		for sc.Scan() {
			if p := sc.Text(); p != "" {
				if _, keep := files[p]; !keep {
					_ = os.Remove(p)
				}
			}
		}
	}
	uid, gid := 0, 0
	if a, err := lookupAccount(h.passwdPath, h.groupPath, h.user); err == nil {
		uid, gid = int(a.UID), int(a.GID)
	}
	paths := slices.Sorted(maps.Keys(files))
	// The list first: a crash midway leaves no file it does not name.
	if err := replaceFile(list, []byte(strings.Join(paths, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("writing secret files: %w", err)
	}
	for _, p := range paths {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return fmt.Errorf("writing secret files: %q is not a clean absolute path", p)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("writing secret file %s: %w", p, err)
		}
		tmp := p + ".loam-tmp"
		_ = os.Remove(tmp)
		// A new file, chowned through its descriptor: a symlink the user
		// plants at tmp after the remove is neither written nor chowned.
		if err := writeNew(tmp, []byte(files[p]), 0o400, uid, gid); err != nil {
			return fmt.Errorf("writing secret file %s: %w", p, err)
		}
		if err := os.Rename(tmp, p); err != nil {
			_ = os.Remove(tmp)
			return fmt.Errorf("writing secret file %s: %w", p, err)
		}
	}
	return nil
}
