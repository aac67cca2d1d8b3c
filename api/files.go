package api

import (
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The files API: /v1/sandboxes/{sandbox}/files…. Every path is a path of the
// sandbox, resolved by the sandbox's own kernel (its agent does the work), so
// no path, symlink or ".." can reach the host. Each call acts as a user of
// the sandbox: "loam" unless the call names another (user=root), so files
// are created owned by that user and only what that user may touch is
// touched.
//
//	GET    …/files?path=P[&depth=N]        FileInfo of P; a directory's entries N levels deep (1 by default)
//	DELETE …/files?path=P[&recursive=true] remove P (a non-empty directory only with recursive)
//	GET    …/files/content?path=P          the bytes of file P
//	PUT    …/files/content?path=P[&mode=0644] write the body to P atomically (temp file + rename), making parents
//	POST   …/files/mkdir                   MkdirRequest: make a directory and its parents
//	POST   …/files/move                    MoveRequest: rename within the sandbox
//	GET    …/files/archive?path=DIR        a tar of DIR
//	PUT    …/files/archive?path=DIR        extract the tar of the body into DIR; entries that would land outside DIR are refused
//	GET    …/files/watch?path=P[&recursive=true] WebSocket of WatchEvent text messages
//
// A memory checkpoint or a restore of the sandbox closes every watch socket
// with status 1011 and cuts every transfer in flight (a download ends short
// of its Content-Length).

// MaxFilePath is the longest path the files API takes, in bytes (PATH_MAX).
const MaxFilePath = 4096

// MaxFileDepth is the deepest listing GET …/files gives.
const MaxFileDepth = 16

// MaxFileEntries bounds the entries of one listing, all levels together;
// a listing cut there says Truncated.
const MaxFileEntries = 10000

// FileType is the type of a file in a FileInfo.
type FileType string

// File types. A file that is none of the first three (a device, a socket, a
// fifo) is "other".
const (
	FileTypeFile    FileType = "file"
	FileTypeDir     FileType = "dir"
	FileTypeSymlink FileType = "symlink"
	FileTypeOther   FileType = "other"
)

// FileInfo describes a file of a sandbox, as lstat sees it (a symlink is
// itself, not its target).
type FileInfo struct {
	Path string   `json:"path"`
	Type FileType `json:"type"`
	Size int64    `json:"size"`
	// Mode is the permission bits in octal, "0644"; setuid, setgid and
	// sticky bits included ("4755").
	Mode  string    `json:"mode"`
	MTime time.Time `json:"mtime"`
	// Target is a symlink's target, as it is written (not resolved).
	Target string `json:"target,omitempty"`
	// Entries are a directory's entries, sorted by name, when listed.
	Entries []FileInfo `json:"entries,omitempty"`
	// Truncated says the listing stopped at MaxFileEntries.
	Truncated bool `json:"truncated,omitempty"`
}

// MkdirRequest is the body of POST …/files/mkdir. Missing parents are made
// too, and a directory that exists already is no error (as mkdir -p).
type MkdirRequest struct {
	Path string `json:"path"`
	// Mode is the new directories' permission bits in octal; "0755" when empty.
	Mode string `json:"mode,omitempty"`
	// User is who makes them: "loam" when empty, or "root", or another user.
	User string `json:"user,omitempty"`
}

// MoveRequest is the body of POST …/files/move: rename From to To, replacing
// a file at To, within one filesystem of the sandbox.
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	// User is who moves: "loam" when empty, or "root", or another user.
	User string `json:"user,omitempty"`
}

// WatchEvent is one text message of a watch socket.
type WatchEvent struct {
	// Type is "create", "write", "remove", "rename" (Path was moved away;
	// its new name, if watched, comes as a "create"), "chmod" (metadata
	// changed), or "overflow" (the sandbox's kernel dropped events: rescan).
	Type string `json:"type"`
	// Path is the file the event is about; empty for "overflow".
	Path string `json:"path,omitempty"`
}

// Watch event types.
const (
	WatchCreate   = "create"
	WatchWrite    = "write"
	WatchRemove   = "remove"
	WatchRename   = "rename"
	WatchChmod    = "chmod"
	WatchOverflow = "overflow"
)

// CheckFilePath checks the shape of a path given to the files API as what
// (a query parameter or field name): absolute, no NUL byte, at most
// MaxFilePath bytes. It says nothing of whether the path exists.
func CheckFilePath(what, p string) error {
	switch {
	case p == "":
		return Errorf(CodeInvalid, "%s: give a path", what)
	case len(p) > MaxFilePath:
		return Errorf(CodeInvalid, "%s: the path is %d bytes long; at most %d", what, len(p), MaxFilePath)
	case strings.ContainsRune(p, 0):
		return Errorf(CodeInvalid, "%s: the path holds a NUL byte", what)
	case !strings.HasPrefix(p, "/"):
		return Errorf(CodeInvalid, "%s: %q is not an absolute path (it must start with /)", what, p)
	}
	return nil
}

// MaxUserName bounds the user name a files call may give.
const MaxUserName = 256

// CheckFileUser checks the shape of the user a files call acts as; "" is the
// default user.
func CheckFileUser(u string) error {
	if len(u) > MaxUserName || strings.ContainsAny(u, "\x00:\n") {
		return Errorf(CodeInvalid, "user: %q is not a user name", u)
	}
	return nil
}

// ReadRange is the part of a file a download asks for: Length bytes from
// Offset, or all from Offset when Length is -1. A range past the end of
// the file gives what there is of it, maybe nothing, as read(2) does.
type ReadRange struct {
	Offset int64
	Length int64
}

// ParseReadRange reads the query parameters offset and length of a
// download (both optional, bytes, 0 or more), with a message that says
// what is wrong.
func ParseReadRange(q url.Values) (ReadRange, error) {
	r := ReadRange{Length: -1}
	for _, p := range []struct {
		name string
		to   *int64
	}{{"offset", &r.Offset}, {"length", &r.Length}} {
		v := q.Get(p.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return ReadRange{Length: -1}, Errorf(CodeInvalid, "%s: %q is not a byte count (a whole number, 0 or more)", p.name, v)
		}
		*p.to = n
	}
	return r, nil
}

// Values adds r to q as ParseReadRange reads it, leaving out what is the
// default.
func (r ReadRange) Values(q url.Values) {
	if r.Offset > 0 {
		q.Set("offset", strconv.FormatInt(r.Offset, 10))
	}
	if r.Length >= 0 {
		q.Set("length", strconv.FormatInt(r.Length, 10))
	}
}

// Within is how many bytes of a file of size bytes r covers.
func (r ReadRange) Within(size int64) int64 {
	if r.Offset >= size {
		return 0
	}
	n := size - r.Offset
	if r.Length >= 0 && r.Length < n {
		n = r.Length
	}
	return n
}
