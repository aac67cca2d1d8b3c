package cli

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/archive"
	"loam.dev/loam/internal/atomicfile"
)

func printJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// remote is one side of a cp: a path of a sandbox, or a local one when
// sandbox is "".
type remote struct {
	sandbox, path string
}

// parseCpArg reads SANDBOX:PATH or a local path. A local path that holds a
// colon can be given as ./a:b or as an absolute path.
func parseCpArg(s string) remote {
	name, p, ok := strings.Cut(s, ":")
	if !ok || name == "" || strings.ContainsRune(name, '/') || strings.HasPrefix(s, ".") {
		return remote{path: s}
	}
	return remote{sandbox: name, path: p}
}

func (gc *guestCommands) cpCmd() *cobra.Command {
	var (
		user string
		mode string
	)
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories into and out of a sandbox",
		Long: `Copy between the local machine and a sandbox: one of SRC and DST is
SANDBOX:PATH, a path of the sandbox (absolute, resolved inside it), the other
a local path, or - for stdin or stdout.

A file is copied to DST, or into DST when DST is a directory; it is written
atomically, its parents made. A directory is copied as a tar: to DST when
DST does not exist, into DST (as DST/NAME) when it does. Files land in the
sandbox as its user, loam, unless --user names another. Copying out, entries
that would land outside DST are refused.`,
		Example: `  loam cp ./site scratch:/home/loam/site
  loam cp scratch:/home/loam/out.log .
  tar c . | loam cp - scratch:/tmp/upload.tar`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseCpArg(args[0]), parseCpArg(args[1])
			if (src.sandbox == "") == (dst.sandbox == "") {
				return errors.New("one of SRC and DST must be SANDBOX:PATH, and only one")
			}
			m, err := parseMode(mode)
			if err != nil {
				return err
			}
			c, err := gc.connect()
			if err != nil {
				return err
			}
			opts := &client.FileOptions{User: user, Mode: m}
			if dst.sandbox != "" {
				return gc.copyIn(cmd.Context(), c, src.path, dst, opts)
			}
			return gc.copyOut(cmd.Context(), c, src, dst.path, opts)
		},
	}
	userFlag(cmd, &user)
	cmd.Flags().StringVarP(&mode, "mode", "m", "", "permission bits in octal of a file copied in (default: those of the file replaced, or 0644)")
	return cmd
}

// copyIn copies the local src (a file, a directory, or - for stdin) to dst.
func (gc *guestCommands) copyIn(ctx context.Context, c *client.Client, src string, dst remote, opts *client.FileOptions) error {
	target, err := c.StatFile(ctx, dst.sandbox, dst.path, opts)
	var ae *api.Error
	switch {
	case err != nil && !(errors.As(err, &ae) && ae.Code == api.CodeNotFound):
		return err
	case err != nil:
		target = nil
	}
	if src == "-" {
		if target != nil && target.Type == api.FileTypeDir {
			return fmt.Errorf("%s:%s is a directory: name the file to write stdin to", dst.sandbox, dst.path)
		}
		p := gc.startProgress(copyDesc(dst), -1, true)
		defer p.end()
		_, err := c.WriteFile(ctx, dst.sandbox, dst.path, io.TeeReader(gc.stdin, p), opts)
		return err
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	into := target != nil && target.Type == api.FileTypeDir
	p := dst.path
	if into {
		p = path.Join(dst.path, filepath.Base(src))
	}
	if !fi.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		bar := gc.startProgress(copyDesc(dst), fi.Size(), true)
		defer bar.end()
		_, err = c.WriteFile(ctx, dst.sandbox, p, statReader{io.TeeReader(f, bar), f}, opts)
		return err
	}
	// The tar's size, known beforehand only on a terminal that shows it.
	size := int64(-1)
	if gc.progressOut() != nil {
		size = tarSize(src)
	}
	bar := gc.startProgress(copyDesc(dst), size, true)
	defer bar.end()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeLocalTar(pw, src)) }()
	err = c.WriteArchive(ctx, dst.sandbox, p, io.TeeReader(pr, bar), opts)
	pr.CloseWithError(errors.New("the upload ended"))
	return err
}

