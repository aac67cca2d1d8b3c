package agent

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
)

// serveArchive sends a tar of a directory, walked as the request's user
// without following symlinks (they go into the tar as symlinks). A failure
// once the tar is on its way aborts the connection, so that the client sees
// a broken transfer rather than a short tar that looks whole.
func (h *handler) serveArchive(w http.ResponseWriter, r *http.Request) {
	dir, a, err := h.fileRequest(r)
	if err != nil {
		h.fileError(w, r, dir, err)
		return
	}
	started := false
	err = asUser(a, func() error {
		fi, err := os.Lstat(dir)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return api.Errorf(api.CodeInvalid, "%s is not a directory", dir)
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.WriteHeader(http.StatusOK)
		started = true
		tw := tar.NewWriter(w)
		if err := writeTree(tw, dir); err != nil {
			return err
		}
		return tw.Close()
	})
	if err != nil && !started {
		h.fileError(w, r, dir, err)
		return
	}
	if err != nil {
		h.log.Info("files: archive cut short", "path", dir, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// writeTree writes the tree under dir to tw, names relative to dir.
func writeTree(tw *tar.Writer, dir string) error {
	return filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := de.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // gone since the directory was read
		}
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() && link == "" {
			return nil // devices, sockets, fifos: not files to copy
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if !fi.Mode().IsRegular() {
			return tw.WriteHeader(hdr)
		}
		// Swapped for a fifo or a symlink since the walk saw it: refused.
		f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
			f.Close()
			return fmt.Errorf("%s changed while it was archived", p)
		}
		defer f.Close()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		// The size is the one the header promised: a file that changes
		// meanwhile must not break the tar.
		n, err := io.Copy(tw, io.LimitReader(f, hdr.Size))
		if err == nil && n < hdr.Size {
			_, err = io.CopyN(tw, zeros{}, hdr.Size-n)
		}
		return err
	})
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// serveExtract extracts the tar of the body into a directory (made if
// missing), as the request's user. Each entry is made beneath the directory
// by walking its path one component at a time without following symlinks,
// so that neither a name with ".." nor a symlink (one in the tar, or one
// already in the directory) can put a file outside it: such entries are
// refused, and the extraction stops there.
func (h *handler) serveExtract(w http.ResponseWriter, r *http.Request) {
	dir, a, err := h.fileRequest(r)
	if err != nil {
		h.fileError(w, r, dir, err)
		return
	}
	body := &bodyReader{r: r.Body}
	err = asUser(a, func() error {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		return extractTar(dir, body)
	})
	if err != nil {
		h.bodyError(w, r, dir, body, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// extractTar extracts the tar read from body into dir, an existing
// directory (see serveExtract).
func extractTar(dir string, body io.Reader) error {
	root, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(body)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return api.Errorf(api.CodeInvalid, "reading the tar: %s", err)
		}
		if err := extract(int(root.Fd()), dir, hdr, tr); err != nil {
			return err
		}
	}
}

// extract makes one tar entry beneath the directory open at root (named
// dir, for messages).
func extract(root int, dir string, hdr *tar.Header, body io.Reader) error {
	name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
	if name == "." {
		return nil
	}
	if !filepath.IsLocal(name) {
		return api.Errorf(api.CodeInvalid, "tar entry %q would land outside %s: refused", hdr.Name, dir)
	}
	parent, base, err := openParent(root, name)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return api.Errorf(api.CodeInvalid, "tar entry %q passes through a symlink or a file in %s: refused", hdr.Name, dir)
		}
		return fsError(path.Join(dir, name), err)
	}
	defer unix.Close(parent)
	full := path.Join(dir, name)
	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(parent, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fsError(full, err)
		}
		fd, err := unix.Openat(parent, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return api.Errorf(api.CodeInvalid, "tar entry %q: %s is there and is not a directory", hdr.Name, full)
		}
		defer unix.Close(fd)
		return fsError(full, unix.Fchmod(fd, mode))
	case tar.TypeReg:
		return extractFile(parent, base, full, mode, hdr, body)
	case tar.TypeSymlink:
		if err := unlinkOld(parent, base); err != nil {
			return fsError(full, err)
		}
		// The target is not resolved here, and no later entry goes
		// through it (see openParent): it is only a name.
		return fsError(full, unix.Symlinkat(hdr.Linkname, parent, base))
	default:
		return api.Errorf(api.CodeInvalid, "tar entry %q: entries of type %q (hard links, devices, fifos) are not extracted", hdr.Name, hdr.Typeflag)
	}
}

// extractFile writes a regular file's entry to a temp file beside it and
// renames it into place only once whole: a tar cut short (a client gone
// mid-upload, a full disk) leaves no partial file, and the file it would
// replace stays as it was. A directory at base is left, and the rename
// fails, as tar's write does.
func extractFile(parent int, base, full string, mode uint32, hdr *tar.Header, body io.Reader) error {
	tmp := fmt.Sprintf(".%s.loam-%d-%d", base, os.Getpid(), time.Now().UnixNano())
	if len(tmp) > 255 {
		tmp = fmt.Sprintf(".loam-%d-%d", os.Getpid(), time.Now().UnixNano())
	}
	fd, err := unix.Openat(parent, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fsError(full, err)
	}
	f := os.NewFile(uintptr(fd), full)
	defer f.Close()
	done := false
	defer func() {
		if !done {
			_ = unix.Unlinkat(parent, tmp, 0)
		}
	}()
	if _, err := io.Copy(f, body); err != nil {
		return fsError(full, bodyError(err))
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fsError(full, err)
	}
	ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	_ = unix.UtimesNanoAt(parent, tmp, ts, unix.AT_SYMLINK_NOFOLLOW)
	if err := unix.Renameat(parent, tmp, parent, base); err != nil {
		return fsError(full, err)
	}
	done = true
	return nil
}

// unlinkOld removes a file or symlink at base in parent, as tar does before
// it writes one; a directory there is left, and the write then fails.
func unlinkOld(parent int, base string) error {
	err := unix.Unlinkat(parent, base, 0)
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EPERM) {
		return nil
	}
	return err
}

// openParent opens the directory that holds name (a local, clean,
// slash-separated path) beneath root, one component at a time, making
// missing directories and following no symlink. It returns the directory's
// fd (the caller closes it) and the last component.
func openParent(root int, name string) (int, string, error) {
	parts := strings.Split(name, "/")
	fd, err := unix.Dup(root)
	if err != nil {
		return -1, "", err
	}
	for _, part := range parts[:len(parts)-1] {
		if err := unix.Mkdirat(fd, part, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return -1, "", err
		}
		next, err := unix.Openat(fd, part, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, "", fmt.Errorf("opening %s: %w", part, err)
		}
		fd = next
	}
	return fd, parts[len(parts)-1], nil
}
