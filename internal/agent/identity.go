package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
)

// IdentityDir is where, inside a sandbox, the agent keeps what programs in
// it need to call loam about their own sandbox. The files have the names the
// CLI reads from a daemon's data dir (api_url, token), so the in-sandbox CLI
// finds them with no set-up, plus sandbox (the id) and sandbox_name.
const IdentityDir = "/var/lib/loam"

// AgentBinaryPath is where the agent's binary is mounted in every sandbox
// (runtime.AgentPath).
const AgentBinaryPath = "/.loam/loam"

// Identity tells a sandbox's agent which sandbox it is and where that
// sandbox's own API is. The daemon sends it after every boot, restore and
// fork: a fork wakes up with its source's identity in memory and on disk.
type Identity struct {
	SandboxID   string `json:"sandbox_id"`
	SandboxName string `json:"sandbox_name"`
	// APIURL and APIToken reach the in-sandbox API, which acts on this
	// sandbox only.
	APIURL   string `json:"api_url"`
	APIToken string `json:"api_token"`
	// Env is the sandbox's environment (its env at create), which the
	// agent gives services; an exec gets it with its request. It is kept
	// in memory only.
	Env map[string]string `json:"env,omitempty"`
	// SecretEnv are the sandbox's secrets given as env (variable → value),
	// which every process gets under the request's own env. SecretFiles
	// are those given as files (absolute path → value), which the agent
	// writes mode 0400, owned by the default user. Both are the values in
	// clear: never log an Identity.
	SecretEnv   map[string]string `json:"secret_env,omitempty"`
	SecretFiles map[string]string `json:"secret_files,omitempty"`
}

// maxIdentity bounds the body of POST /identity. It carries the sandbox's
// env, which a create may fill up to the API's 1 MiB body, and its
// secrets: up to 64 of up to 64 KiB, which JSON may escape to 6 times that.
const maxIdentity = 32 << 20

func (h *handler) serveIdentity(w http.ResponseWriter, r *http.Request) {
	var id Identity
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxIdentity)).Decode(&id); err != nil || id.SandboxID == "" {
		api.WriteError(w, api.Errorf(api.CodeInvalid, "bad identity: it must be JSON naming the sandbox"))
		return
	}
	if err := writeIdentity(h.identityDir, id); err != nil {
		h.log.Error("writing identity", "err", err)
		api.WriteError(w, err)
		return
	}
	if err := h.apiSocket.set(id, filepath.Join(h.identityDir, APISocketName)); err != nil {
		h.log.Error("serving the in-sandbox API socket", "err", err)
		api.WriteError(w, err)
		return
	}
	if err := h.writeSecretFiles(id.SecretFiles); err != nil {
		h.log.Error("writing secret files", "err", err)
		api.WriteError(w, err)
		return
	}
	if err := h.setHostname(id.SandboxName); err != nil {
		h.log.Error("naming the sandbox", "err", err)
		api.WriteError(w, err)
		return
	}
	h.identity.Store(&id)
	h.services.identified()
	w.WriteHeader(http.StatusNoContent)
}

// writeIdentity writes each file whole (write, then rename), so a program
// reading one never sees half of it.
func writeIdentity(dir string, id Identity) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing identity: %w", err)
	}
	// The token is root's: other users reach the API through the agent's
	// socket, which lets only the sandbox's user through (see APISocketName).
	files := map[string]struct {
		content string
		mode    os.FileMode
	}{
		"api_url":      {id.APIURL + "\n", 0o644},
		"token":        {id.APIToken + "\n", 0o600},
		"sandbox":      {id.SandboxID + "\n", 0o644},
		"sandbox_name": {id.SandboxName + "\n", 0o644},
	}
	// The in-sandbox CLI is the agent's own binary; put it on PATH.
	if _, err := os.Lstat("/usr/local/bin/loam"); os.IsNotExist(err) && dir == IdentityDir {
		_ = os.MkdirAll("/usr/local/bin", 0o755)
		_ = os.Symlink(AgentBinaryPath, "/usr/local/bin/loam")
	}
	for name, f := range files {
		if err := replaceFile(filepath.Join(dir, name), []byte(f.content), f.mode); err != nil {
			return fmt.Errorf("writing identity: %w", err)
		}
	}
	return nil
}

