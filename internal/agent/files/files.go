// Package files is the agent's files protocol: stat, read, write, mkdir,
// move and remove, tar archives of a directory and their extraction, and
// file watches, each done with the rights of the user a request names.
package files

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent/account"
	"loam.dev/loam/internal/archive"
)

// The files protocol, between the daemon and the agent. It mirrors the
// API's (see api/files.go), each call naming its user in user= (the
// default user when absent):
//
//	GET    /files?path=P&depth=N          api.FileInfo
//	DELETE /files?path=P&recursive=true   204
//	GET    /files/content?path=P[&offset=O&length=N]
//	                                      the bytes (of that range), with Content-Length
//	PUT    /files/content?path=P&mode=M   api.FileInfo of the file written
//	POST   /files/mkdir                   api.MkdirRequest → api.FileInfo
//	POST   /files/move                    api.MoveRequest → api.FileInfo of To
//	GET    /files/archive?path=DIR        a tar
//	PUT    /files/archive?path=DIR        204
//	GET    /files/watch?path=P&recursive=true WebSocket (see watch.go)
//
// Errors are api.Error bodies; the statuses the protocol defines are 400 (a
// bad path or request), 403 (the user may not), 404 (no such file) and 409
// (exists, not empty, disk full). Anything else is the agent's failure.

// Users is the sandbox's account database as the files server sees it.
type Users interface {
	// Default is the name of the user a request that names none acts as.
	Default() string
	// Lookup finds a user by name, or by uid; an error wrapping
	// account.ErrNoAccount when the sandbox has none such.
	Lookup(name string) (account.Account, error)
}

// Server serves the files protocol: every call is made with the rights of
// the user it names (account.AsUser), and no path it takes from a request
// or finds in a tar is followed through a symlink where that could reach
// what the user may not.
type Server struct {
	log   *slog.Logger
	users Users
}

// New returns the files server, whose requests act as users of users.
func New(log *slog.Logger, users Users) *Server {
	return &Server{log: log, users: users}
}

// fileUser is the account a files request acts as.
func (s *Server) fileUser(name string) (account.Account, error) {
	if err := api.CheckFileUser(name); err != nil {
		return account.Account{}, err
	}
	if name == "" {
		name = s.users.Default()
	}
	a, err := s.users.Lookup(name)
	if errors.Is(err, account.ErrNoAccount) {
		return account.Account{}, api.Errorf(api.CodeInvalid, "user %q does not exist in this sandbox", name)
	}
	return a, err
}

// fileRequest is the path and user of a files request from its query.
func (s *Server) fileRequest(r *http.Request) (string, account.Account, error) {
	q := r.URL.Query()
	p := q.Get("path")
	if err := api.CheckFilePath("path", p); err != nil {
		return "", account.Account{}, err
	}
	a, err := s.fileUser(q.Get("user"))
	return filepath.Clean(p), a, err
}

// fsError turns an error of a file operation on p into what the client
// should see: the user's mistakes by class, anything else as the agent's.
func fsError(p string, err error) error {
	if err == nil {
		return nil
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return err
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s: %w", p, err)
	}
	switch errno {
	case unix.ENOENT:
		return api.Errorf(api.CodeNotFound, "%s: no such file or directory", p)
	case unix.EACCES, unix.EPERM, unix.EROFS:
		return api.Errorf(api.CodeForbidden, "%s: %s", p, errno)
	case unix.ENOSPC, unix.EDQUOT:
		return api.Errorf(api.CodeInsufficientStorage, "%s: %s: the sandbox's disk is full", p, errno)
	case unix.EEXIST, unix.ENOTEMPTY, unix.EBUSY, unix.ETXTBSY:
		return api.Errorf(api.CodeConflict, "%s: %s", p, errno)
	case unix.ENOTDIR, unix.EISDIR, unix.ELOOP, unix.ENAMETOOLONG, unix.EXDEV, unix.EINVAL:
		return api.Errorf(api.CodeInvalid, "%s: %s", p, errno)
	}
	return fmt.Errorf("%s: %w", p, err)
}

