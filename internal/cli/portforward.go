package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

func (gc *guestCommands) portForwardCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "port-forward SANDBOX [LOCAL:]REMOTE",
		Short: "Forward a local port to a port inside a sandbox",
		Long: `Listen on 127.0.0.1:LOCAL (LOCAL is REMOTE when left out; 0 picks a free
port) and carry each connection to TCP port REMOTE inside SANDBOX, until
interrupted. The connection is made inside the sandbox, so a program that
listens only on loopback is reachable too. A memory checkpoint or a
restore of the sandbox ends the connections open then; new ones work
again once it is running.`,
		Example: `  loam port-forward scratch 8080
  loam port-forward scratch 9000:8080`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb := args[0]
			local, remote, err := parsePortSpec(args[1])
			if err != nil {
				return err
			}
			c, err := gc.connect()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			ps, err := c.ListPorts(ctx, sb)
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(ps, func(p api.Port) bool { return p.Port == remote }) {
				fmt.Fprintf(gc.stderr, "loam: nothing listens on port %d in %s yet; connections will fail until something does\n", remote, sb)
			}
			ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(local)))
			if err != nil {
				return fmt.Errorf("listening for port-forward: %w", err)
			}
			defer ln.Close()
			fmt.Fprintf(gc.stdout, "Forwarding from %s -> %s:%d\n", ln.Addr(), sb, remote)
			return forward(ctx, ln, func(ctx context.Context) (net.Conn, error) {
				return c.DialPort(ctx, sb, remote)
			}, gc.stderr)
		},
	}
	return cmd
}

// parsePortSpec reads [LOCAL:]REMOTE.
func parsePortSpec(s string) (local, remote int, err error) {
	l, r, two := strings.Cut(s, ":")
	if !two {
		r = l
	}
	remote, err = strconv.Atoi(r)
	if err != nil || remote < 1 || remote > api.MaxPort {
		return 0, 0, fmt.Errorf("port %q: want [LOCAL:]REMOTE, REMOTE a TCP port (1 to %d)", s, api.MaxPort)
	}
	if !two {
		return remote, remote, nil
	}
	local, err = strconv.Atoi(l)
	if err != nil || local < 0 || local > api.MaxPort {
		return 0, 0, fmt.Errorf("port %q: want [LOCAL:]REMOTE, LOCAL a TCP port (0 to %d; 0 picks one)", s, api.MaxPort)
	}
	return local, remote, nil
}

// forward accepts connections on ln until ctx ends and carries each to a
// connection from dial. A connection that cannot be carried is reported on
// errw and closed; forwarding goes on.
func forward(ctx context.Context, ln net.Listener, dial func(context.Context) (net.Conn, error), errw io.Writer) error {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accepting a connection to forward: %w", err)
		}
		wg.Go(func() {
			defer conn.Close()
			remote, err := dial(ctx)
			if err != nil {
				fmt.Fprintf(errw, "loam: port-forward: %s\n", message(err))
				return
			}
			defer remote.Close()
			if err := splice(conn, remote); err != nil {
				fmt.Fprintf(errw, "loam: port-forward: %s\n", forwardMessage(err))
			}
		})
	}
}

// splice copies both ways until either side ends, then closes both. It
// returns why the sandbox's side ended, when that was not a plain end.
func splice(local, remote net.Conn) error {
	errc := make(chan error, 2)
	go func() {
		// How the local side ended is the local program's business.
		_, _ = io.Copy(remote, local)
		errc <- nil
	}()
	go func() {
		_, err := io.Copy(local, remote)
		errc <- err
	}()
	err := <-errc
	local.Close()
	remote.Close()
	if err2 := <-errc; err == nil {
		err = err2
	}
	if errors.Is(err, client.ErrStreamEnded) {
		return err
	}
	return nil
}

// forwardMessage is what the user reads when the sandbox ended a
// forwarded connection.
func forwardMessage(err error) string {
	var ae *api.Error
	if errors.As(err, &ae) {
		return "a connection ended: " + ae.Message
	}
	return err.Error()
}
