// Package conns bounds the connections of the daemon's listener, which
// anyone who can reach the API port (or a public sandbox URL: the URL front
// door shares it) may open without a token. Three rules keep a flood of
// connections from using up the daemon's file descriptors, while /healthz
// and authenticated calls keep answering:
//
//   - at most Max connections are open in all, and at most PerClient from
//     one client address (an IPv6 client is its /64);
//   - a new connection over a cap takes the place of the connection idle
//     longest (of that client, for its own cap): one on which no request is
//     being served, whether it never sent one, sends its header slowly, or
//     waits to be used again. Only when every connection is busy is the
//     new one closed at once. nginx reclaims idle keep-alive connections
//     the same way when it runs out;
//   - an answer to a request that was not authenticated closes its
//     connection (Connection: close), so only clients with a token, or of a
//     sandbox's URL they may use, keep connections alive between requests.
//
// Timeouts (idle, header, body) are the http.Server's; see the daemon.
package conns

import (
	"container/list"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Limiter tracks the connections of one listener. Listener, ConnContext
// and Handler must all be given to the same http.Server.
type Limiter struct {
	max, perClient int
	log            *slog.Logger

	mu      sync.Mutex
	open    int
	clients map[netip.Prefix]int
	// idle holds the open connections that serve no request, the one
	// idle longest first.
	idle list.List
	// reclaimed and refused count what the caps did since the last log.
	reclaimed, refused int
	logged             time.Time
}

// New makes a limiter of at most maxConns connections in all and perClient from
// one client address (both at least 1).
func New(maxConns, perClient int, log *slog.Logger) *Limiter {
	return &Limiter{max: max(1, maxConns), perClient: max(1, perClient), log: log, clients: map[netip.Prefix]int{}}
}

// Open is how many connections are open now.
func (l *Limiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Listener wraps ln: each connection it accepts counts against the caps.
func (l *Limiter) Listener(ln net.Listener) net.Listener { return &listener{Listener: ln, l: l} }

type listener struct {
	net.Listener
	l *Limiter
}

func (ln *listener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if t := ln.l.admit(c); t != nil {
			return t, nil
		}
		// Over a cap with nothing idle to reclaim: closed at once, so
		// that it holds nothing and the next one is looked at.
		c.Close()
	}
}

// conn is a connection the limiter counts.
type conn struct {
	net.Conn
	l      *Limiter
	client netip.Prefix
	// Guarded by l.mu: busy is how many requests are being served on it
	// (HTTP/2 serves several at once); elem is its place in l.idle while
	// busy is 0; closed is set once it no longer counts.
	busy   int
	elem   *list.Element
	closed bool
}

func (c *conn) Close() error {
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// clientOf is the address a connection counts against: its peer's, or
// its /64 for IPv6, where one client commonly holds a whole /64.
func clientOf(c net.Conn) netip.Prefix {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return netip.Prefix{}
	}
	a := ap.Addr().Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p
	}
	return netip.PrefixFrom(a, 32)
}

// admit counts c, closing idle connections to make room for it; nil when
// there is no room.
func (l *Limiter) admit(c net.Conn) *conn {
	client := clientOf(c)
	var victims []*conn
	l.mu.Lock()
	if l.clients[client] >= l.perClient {
		v := l.oldestIdleLocked(func(v *conn) bool { return v.client == client })
		if v == nil {
			return l.refuseLocked()
		}
		l.releaseLocked(v)
		victims = append(victims, v)
	}
	if l.open >= l.max {
		v := l.oldestIdleLocked(func(*conn) bool { return true })
		if v == nil {
			return l.refuseLocked()
		}
		l.releaseLocked(v)
		victims = append(victims, v)
	}
	t := &conn{Conn: c, l: l, client: client}
	l.open++
	l.clients[client]++
	t.elem = l.idle.PushBack(t)
	l.reclaimed += len(victims)
	l.reportLocked()
	l.mu.Unlock()
	for _, v := range victims {
		v.Conn.Close()
	}
	return t
}

// refuseLocked counts a refused connection and unlocks l.mu.
func (l *Limiter) refuseLocked() *conn {
	l.refused++
	l.reportLocked()
	l.mu.Unlock()
	return nil
}

// reportLocked logs what the caps did, at most once a minute: a flood
// must not flood the log too.
func (l *Limiter) reportLocked() {
	if l.reclaimed+l.refused == 0 || time.Since(l.logged) < time.Minute {
		return
	}
	l.log.Warn("connections over the caps: idle ones closed to make room, or new ones refused while all were busy",
		"reclaimed", l.reclaimed, "refused", l.refused, "open", l.open, "max", l.max, "per_client", l.perClient)
	l.reclaimed, l.refused, l.logged = 0, 0, time.Now()
}

// oldestIdleLocked is the connection idle longest that match accepts.
func (l *Limiter) oldestIdleLocked(match func(*conn) bool) *conn {
	for e := l.idle.Front(); e != nil; e = e.Next() {
		if c := e.Value.(*conn); match(c) {
			return c
		}
	}
	return nil
}

// releaseLocked stops counting c, once.
func (l *Limiter) releaseLocked(c *conn) {
	if c.closed {
		return
	}
	c.closed = true
	l.open--
	if l.clients[c.client]--; l.clients[c.client] <= 0 {
		delete(l.clients, c.client)
	}
	if c.elem != nil {
		l.idle.Remove(c.elem)
		c.elem = nil
	}
}

type ctxKey struct{}

// ConnContext is the http.Server's ConnContext: it lets Handler find the
// connection a request came on.
func (l *Limiter) ConnContext(ctx context.Context, c net.Conn) context.Context {
	// A TLS connection wraps the one the listener counted.
	for {
		if t, ok := c.(*conn); ok {
			return context.WithValue(ctx, ctxKey{}, t)
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return ctx
		}
		c = u.NetConn()
	}
}

// Handler wraps the server's handler: while a request is served its
// connection is busy, never reclaimed; and its answer closes the
// connection unless KeepAlive says the request was authenticated.
func (l *Limiter) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(ctxKey{}).(*conn); ok {
			l.begin(c)
			defer l.end(c)
		}
		w.Header().Set("Connection", "close")
		h.ServeHTTP(w, r)
	})
}

func (l *Limiter) begin(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.elem != nil {
		l.idle.Remove(c.elem)
		c.elem = nil
	}
	c.busy++
}

func (l *Limiter) end(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.busy--; c.busy == 0 && !c.closed {
		c.elem = l.idle.PushBack(c)
	}
}

// KeepAlive lets the connection of the request w answers outlive the
// answer: the request was authenticated (a token, a browser session, or a
// sandbox URL's access). Call it before the answer's header is written.
// Without Handler it does nothing.
func KeepAlive(w http.ResponseWriter) {
	if w.Header().Get("Connection") == "close" {
		w.Header().Del("Connection")
	}
}
