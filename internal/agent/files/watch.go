package files

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent/account"
)

// maxWatches bounds the directories one recursive watch follows.
const maxWatches = 8192

// watchMask is what a watch asks inotify for.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_DELETE |
	unix.IN_DELETE_SELF | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_MOVE_SELF

// watcher is one watch socket's inotify instance: the watches it holds and
// the paths they stand for.
type watcher struct {
	f         *os.File // the inotify fd, non-blocking, so reads go through Go's poller
	fd        int      // f's fd: f.Fd() would make it blocking
	root      string
	recursive bool
	acct      account.Account

	mu    sync.Mutex
	paths map[int32]string // watch descriptor → path
}

// serveWatch serves one watch socket: inotify events of a path (and, with
// recursive=true, of every directory below it, new ones included) as
// api.WatchEvent text messages. The watches are set up before the upgrade,
// so that a missing path is a plain 404. The socket closes normally when the
// watched path itself goes away.
func (s *Server) serveWatch(w http.ResponseWriter, r *http.Request) {
	p, a, err := s.fileRequest(r)
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	wa, err := newWatcher(p, a, r.URL.Query().Get("recursive") == "true")
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	defer wa.f.Close()
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		s.log.Warn("watch: accepting the websocket", "err", err)
		return
	}
	defer conn.CloseNow()
	// The client sends nothing; CloseRead notices when it goes.
	ctx := conn.CloseRead(r.Context())
	go func() {
		<-ctx.Done()
		wa.f.Close() // ends the read below
	}()
	reason := wa.run(ctx, conn)
	conn.Close(websocket.StatusNormalClosure, reason)
}

// newWatcher sets up the watches of root as a.
func newWatcher(root string, a account.Account, recursive bool) (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wa := &watcher{
		f:         os.NewFile(uintptr(fd), "inotify"),
		fd:        fd,
		root:      root,
		recursive: recursive,
		acct:      a,
		paths:     map[int32]string{},
	}
	err = account.AsUser(a, func() error {
		fi, err := os.Stat(root)
		if err != nil {
			return err
		}
		if err := wa.add(root, 0); err != nil {
			return err
		}
		if recursive && fi.IsDir() {
			return wa.addTree(root)
		}
		return nil
	})
	if err != nil {
		wa.f.Close()
		return nil, err
	}
	return wa, nil
}

// add watches p; call it as the watch's user.
func (wa *watcher) add(p string, flags uint32) error {
	wa.mu.Lock()
	defer wa.mu.Unlock()
	if len(wa.paths) >= maxWatches {
		return api.Errorf(api.CodeInvalid, "%s: more than %d directories to watch; watch a smaller tree", wa.root, maxWatches)
	}
	wd, err := unix.InotifyAddWatch(wa.fd, p, watchMask|flags)
	if err != nil {
		return err
	}
	wa.paths[int32(wd)] = p
	return nil
}

// addTree watches every directory below dir (not dir itself), symlinks not
// followed; call it as the watch's user. Directories that vanish meanwhile
// or that the user may not read are passed over.
func (wa *watcher) addTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil
		}
		if p == dir || !de.IsDir() {
			return nil
		}
		err = wa.add(p, unix.IN_DONT_FOLLOW|unix.IN_ONLYDIR)
		var ae *api.Error
		if errors.As(err, &ae) {
			return err
		}
		return nil
	})
}

// run sends events until the watched path goes (it returns why) or ctx
// or the socket ends.
func (wa *watcher) run(ctx context.Context, conn *websocket.Conn) string {
	buf := make([]byte, 64<<10)
	for {
		n, err := wa.f.Read(buf)
		if err != nil {
			return ""
		}
		events, gone := wa.parse(buf[:n])
		for _, ev := range events {
			b, _ := json.Marshal(ev)
			if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
				return ""
			}
		}
		if gone {
			return "the watched path is gone"
		}
	}
}

// parse turns a read of inotify events into watch events; gone reports
// that no watch is left.
func (wa *watcher) parse(b []byte) (events []api.WatchEvent, gone bool) {
	for len(b) >= unix.SizeofInotifyEvent {
		raw := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := unix.SizeofInotifyEvent + int(raw.Len)
		if end > len(b) {
			break
		}
		name := strings.TrimRight(string(b[unix.SizeofInotifyEvent:end]), "\x00")
		mask, wd := raw.Mask, raw.Wd
		b = b[end:]

		if mask&unix.IN_Q_OVERFLOW != 0 {
			events = append(events, api.WatchEvent{Type: api.WatchOverflow})
			continue
		}
		wa.mu.Lock()
		dir, ok := wa.paths[wd]
		if mask&unix.IN_IGNORED != 0 {
			delete(wa.paths, wd)
			gone = len(wa.paths) == 0
		}
		wa.mu.Unlock()
		if !ok {
			continue
		}
		p := dir
		if name != "" {
			p = filepath.Join(dir, name)
		}
		self := name == ""
		switch {
		case mask&unix.IN_CREATE != 0, mask&unix.IN_MOVED_TO != 0:
			events = append(events, api.WatchEvent{Type: api.WatchCreate, Path: p})
			if wa.recursive && mask&unix.IN_ISDIR != 0 {
				wa.follow(p)
			}
		case mask&unix.IN_MODIFY != 0:
			events = append(events, api.WatchEvent{Type: api.WatchWrite, Path: p})
		case mask&unix.IN_ATTRIB != 0:
			events = append(events, api.WatchEvent{Type: api.WatchChmod, Path: p})
		case mask&unix.IN_DELETE != 0:
			events = append(events, api.WatchEvent{Type: api.WatchRemove, Path: p})
		case mask&unix.IN_MOVED_FROM != 0:
			events = append(events, api.WatchEvent{Type: api.WatchRename, Path: p})
		// A directory's own removal or move is told by its parent's
		// watch, except for the root's, which has no parent watched.
		case self && mask&unix.IN_DELETE_SELF != 0 && dir == wa.root:
			events = append(events, api.WatchEvent{Type: api.WatchRemove, Path: p})
		case self && mask&unix.IN_MOVE_SELF != 0 && dir == wa.root:
			events = append(events, api.WatchEvent{Type: api.WatchRename, Path: p})
		}
	}
	return events, gone
}

// follow watches a directory made (or moved in) below a recursive watch,
// and the directories below it.
func (wa *watcher) follow(dir string) {
	_ = account.AsUser(wa.acct, func() error {
		if err := wa.add(dir, unix.IN_DONT_FOLLOW|unix.IN_ONLYDIR); err != nil {
			return err
		}
		return wa.addTree(dir)
	})
}
