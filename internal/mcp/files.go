package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"time"
	"unicode/utf8"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Encodings of file content in read_file and write_file.
const (
	encodingText   = "utf-8"
	encodingBase64 = "base64"
)

// File is a file of a sandbox as the tools show it.
type File struct {
	Path   string `json:"path"`
	Type   string `json:"type" jsonschema:"file, dir, symlink or other"`
	Size   int64  `json:"size"`
	Mode   string `json:"mode" jsonschema:"permission bits in octal, such as 0644"`
	MTime  string `json:"mtime"`
	Target string `json:"target,omitempty" jsonschema:"a symlink's target"`
}

func fileOf(fi *api.FileInfo) File {
	return File{Path: fi.Path, Type: string(fi.Type), Size: fi.Size, Mode: fi.Mode,
		MTime: fi.MTime.UTC().Format(time.RFC3339), Target: fi.Target}
}

// FileRef is how the file tools name a file.
type FileRef struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name or id"`
	Path    string `json:"path" jsonschema:"an absolute path inside the sandbox"`
	User    string `json:"user,omitempty" jsonschema:"the user to act as: loam when empty, or root, or another user of the image"`
}

func (f FileRef) check() error {
	if err := api.CheckFilePath("path", f.Path); err != nil {
		return err
	}
	return api.CheckFileUser(f.User)
}

func (f FileRef) opts() *client.FileOptions { return &client.FileOptions{User: f.User} }

// ReadFileInput is the input of read_file.
type ReadFileInput struct {
	FileRef
	Offset   int64 `json:"offset,omitempty" jsonschema:"the byte to start reading at"`
	MaxBytes int   `json:"max_bytes,omitempty" jsonschema:"the most bytes to return: 65536 when 0, at most 1048576"`
}

// ReadFileOutput is the output of read_file.
type ReadFileOutput struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding" jsonschema:"utf-8 for text, base64 for content that is not valid UTF-8"`
	Size     int64  `json:"size" jsonschema:"the whole file's size in bytes"`
	Offset   int64  `json:"offset"`
	More     bool   `json:"more,omitempty" jsonschema:"the file goes on after what was returned: read again from offset plus the bytes returned"`
}

// WriteFileInput is the input of write_file.
type WriteFileInput struct {
	FileRef
	Content  string `json:"content" jsonschema:"the file's new content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (the default) or base64, for binary content"`
	Mode     string `json:"mode,omitempty" jsonschema:"permission bits in octal, such as 0755; the replaced file's or 0644 when empty"`
}

// FileOutput is the output of write_file.
type FileOutput struct {
	File       File   `json:"file"`
	Checkpoint string `json:"checkpoint,omitempty" jsonschema:"the checkpoint taken before the write: restore_checkpoint to it to undo the write"`
}

// ListFilesInput is the input of list_files.
type ListFilesInput struct {
	FileRef
	Depth int `json:"depth,omitempty" jsonschema:"how many levels of a directory to list: 1 when 0, at most 16"`
}

// ListFilesOutput is the output of list_files.
type ListFilesOutput struct {
	File      File   `json:"file" jsonschema:"the path itself"`
	Entries   []File `json:"entries" jsonschema:"a directory's entries, depth levels deep: each entry by name, a directory's own entries after it"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"the listing stopped at 10000 entries"`
}

// RemoveFileInput is the input of remove_file.
type RemoveFileInput struct {
	FileRef
	Recursive bool `json:"recursive,omitempty" jsonschema:"remove a directory with all it holds"`
}

// RemoveFileOutput is the output of remove_file.
type RemoveFileOutput struct {
	Removed    string `json:"removed"`
	Checkpoint string `json:"checkpoint,omitempty" jsonschema:"the checkpoint taken before the removal: restore_checkpoint to it to undo it"`
}