// fileInfo describes the file at p as lstat sees it.
func fileInfo(p string, fi fs.FileInfo) api.FileInfo {
	info := api.FileInfo{
		Path:  p,
		Size:  fi.Size(),
		Mode:  fmt.Sprintf("%04o", archive.UnixPerm(fi.Mode())),
		MTime: fi.ModTime().UTC(),
	}
	switch {
	case fi.Mode().IsRegular():
		info.Type = api.FileTypeFile
	case fi.IsDir():
		info.Type = api.FileTypeDir
	case fi.Mode()&fs.ModeSymlink != 0:
		info.Type = api.FileTypeSymlink
		info.Target, _ = os.Readlink(p)
	default:
		info.Type = api.FileTypeOther
	}
	return info
}

// parseMode reads an octal permission mode ("0644"); def when s is empty.
func parseMode(what, s string, def uint32) (uint32, error) {
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, api.Errorf(api.CodeInvalid, "%s: %q is not an octal mode such as 0644", what, s)
	}
	return uint32(m), nil
}

// list describes p and, for a directory, its entries depth levels deep,
// stopping at api.MaxFileEntries entries in all (*budget counts down).
func list(p string, depth int, budget *int) (api.FileInfo, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	info := fileInfo(p, fi)
	if info.Type != api.FileTypeDir || depth <= 0 {
		return info, nil
	}
	des, err := os.ReadDir(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	info.Entries = []api.FileInfo{}
	for _, de := range des {
		if *budget <= 0 {
			info.Truncated = true
			break
		}
		*budget--
		child, err := list(filepath.Join(p, de.Name()), depth-1, budget)
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone since ReadDir
		}
		if err != nil {
			return api.FileInfo{}, err
		}
		info.Truncated = info.Truncated || child.Truncated
		info.Entries = append(info.Entries, child)
	}
	return info, nil
}

func (s *Server) serveStat(w http.ResponseWriter, r *http.Request) {
	p, a, err := s.fileRequest(r)
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	depth := 1
	if d := r.URL.Query().Get("depth"); d != "" {
		depth, err = strconv.Atoi(d)
		if err != nil || depth < 0 || depth > api.MaxFileDepth {
			s.fileError(w, r, p, api.Errorf(api.CodeInvalid, "depth: %q is not a number from 0 to %d", d, api.MaxFileDepth))
			return
		}
	}
	var info api.FileInfo
	err = account.AsUser(a, func() error {
		budget := api.MaxFileEntries
		var err error
		info, err = list(p, depth, &budget)
		return err
	})
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, info)
}

func (s *Server) serveRead(w http.ResponseWriter, r *http.Request) {
	p, a, err := s.fileRequest(r)
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	rng, err := api.ParseReadRange(r.URL.Query())
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	var f *os.File
	err = account.AsUser(a, func() error {
		var err error
		f, err = openRegular(p)
		return err
	})
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	// The size at open: a file that grows meanwhile is sent as it was
	// then, one that shrinks ends the answer short, which the client sees.
	n := rng.Within(fi.Size())
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, io.NewSectionReader(f, rng.Offset, n)); err != nil {
		s.log.Info("files: sending content cut short", "path", p, "err", err)
	}
}

