// Package netdial makes the dialers of connections between the machines of
// a cluster (a node to its database, a node to another node) that give up
// on a peer gone silent: a host down or a link dropped sends no reset, the
// packets just stop, and the kernel's defaults wait minutes (a connect for
// its SYN retries, about two; data on an open connection for its
// retransmissions, about a quarter of an hour) while the call that needed
// the peer hangs instead of failing.
package netdial

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds on a silent peer.
const (
	// ConnectTimeout bounds a connect.
	ConnectTimeout = 5 * time.Second
	// UserTimeout is TCP_USER_TIMEOUT: how long data sent may stay
	// unacknowledged before the kernel drops the connection.
	UserTimeout = 10 * time.Second
	// KeepAlive probes an idle connection every so often (twice before
	// it gives up), so one whose peer is gone is found before it is used.
	KeepAlive = 5 * time.Second
)

// Dialer is a dialer with those bounds on TCP. A Unix socket is on this
// machine and needs none but the connect's.
func Dialer() *net.Dialer {
	return &net.Dialer{
		Timeout:         ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: KeepAlive, Interval: KeepAlive, Count: 2},
		Control: func(network, _ string, c syscall.RawConn) error {
			if !strings.HasPrefix(network, "tcp") {
				return nil
			}
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(UserTimeout.Milliseconds()))
			})
			return errors.Join(err, serr)
		},
	}
}
