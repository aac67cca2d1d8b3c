package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	// The identity is taken in memory whatever the disk says: the socket's
	// proxy, every process's env and secrets, and the services need no
	// disk. Each file below is written only if it changed (a restart of
	// the daemon changes none), and a full disk (a normal state: quotas
	// make it one) fails none of the other steps: it is answered as
	// insufficient_storage once all are done.
	var full []error
	step := func(what string, err error) bool {
		switch {
		case err == nil:
			return true
		case isNoSpace(err):
			h.log.Warn(what+": the sandbox's disk is full", "err", err)
			full = append(full, err)
			return true
		}
		h.log.Error(what, "err", err)
		api.WriteError(w, err)
		return false
	}
	if !step("writing identity", writeIdentity(h.identityDir, id)) ||
		!step("serving the in-sandbox API socket", h.apiSocket.set(id, filepath.Join(h.identityDir, APISocketName))) ||
		!step("writing secret files", h.writeSecretFiles(id.SecretFiles)) ||
		!step("naming the sandbox", h.setHostname(id.SandboxName)) {
		return
	}
	h.identity.Store(&id)
	h.services.identified()
	if len(full) > 0 {
		api.WriteError(w, api.Errorf(api.CodeInsufficientStorage,
			"the sandbox's disk is full: the identity is taken, but not all of it is on the disk: %s", errors.Join(full...)))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// isNoSpace reports whether err is the sandbox's disk (or its quota) full.
func isNoSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

// writeIdentity writes each file whole (write, then rename), so a program
// reading one never sees half of it, and only if it changed. A file that
// is stale and cannot be replaced for lack of space is removed, so that no
// program reads another sandbox's identity (a fork's disk holds its
// source's); the in-sandbox CLI then goes through the socket.
func writeIdentity(dir string, id Identity) error {
	dfd, err := openDir(dir, true)
	if err != nil {
		return fmt.Errorf("writing identity: %w", err)
	}
	defer unix.Close(dfd)
	// The token is root's: other users reach the API through the agent's
	// socket, which lets only the sandbox's user through (see APISocketName).
	files := []struct {
		name, content string
		mode          uint32
	}{
		{"api_url", id.APIURL + "\n", 0o644},
		{"token", id.APIToken + "\n", 0o600},
		{"sandbox", id.SandboxID + "\n", 0o644},
		{"sandbox_name", id.SandboxName + "\n", 0o644},
	}
	// The in-sandbox CLI is the agent's own binary; put it on PATH.
	if dir == IdentityDir {
		if bfd, err := openDir("/usr/local/bin", true); err == nil {
			_ = unix.Symlinkat(AgentBinaryPath, bfd, "loam") // EEXIST: there already
			unix.Close(bfd)
		}
	}
	var errs []error
	for _, f := range files {
		if err := replaceAt(dfd, f.name, []byte(f.content), f.mode, 0, 0); err != nil {
			if isNoSpace(err) {
				_ = unix.Unlinkat(dfd, f.name, 0)
			}
			errs = append(errs, fmt.Errorf("writing %s: %w", filepath.Join(dir, f.name), err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("writing identity: %w", err)
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
	etc, err := openDir("/etc", false)
	if err != nil {
		return fmt.Errorf("setting the hostname: %w", err)
	}
	defer unix.Close(etc)
	b, err := readAt(etc, "hostname", maxEtcFile)
	prev := strings.TrimSpace(string(b))
	if err == nil && prev == name {
		return nil
	}
	if err := replaceAt(etc, "hostname", []byte(name+"\n"), 0o644, 0, 0); err != nil {
		return fmt.Errorf("writing /etc/hostname: %w", err)
	}
	if prev == "" {
		return nil
	}
	hosts, err := readAt(etc, "hosts", maxEtcFile)
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
	if err := replaceAt(etc, "hosts", []byte(strings.Join(lines, "\n")), 0o644, 0, 0); err != nil {
		return fmt.Errorf("writing /etc/hosts: %w", err)
	}
	return nil
}

// maxEtcFile bounds what setHostname reads of /etc/hostname and /etc/hosts,
// which the sandbox may have made as large as it likes.
const maxEtcFile = 1 << 20

// The identity writer works in directories the sandbox can change under
// it: the sandbox's user may plant a symbolic link wherever it may write (a
// secret file's directory in its home, say), and root's writes must not
// follow one out. So it never resolves a path by name: openDir walks from
// / one component at a time, and the files are then made, read, renamed and
// removed relative to the directory it opened, none of them following a
// link. O_NOFOLLOW|O_DIRECTORY is not enough for the walk: inside gVisor it
// follows a link to a directory (issue 20), so each component is opened
// O_PATH|O_NOFOLLOW, which opens a link as itself, and checked with fstat.
// A link is followed only where no one but root can have put it: in a
// directory of root's that no one else may write (the image's own links,
// such as Debian's /var/run -> /run).

// maxLinks bounds the links one walk follows, as the kernel's 40.
const maxLinks = 40

// openDir opens the directory at path (absolute) for the *at calls,
// following no symbolic link that anyone but root may have made: such a
// link where a directory should be fails it with ENOTDIR. With mk, missing
// directories are made, mode 0755, root's. The caller closes the fd.
func openDir(path string, mk bool) (int, error) {
	if !filepath.IsAbs(path) {
		return -1, fmt.Errorf("opening %s: not an absolute path", path)
	}
	fd, err := openDirFrom(path, filepath.Clean(path), mk, 0)
	if err != nil {
		return -1, fmt.Errorf("opening %s: %w", path, err)
	}
	return fd, nil
}

// openDirFrom is openDir's walk of the clean absolute path p, having
// followed links links already (orig is the path asked for, for errors).
func openDirFrom(orig, p string, mk bool, links int) (int, error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	parts := strings.Split(p, "/")
	for i, c := range parts {
		if c == "" {
			continue
		}
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && mk {
			if err = unix.Mkdirat(fd, c, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat(fd, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			}
		}
		if err != nil {
			unix.Close(fd)
			return -1, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil {
			unix.Close(next)
			unix.Close(fd)
			return -1, err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			unix.Close(fd)
			fd = next
			continue
		case unix.S_IFLNK:
			unix.Close(next)
			var parent unix.Stat_t
			if links >= maxLinks || unix.Fstat(fd, &parent) != nil || st.Uid != 0 || parent.Uid != 0 || parent.Mode&0o022 != 0 {
				unix.Close(fd)
				return -1, fmt.Errorf("%s is a symbolic link not followed: %w", filepath.Join(append([]string{"/"}, parts[:i+1]...)...), unix.ENOTDIR)
			}
			buf := make([]byte, unix.PathMax)
			n, err := unix.Readlinkat(fd, c, buf)
			unix.Close(fd)
			if err != nil {
				return -1, err
			}
			target := string(buf[:n])
			if !filepath.IsAbs(target) {
				target = filepath.Join(append([]string{"/"}, parts[:i]...)...) + "/" + target
			}
			rest := append([]string{filepath.Clean(target)}, parts[i+1:]...)
			return openDirFrom(orig, filepath.Clean(strings.Join(rest, "/")), mk, links+1)
		}
		unix.Close(next)
		unix.Close(fd)
		return -1, fmt.Errorf("%s is not a directory: %w", filepath.Join(append([]string{"/"}, parts[:i+1]...)...), unix.ENOTDIR)
	}
	return fd, nil
}

// readAt reads up to max bytes of the regular file name in the directory
// dir, not following a link.
func readAt(dir int, name string, max int64) ([]byte, error) {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file: %w", name, unix.EINVAL)
	}
	return io.ReadAll(io.LimitReader(f, max))
}

// replaceAt makes the file name in the directory dir hold data, with mode
// and owner uid:gid, unless it holds them already: then it writes nothing,
// so that telling an agent what it knows needs no room on the disk. The
// file is written whole, beside it (made anew, O_EXCL: never through what
// is there), then renamed over it, so a reader never sees half of it.
func replaceAt(dir int, name string, data []byte, mode uint32, uid, gid int) error {
	if holds(dir, name, data, mode, uid, gid) {
		return nil
	}
	tmp := name + ".loam-tmp"
	_ = unix.Unlinkat(dir, tmp, 0) // left by a write cut short
	fd, err := unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(data)
	if err == nil {
		err = f.Chown(uid, gid)
	}
	if err == nil {
		err = unix.Fchmod(fd, mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dir, tmp, dir, name)
	}
	if err != nil {
		_ = unix.Unlinkat(dir, tmp, 0)
	}
	return err
}

// holds reports whether the file name in the directory dir is a regular
// file (not a link) that holds data, with mode and owner uid:gid.
func holds(dir int, name string, data []byte, mode uint32, uid, gid int) bool {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil ||
		st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != mode ||
		int(st.Uid) != uid || int(st.Gid) != gid || st.Size != int64(len(data)) {
		return false
	}
	got, err := readAt(dir, name, int64(len(data))+1)
	return err == nil && bytes.Equal(got, data)
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
