// Package ports is the agent's view of the sandbox's TCP ports: which are
// listening (read from /proc/net/tcp, as gVisor writes it), a watch of
// their changes, and a WebSocket that carries one TCP connection to one.
package ports

import (
	"bufio"
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// The sandbox's TCP sockets, as the kernel (gVisor's netstack) lists them.
// gVisor writes them in Linux's format.
var procNetTCP = [...]string{"/proc/net/tcp", "/proc/net/tcp6"}

const (
	// PollInterval is how often a port watch looks at the sandbox's
	// listening sockets. The kernel tells no one when a socket starts
	// listening, so the watch compares what it sees now with what it saw.
	PollInterval = 250 * time.Millisecond
	// portDialTimeout bounds connecting to a port inside the sandbox: a
	// listening socket on the sandbox's own stack answers at once, unless
	// its backlog is full.
	portDialTimeout = 5 * time.Second
	// tcpListen is the state of a listening socket in /proc/net/tcp.
	tcpListen = "0A"
	// maxSockets bounds how many lines of /proc/net/tcp are read: a program
	// with a million connections must not make every listing a big job.
	maxSockets = 1 << 16
)

// Server serves the ports protocol (GET /ports, /ports/watch and
// /ports/{port}/stream).
type Server struct {
	log *slog.Logger
	// own is the agent's port, which no port call lists or reaches.
	own int
	// files lists the files listening sockets are read from; tests use
	// others.
	files []string
}

// New returns the ports server of an agent listening on port own.
func New(log *slog.Logger, own int) *Server {
	return &Server{log: log, own: own, files: procNetTCP[:]}
}

// Routes registers the ports protocol on mux.
func (s *Server) Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /ports", s.servePorts)
	mux.HandleFunc("GET /ports/watch", s.servePortWatch)
	mux.HandleFunc("GET /ports/{port}/stream", s.servePortStream)
}

// listener is one listening TCP socket.
type listener struct {
	addr netip.Addr
	port int
}

// listeners reads the sandbox's listening TCP sockets from files (the
// procNetTCP format); a file that does not exist (no IPv6) has none.
func listeners(files []string) ([]listener, error) {
	var all []listener
	for _, f := range files {
		fh, err := os.Open(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing listening sockets: %w", err)
		}
		ls, err := parseProcNetTCP(fh)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", f, err)
		}
		all = append(all, ls...)
	}
	return all, nil
}

// parseProcNetTCP reads the listening sockets of one /proc/net/tcp{,6}
// file: a header line, then one line per socket whose second field is
// ADDR:PORT in hex and fourth the state.
func parseProcNetTCP(r io.Reader) ([]listener, error) {
	var ls []listener
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for n := 0; sc.Scan(); n++ {
		if n == 0 || n > maxSockets {
			continue // the header, or more than we look at
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[3] != tcpListen {
			continue
		}
		l, err := parseSocketAddr(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n+1, err)
		}
		ls = append(ls, l)
	}
	return ls, sc.Err()
}

// parseSocketAddr parses ADDR:PORT as /proc/net/tcp writes it: the port in
// hex, the address as 32-bit words in hex, each word in the machine's byte
// order (little-endian on every platform loam runs on).
func parseSocketAddr(s string) (listener, error) {
	a, p, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	if !ok || err != nil {
		return listener{}, fmt.Errorf("bad socket address %q", s)
	}
	b, err := hex.DecodeString(a)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return listener{}, fmt.Errorf("bad socket address %q", s)
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	addr, _ := netip.AddrFromSlice(b)
	return listener{addr: addr.Unmap(), port: int(port)}, nil
}

// ports groups listeners by port, leaving out the agent's own port. The
// result is sorted by port, with each port's addresses sorted.
func ports(ls []listener, own int) []api.Port {
	by := map[int]*api.Port{}
	for _, l := range ls {
		if l.port == own || l.port == 0 {
			continue
		}
		p := by[l.port]
		if p == nil {
			p = &api.Port{Port: l.port, Loopback: true}
			by[l.port] = p
		}
		if a := l.addr.String(); !slices.Contains(p.Addresses, a) {
			p.Addresses = append(p.Addresses, a)
		}
		p.Loopback = p.Loopback && l.addr.IsLoopback()
	}
	out := make([]api.Port, 0, len(by))
	for _, p := range by {
		slices.Sort(p.Addresses)
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b api.Port) int { return cmp.Compare(a.Port, b.Port) })
	return out
}

// listPorts is the sandbox's listening TCP ports but the agent's own.
func (s *Server) listPorts() ([]api.Port, error) {
	ls, err := listeners(s.files)
	if err != nil {
		return nil, err
	}
	return ports(ls, s.own), nil
}

func (s *Server) servePorts(w http.ResponseWriter, r *http.Request) {
	ps, err := s.listPorts()
	if err != nil {
		s.log.Warn("listing ports", "err", err)
		api.WriteError(w, api.Errorf(api.CodeInternal, "listing ports: %s", err))
		return
	}
	api.WriteJSON(w, http.StatusOK, api.PortList{Ports: ps})
}