func (s *Server) serveWrite(w http.ResponseWriter, r *http.Request) {
	p, a, err := s.fileRequest(r)
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	if p == "/" {
		s.fileError(w, r, p, api.Errorf(api.CodeInvalid, "/ is a directory"))
		return
	}
	mode, err := parseMode("mode", r.URL.Query().Get("mode"), 0)
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	var info api.FileInfo
	body := &bodyReader{r: r.Body}
	err = account.AsUser(a, func() error {
		var err error
		info, err = writeAtomic(p, body, mode)
		return err
	})
	if err != nil {
		s.bodyError(w, r, p, body, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, info)
}

// bodyDrain bounds how long bodyError reads a refused body after its
// answer. The daemon closes the connection once it has the answer, so the
// drain normally ends in a round trip; the bound is for a daemon that does
// not.
const bodyDrain = 30 * time.Second

// bodyReader is a request body that tells whether the handler began to
// read it.
type bodyReader struct {
	r    io.Reader
	read bool
}

func (b *bodyReader) Read(p []byte) (int, error) {
	b.read = true
	return b.r.Read(p)
}

// bodyError answers err to an upload whose body the handler began to read
// and then gave up on (the disk is full, the tar is bad). It sends the
// answer first and reads the rest of the body after it, until the daemon
// closes the connection or bodyDrain passes. Returning at once would close
// the connection with the body still arriving: the kernel then resets it,
// and the reset can reach the daemon before the answer, which Go's client
// reports as a broken write ("the agent does not answer") instead of the
// answer. A body never read (the request was refused before it) is left
// alone: reading it would ask the daemon to send it (100-continue).
func (s *Server) bodyError(w http.ResponseWriter, r *http.Request, p string, body *bodyReader, err error) {
	rc := http.NewResponseController(w)
	// Without full duplex the server would try to read the rest of the
	// body before the answer's header, and give up and close after 256 KiB.
	drain := body.read && rc.EnableFullDuplex() == nil
	s.fileError(w, r, p, err)
	if !drain || rc.Flush() != nil {
		return
	}
	_ = rc.SetReadDeadline(time.Now().Add(bodyDrain))
	_, _ = io.Copy(io.Discard, r.Body)
}

// openRegular opens p for reading without blocking on a fifo a user of
// the sandbox may have put there (open(2) of a fifo waits for a writer),
// and refuses anything but a regular file.
func openRegular(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, api.Errorf(api.CodeInvalid, "%s is not a regular file", p)
	}
	return f, nil
}

// writeAtomic writes body to p as the calling thread's user: to a temp file
// in p's directory (made with its parents if missing), synced, then renamed
// over p, so that readers see the old file or the whole new one. The
// directory is held open throughout, so the rename lands where the temp
// file is. mode 0 keeps the mode of the file replaced, or 0644.
func writeAtomic(p string, body io.Reader, mode uint32) (api.FileInfo, error) {
	dir, name := filepath.Split(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return api.FileInfo{}, err
	}
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return api.FileInfo{}, err
	}
	defer d.Close()
	dfd := int(d.Fd())
	if mode == 0 {
		mode = 0o644
		var st unix.Stat_t
		if unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			mode = st.Mode & 0o7777
		}
	}
	tmp := fmt.Sprintf(".%s.loam-%d-%d", name, os.Getpid(), time.Now().UnixNano())
	if len(tmp) > 255 {
		tmp = fmt.Sprintf(".loam-%d-%d", os.Getpid(), time.Now().UnixNano())
	}
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return api.FileInfo{}, err
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, tmp))
	done := false
	defer func() {
		if !done {
			f.Close()
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	if _, err := io.Copy(f, body); err != nil {
		return api.FileInfo{}, fmt.Errorf("writing %s: %w", p, bodyError(err))
	}
	// fchmod, not the mode of open: the umask must not change it.
	if err := unix.Fchmod(fd, mode); err != nil {
		return api.FileInfo{}, err
	}
	if err := f.Sync(); err != nil {
		return api.FileInfo{}, err
	}
	if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
		return api.FileInfo{}, err
	}
	done = true
	fi, err := f.Stat()
	f.Close()
	if err != nil {
		return api.FileInfo{}, err
	}
	_ = d.Sync()
	return fileInfo(p, fi), nil
}

// bodyError marks a failure to read the request's body as such: the client
// went away or sent too little, which is not the file system's doing.
func bodyError(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return err
	}
	return api.Errorf(api.CodeInvalid, "reading the body: %s", err)
}