func (s *Server) addFileTools() {
	addTool(s, tool{name: "read_file", title: "Read a file", kind: reads,
		desc: "Read a file of a sandbox: text as it is, other content in base64, up to max_bytes from offset."},
		func(ctx context.Context, c *call, in ReadFileInput) (ReadFileOutput, error) {
			if err := in.check(); err != nil {
				return ReadFileOutput{}, err
			}
			limit, err := readLimit(in.MaxBytes)
			if err != nil {
				return ReadFileOutput{}, err
			}
			if in.Offset < 0 {
				return ReadFileOutput{}, invalid("offset %d: a byte offset is 0 or more", in.Offset)
			}
			if err := s.use(ctx, c, in.Sandbox); err != nil {
				return ReadFileOutput{}, err
			}
			c.detail = in.Path
			return s.readFile(ctx, in, limit)
		})

	addTool(s, tool{name: "write_file", title: "Write a file", kind: changes, destructive: true,
		desc: "Write a file of a sandbox, replacing it whole (atomically) and making missing parent directories."},
		func(ctx context.Context, c *call, in WriteFileInput) (FileOutput, error) {
			if err := in.check(); err != nil {
				return FileOutput{}, err
			}
			data, err := decode(in.Content, in.Encoding)
			if err != nil {
				return FileOutput{}, err
			}
			opts := in.opts()
			if in.Mode != "" {
				m, err := strconv.ParseUint(in.Mode, 8, 32)
				if err != nil || m > 0o7777 {
					return FileOutput{}, invalid("mode %q: give permission bits in octal, such as 0644", in.Mode)
				}
				opts.Mode = modeOf(uint32(m))
			}
			if err := s.before(ctx, c, in.Sandbox, in.Path); err != nil {
				return FileOutput{}, err
			}
			fi, err := s.c.WriteFile(ctx, in.Sandbox, in.Path, bytes.NewReader(data), opts)
			if err != nil {
				return FileOutput{}, fmt.Errorf("writing %s in %s: %w", in.Path, in.Sandbox, err)
			}
			return FileOutput{File: fileOf(fi), Checkpoint: c.checkpoint}, nil
		})

	addTool(s, tool{name: "list_files", title: "List files", kind: reads,
		desc: "Describe a file of a sandbox and, for a directory, its entries (depth levels deep)."},
		func(ctx context.Context, c *call, in ListFilesInput) (ListFilesOutput, error) {
			if err := in.check(); err != nil {
				return ListFilesOutput{}, err
			}
			if in.Depth < 0 || in.Depth > api.MaxFileDepth {
				return ListFilesOutput{}, invalid("depth %d: give 1 to %d (or 0 for 1)", in.Depth, api.MaxFileDepth)
			}
			if err := s.use(ctx, c, in.Sandbox); err != nil {
				return ListFilesOutput{}, err
			}
			c.detail = in.Path
			opts := in.opts()
			opts.Depth = in.Depth
			fi, err := s.c.ListFiles(ctx, in.Sandbox, in.Path, opts)
			if err != nil {
				return ListFilesOutput{}, fmt.Errorf("listing %s in %s: %w", in.Path, in.Sandbox, err)
			}
			out := ListFilesOutput{File: fileOf(fi), Entries: []File{}, Truncated: fi.Truncated}
			var walk func([]api.FileInfo)
			walk = func(entries []api.FileInfo) {
				for i := range entries {
					out.Entries = append(out.Entries, fileOf(&entries[i]))
					walk(entries[i].Entries)
				}
			}
			walk(fi.Entries)
			out.File.Path = fi.Path
			return out, nil
		})

	addTool(s, tool{name: "remove_file", title: "Remove a file", kind: changes, destructive: true,
		desc: "Remove a file or an empty directory of a sandbox; with recursive, a directory and all it holds."},
		func(ctx context.Context, c *call, in RemoveFileInput) (RemoveFileOutput, error) {
			if err := in.check(); err != nil {
				return RemoveFileOutput{}, err
			}
			if in.Path == "/" {
				return RemoveFileOutput{}, invalid("path: / is the sandbox's root; it can't be removed")
			}
			if err := s.before(ctx, c, in.Sandbox, in.Path); err != nil {
				return RemoveFileOutput{}, err
			}
			opts := in.opts()
			opts.Recursive = in.Recursive
			if err := s.c.RemoveFile(ctx, in.Sandbox, in.Path, opts); err != nil {
				return RemoveFileOutput{}, fmt.Errorf("removing %s in %s: %w", in.Path, in.Sandbox, err)
			}
			return RemoveFileOutput{Removed: in.Path, Checkpoint: c.checkpoint}, nil
		})
}

// readFile reads up to limit bytes of a file from in.Offset.
func (s *Server) readFile(ctx context.Context, in ReadFileInput, limit int) (ReadFileOutput, error) {
	fail := func(err error) (ReadFileOutput, error) {
		return ReadFileOutput{}, fmt.Errorf("reading %s in %s: %w", in.Path, in.Sandbox, err)
	}
	fi, err := s.c.StatFile(ctx, in.Sandbox, in.Path, in.opts())
	if err != nil {
		return fail(err)
	}
	if fi.Type == api.FileTypeDir {
		return ReadFileOutput{}, invalid("path %s is a directory: list it with list_files", in.Path)
	}
	// One byte more than the limit tells whether the file goes on; the
	// sandbox sends only that part of the file.
	opts := in.opts()
	opts.Offset, opts.Length = in.Offset, int64(limit)+1
	rc, err := s.c.ReadFile(ctx, in.Sandbox, in.Path, opts)
	if err != nil {
		return fail(err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, int64(limit)+1))
	if err != nil {
		return fail(err)
	}
	out := ReadFileOutput{Path: in.Path, Size: fi.Size, Offset: in.Offset, Encoding: encodingText}
	if len(data) > limit {
		data, out.More = data[:limit], true
		// Cut on a rune boundary, so that text stays text; the next read
		// starts where this one ends.
		if cut := runeCut(data); cut > 0 {
			data = data[:cut]
		}
	}
	if utf8.Valid(data) {
		out.Content = string(data)
	} else {
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(data), encodingBase64
	}
	return out, nil
}

// runeCut is the length of data without a rune cut off at its end, or 0
// when data does not end in a cut rune.
func runeCut(data []byte) int {
	for i := len(data) - 1; i >= 0 && i >= len(data)-utf8.UTFMax; i-- {
		if utf8.RuneStart(data[i]) {
			if !utf8.FullRune(data[i:]) {
				return i
			}
			return 0
		}
	}
	return 0
}

// decode turns write_file's content into bytes.
func decode(content, encoding string) ([]byte, error) {
	switch encoding {
	case "", encodingText:
		return []byte(content), nil
	case encodingBase64:
		b, err := base64.StdEncoding.DecodeString(content)
		if err != nil {
			return nil, invalid("content is not valid base64: %s", err.Error())
		}
		return b, nil
	}
	return nil, invalid("encoding %q: give utf-8 or base64", encoding)
}

// modeOf turns octal permission bits, setuid, setgid and sticky included,
// into a file mode.
func modeOf(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}