// SetIdentity tells the agent which sandbox it is (POST /identity).
func (c *Client) SetIdentity(ctx context.Context, id Identity) error {
	body, err := json.Marshal(id)
	if err != nil {
		return err
	}
	resp, err := c.do(ctx, http.MethodPost, "/identity", body)
	if err != nil {
		return fmt.Errorf("setting identity at %s: %w", c.BaseURL, err)
	}
	resp.Body.Close()
	return nil
}

// setHostname gives the sandbox its name: in the kernel, in /etc/hostname
// and in /etc/hosts. A fork wakes up with its source's name everywhere (in
// memory, for a memory checkpoint, and on the disk it copied), so each
// connect of the daemon names it again; for a sandbox that keeps its name
// this changes nothing. Only the init of a sandbox names it: an agent run
// elsewhere (in tests) leaves its machine alone.
func (h *handler) setHostname(name string) error {
	if os.Getpid() != 1 || name == "" {
		return nil
	}
	if cur, err := os.Hostname(); err != nil || cur != name {
		err := unix.Sethostname([]byte(name))
		if errors.Is(err, unix.EPERM) {
			// An agent booted by a loam before CAP_SYS_ADMIN was init's
			// (it lives on in old checkpoints): the files name the
			// sandbox, the kernel keeps the old name.
			h.log.Warn("cannot rename the kernel's hostname (an agent of an older loam)", "name", name)
		} else if err != nil {
			return fmt.Errorf("setting the hostname: %w", err)
		}
	}
	b, err := os.ReadFile("/etc/hostname")
	prev := strings.TrimSpace(string(b))
	if err == nil && prev == name {
		return nil
	}
	if err := replaceFile("/etc/hostname", []byte(name+"\n"), 0o644); err != nil {
		return err
	}
	if prev == "" {
		return nil
	}
	hosts, err := os.ReadFile("/etc/hosts")
	if err != nil {
		return nil // no hosts file to mend
	}
	lines := strings.Split(string(hosts), "\n")
	for i, line := range lines {
		fields := strings.Fields(line)
		for j := 1; j < len(fields); j++ { // fields[0] is the address
			if fields[j] == prev {
				fields[j] = name
				lines[i] = strings.Join(fields, "\t")
			}
		}
	}
	return replaceFile("/etc/hosts", []byte(strings.Join(lines, "\n")), 0o644)
}

// replaceFile writes path whole, with mode: a temporary file beside it,
// renamed over it, so a reader never sees half of it.
func replaceFile(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".loam-tmp"
	_ = os.Remove(tmp) // a file left over would keep its mode through WriteFile
	if err := writeNew(tmp, data, mode, -1, -1); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// keepSysAdminToSelf drops CAP_SYS_ADMIN from the bounding set of every
// thread of the agent when it runs as a sandbox's init, so that no process
// it starts, root's included, can ever hold it, while the agent keeps it
// in its own effective set: it needs it for one thing, sethostname, when a
// sandbox from a warm pool takes its name (see setHostname). The bounding
// set is per thread, hence AllThreadsSyscall (a loam built without cgo);
// threads made later copy it. Without the drop, the agent gives the
// capability up altogether, and a rename keeps the kernel's old name.
func keepSysAdminToSelf(log *slog.Logger) {
	if os.Getpid() != 1 {
		return
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0); e != 0 {
		log.Warn("cannot drop CAP_SYS_ADMIN from the bounding set; giving it up", "err", e)
		dropSysAdmin(log)
	}
}

// dropSysAdmin takes CAP_SYS_ADMIN out of every thread's effective and
// permitted sets, for good.
func dropSysAdmin(log *slog.Logger) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		log.Error("reading capabilities", "err", err)
		return
	}
	bit := uint32(1) << (unix.CAP_SYS_ADMIN % 32)
	data[unix.CAP_SYS_ADMIN/32].Effective &^= bit
	data[unix.CAP_SYS_ADMIN/32].Permitted &^= bit
	data[unix.CAP_SYS_ADMIN/32].Inheritable &^= bit
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		log.Error("giving up CAP_SYS_ADMIN", "err", e)
	}
}