func (s *Server) serveMkdir(w http.ResponseWriter, r *http.Request) {
	var req api.MkdirRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		s.fileError(w, r, "", api.Errorf(api.CodeInvalid, `the body must be {"path":"…"}`))
		return
	}
	if err := api.CheckFilePath("path", req.Path); err != nil {
		s.fileError(w, r, "", err)
		return
	}
	p := filepath.Clean(req.Path)
	mode, err := parseMode("mode", req.Mode, 0o755)
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	a, err := s.fileUser(req.User)
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	var info api.FileInfo
	err = account.AsUser(a, func() error {
		if err := os.MkdirAll(p, fs.FileMode(mode&0o777)); err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		info = fileInfo(p, fi)
		return nil
	})
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, info)
}

func (s *Server) serveMove(w http.ResponseWriter, r *http.Request) {
	var req api.MoveRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		s.fileError(w, r, "", api.Errorf(api.CodeInvalid, `the body must be {"from":"…","to":"…"}`))
		return
	}
	for _, c := range []struct{ what, p string }{{"from", req.From}, {"to", req.To}} {
		if err := api.CheckFilePath(c.what, c.p); err != nil {
			s.fileError(w, r, "", err)
			return
		}
	}
	from, to := filepath.Clean(req.From), filepath.Clean(req.To)
	if from == "/" || to == "/" {
		s.fileError(w, r, from, api.Errorf(api.CodeInvalid, "/ cannot be moved or replaced"))
		return
	}
	a, err := s.fileUser(req.User)
	if err != nil {
		s.fileError(w, r, from, err)
		return
	}
	var info api.FileInfo
	err = account.AsUser(a, func() error {
		if err := os.Rename(from, to); err != nil {
			return err
		}
		fi, err := os.Lstat(to)
		if err != nil {
			return err
		}
		info = fileInfo(to, fi)
		return nil
	})
	if err != nil {
		s.fileError(w, r, from, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, info)
}

func (s *Server) serveRemove(w http.ResponseWriter, r *http.Request) {
	p, a, err := s.fileRequest(r)
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	if p == "/" {
		s.fileError(w, r, p, api.Errorf(api.CodeInvalid, "/ cannot be removed"))
		return
	}
	recursive := r.URL.Query().Get("recursive") == "true"
	err = account.AsUser(a, func() error {
		if _, err := os.Lstat(p); err != nil {
			return err
		}
		if recursive {
			return removeAll(p)
		}
		return os.Remove(p)
	})
	if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
		err = api.Errorf(api.CodeConflict, "%s is a directory that is not empty: remove it with recursive=true", p)
	}
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// removeAll removes p and everything beneath it. p's own directories are
// the caller's path and followed; beneath p no symlink is, whatever the
// kernel does with O_NOFOLLOW|O_DIRECTORY (os.RemoveAll relies on it
// failing, and gVisor follows the link: a user who swaps a directory for a
// symlink mid-removal would have root's removal empty the link's target).
func removeAll(p string) error {
	dir, base := filepath.Split(p)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return archive.RemoveAt(fd, base)
}

// fileError answers a files request with err: an *api.Error of the user's
// making as it is, anything else as the agent's failure, logged.
func (s *Server) fileError(w http.ResponseWriter, r *http.Request, p string, err error) {
	err = fsError(p, err)
	var ae *api.Error
	if !errors.As(err, &ae) {
		s.log.Warn("files: failed", "method", r.Method, "path", r.URL.Path, "file", p, "err", err)
	}
	api.WriteError(w, err)
}

// Routes registers the files protocol on mux.
func (s *Server) Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /files", s.serveStat)
	mux.HandleFunc("DELETE /files", s.serveRemove)
	mux.HandleFunc("GET /files/content", s.serveRead)
	mux.HandleFunc("PUT /files/content", s.serveWrite)
	mux.HandleFunc("POST /files/mkdir", s.serveMkdir)
	mux.HandleFunc("POST /files/move", s.serveMove)
	mux.HandleFunc("GET /files/archive", s.serveArchive)
	mux.HandleFunc("PUT /files/archive", s.serveExtract)
	mux.HandleFunc("GET /files/watch", s.serveWatch)
}