// servePortWatch sends a PortEvent for every port that opens or closes,
// beginning with an "open" for every port open now, until the socket ends.
func (s *Server) servePortWatch(w http.ResponseWriter, r *http.Request) {
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		s.log.Warn("port watch: accepting the websocket", "err", err)
		return
	}
	defer conn.CloseNow()
	// The daemon sends nothing; CloseRead answers its close.
	ctx := conn.CloseRead(r.Context())
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	open := map[int]bool{}
	for {
		ps, err := s.listPorts()
		if err != nil {
			s.log.Warn("port watch", "err", err)
			conn.Close(websocket.StatusInternalError, "listing ports failed")
			return
		}
		now := make(map[int]bool, len(ps))
		var evs []api.PortEvent
		for _, p := range ps {
			now[p.Port] = true
			if !open[p.Port] {
				evs = append(evs, api.PortEvent{Type: api.PortOpen, Port: p.Port})
			}
		}
		for p := range open {
			if !now[p] {
				evs = append(evs, api.PortEvent{Type: api.PortClose, Port: p})
			}
		}
		slices.SortFunc(evs, func(a, b api.PortEvent) int { return cmp.Compare(a.Port, b.Port) })
		for _, ev := range evs {
			b, _ := json.Marshal(ev)
			if conn.Write(ctx, websocket.MessageText, b) != nil {
				return
			}
		}
		open = now
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// servePortStream connects to a port inside the sandbox and carries the
// connection over a WebSocket, as binary messages both ways. Refusals come
// before the upgrade, as HTTP errors: 400 for a bad port, 403 for the
// agent's own, 404 when nothing listens on it, 503 when it does not accept.
func (s *Server) servePortStream(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > api.MaxPort {
		api.WriteError(w, api.Errorf(api.CodeInvalid, "port %q: give a TCP port, 1 to %d", r.PathValue("port"), api.MaxPort))
		return
	}
	if port == s.own {
		api.WriteError(w, api.Errorf(api.CodeForbidden, "port %d is the agent's own", port))
		return
	}
	tcp, err := s.dialPort(r.Context(), port)
	if err != nil {
		var ae *api.Error
		if !errors.As(err, &ae) {
			s.log.Warn("port stream", "err", err)
			ae = api.Errorf(api.CodeInternal, "listing ports: %s", err)
		}
		api.WriteError(w, ae)
		return
	}
	defer tcp.Close()

	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		s.log.Warn("port stream: accepting the websocket", "err", err)
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(api.MaxExecMessage) // as the agent's other sockets
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	carry(ctx, conn, tcp)
}

// dialPort connects to port inside the sandbox. Most programs listen on
// every address or on loopback, so it tries 127.0.0.1 first; only when that
// is refused does it look for the addresses the port listens on, which
// costs a read of every socket of the sandbox.
func (s *Server) dialPort(ctx context.Context, port int) (net.Conn, error) {
	d := net.Dialer{Timeout: portDialTimeout}
	loopback := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(port)).String()
	if c, err := d.DialContext(ctx, "tcp", loopback); err == nil {
		return c, nil
	}
	ls, err := listeners(s.files)
	if err != nil {
		return nil, err
	}
	targets := dialTargets(ls, port)
	if len(targets) == 0 {
		return nil, api.Errorf(api.CodeNotFound, "nothing listens on port %d", port)
	}
	c, err := dialFirst(ctx, targets)
	if err != nil {
		return nil, api.Errorf(api.CodeUnavailable, "connecting to port %d: %s", port, err)
	}
	return c, nil
}

// dialTargets are the addresses to reach a port at, from inside the
// sandbox: loopback for a socket on every address, else the socket's own.
func dialTargets(ls []listener, port int) []string {
	var out []string
	for _, l := range ls {
		if l.port != port {
			continue
		}
		a := l.addr
		switch {
		case a.Is4() && a.IsUnspecified():
			a = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		case a.IsUnspecified():
			a = netip.IPv6Loopback()
		}
		t := netip.AddrPortFrom(a, uint16(port)).String()
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// dialFirst connects to the first of addrs that accepts.
func dialFirst(ctx context.Context, addrs []string) (net.Conn, error) {
	d := net.Dialer{Timeout: portDialTimeout}
	var errs []error
	for _, a := range addrs {
		c, err := d.DialContext(ctx, "tcp", a)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// carry copies bytes between a TCP connection and a WebSocket until either
// ends: the connection's EOF closes the socket with status 1000, the
// socket's end (however it ends) closes the connection.
func carry(ctx context.Context, conn *websocket.Conn, tcp net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer tcp.Close()
		// Each message is copied through one buffer: reading whole
		// messages would allocate each, growing it a few times.
		buf := make([]byte, api.MaxPortMessage)
		to := struct{ io.Writer }{tcp} // not TCPConn's ReadFrom, whose buffer is small
		for {
			typ, r, err := conn.Reader(ctx)
			if err != nil {
				return
			}
			w := io.Writer(to)
			if typ != websocket.MessageBinary {
				w = io.Discard // a port stream carries bytes only
			}
			if _, err := io.CopyBuffer(w, r, buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, api.MaxPortMessage)
	for {
		n, err := tcp.Read(buf)
		if n > 0 {
			if conn.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
				break
			}
		}
		if err != nil {
			// EOF from the program, or the reader above closed the
			// connection because the socket ended.
			conn.Close(websocket.StatusNormalClosure, "")
			break
		}
	}
	tcp.Close()
	conn.CloseNow()
	<-done
}
