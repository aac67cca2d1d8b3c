package files

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent/account"
	"loam.dev/loam/internal/archive"
)

// serveArchive sends a tar of a directory, walked as the request's user
// without following symlinks (they go into the tar as symlinks). A failure
// once the tar is on its way aborts the connection, so that the client sees
// a broken transfer rather than a short tar that looks whole.
func (s *Server) serveArchive(w http.ResponseWriter, r *http.Request) {
	dir, a, err := s.fileRequest(r)
	if err != nil {
		s.fileError(w, r, dir, err)
		return
	}
	started := false
	err = account.AsUser(a, func() error {
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
		s.fileError(w, r, dir, err)
		return
	}
	if err != nil {
		s.log.Info("files: archive cut short", "path", dir, "err", err)
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
func (s *Server) serveExtract(w http.ResponseWriter, r *http.Request) {
	dir, a, err := s.fileRequest(r)
	if err != nil {
		s.fileError(w, r, dir, err)
		return
	}
	body := &bodyReader{r: r.Body}
	err = account.AsUser(a, func() error {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		return extractTar(r.Context(), dir, body)
	})
	if err != nil {
		s.bodyError(w, r, dir, body, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// extractTar extracts the tar read from body into dir, an existing
// directory (see serveExtract), through the one safe extractor.
func extractTar(ctx context.Context, dir string, body io.Reader) error {
	d, err := archive.OpenDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	err = archive.Extract(ctx, d, body, archive.Options{SetID: true})
	var ee *archive.EntryError
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return bodyError(err) // the client went away mid-upload
	case errors.Is(err, archive.ErrRefused):
		return api.Errorf(api.CodeInvalid, "%s", err)
	case errors.As(err, &ee):
		var errno syscall.Errno
		if errors.As(ee.Err, &errno) {
			return fsError(path.Join(dir, path.Clean("/"+ee.Name)), errno)
		}
		return fsError(dir, bodyError(ee.Err))
	}
	return err
}