// statReader reads through a progress's counter and has its file's Stat,
// by which the client sends the file's length.
type statReader struct {
	io.Reader
	f *os.File
}

func (s statReader) Stat() (fs.FileInfo, error) { return s.f.Stat() }

// copyDesc is what a progress bar of a copy to or from r says.
func copyDesc(r remote) string {
	if r.sandbox == "" {
		return "copying to " + r.path
	}
	return "copying to " + r.sandbox + ":" + r.path
}

// tarSize is about the size of writeLocalTar's tar of dir: a 512-byte
// header per entry, each file's data rounded up to 512 bytes, and the two
// blocks that end it (long names add a header more, uncounted). It is -1
// when dir cannot be walked; the copy then says what went wrong.
func tarSize(dir string) int64 {
	size := int64(1024)
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		size += 512
		if de.Type().IsRegular() {
			fi, err := de.Info()
			if err != nil {
				return err
			}
			size += (fi.Size() + 511) / 512 * 512
		}
		return nil
	})
	if err != nil {
		return -1
	}
	return size
}

// writeLocalTar writes a tar of the local directory dir, symlinks as
// symlinks; devices, sockets and fifos are left out.
func writeLocalTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := de.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case !fi.Mode().IsRegular() && !fi.IsDir():
			return nil
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, io.LimitReader(f, hdr.Size))
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// copyOut copies src (a file or directory of a sandbox) to the local dst,
// or a file to stdout for -.
func (gc *guestCommands) copyOut(ctx context.Context, c *client.Client, src remote, dst string, opts *client.FileOptions) error {
	info, err := c.StatFile(ctx, src.sandbox, src.path, opts)
	if err != nil {
		return err
	}
	if dst == "-" {
		if info.Type == api.FileTypeDir {
			return fmt.Errorf("%s:%s is a directory: copy it to a local directory", src.sandbox, src.path)
		}
		r, err := c.ReadFile(ctx, src.sandbox, src.path, opts)
		if err != nil {
			return err
		}
		defer r.Close()
		// stdout holds the data, so it is no terminal and no bar is drawn.
		_, err = io.Copy(gc.stdout, r)
		return err
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, path.Base(info.Path))
	}
	if info.Type != api.FileTypeDir {
		r, err := c.ReadFile(ctx, src.sandbox, src.path, opts)
		if err != nil {
			return err
		}
		defer r.Close()
		bar := gc.startProgress(copyDesc(remote{path: dst}), info.Size, true)
		defer bar.end()
		// Whole or not at all, so that a cut transfer leaves no half file;
		// not fsynced, as cp does not.
		return atomicfile.Replace(dst, io.TeeReader(r, bar), 0o644)
	}
	r, err := c.ReadArchive(ctx, src.sandbox, src.path, opts)
	if err != nil {
		return err
	}
	defer r.Close()
	bar := gc.startProgress(copyDesc(remote{path: dst}), -1, true)
	defer bar.end()
	return extractLocal(io.TeeReader(r, bar), dst)
}

// extractLocal extracts a tar that came from a sandbox into the local
// directory dir (made if missing). The tar is the sandbox's word: it goes
// through the one safe extractor, which refuses names and symlinks that
// lead outside dir, makes only files, directories and symlinks, keeps no
// set-id bit, and refuses a file that would not fit in the space left.
func extractLocal(r io.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	d, err := archive.OpenDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	// The sandbox's tar may not fill the local disk: a sparse file in it
	// reads back as its whole length of zeros, whatever the tar's size.
	free, err := d.FreeBytes()
	if err != nil {
		return err
	}
	if err := archive.Extract(context.Background(), d, r, archive.Options{MaxBytes: max(free, 1)}); err != nil {
		return fmt.Errorf("extracting into %s: %w", dir, err)
	}
	return nil
}
