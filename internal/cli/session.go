package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// guestCommands reach inside a running sandbox through its agent: exec,
// attach and sessions (this file), services (service.go), files, cp and
// watch (files.go, cp.go), and ports and port forwarding (ports.go,
// portforward.go).
type guestCommands struct{ *app }

// The session commands: exec, attach, sessions, logs and kill (see
// api/session.go).

func (gc *guestCommands) execCmd() *cobra.Command {
	var (
		req        api.ExecRequest
		env        []string
		detach     bool
		sigProxy   bool
		bufferSize string
	)
	cmd := &cobra.Command{
		Use:   "exec SANDBOX [flags] -- CMD [ARG...]",
		Short: "Run a command as a detachable session",
		Long: `Run a command in a sandbox as a detachable session: it runs on when you
detach (Ctrl-P Ctrl-Q, or Ctrl-C, SIGTERM or SIGHUP to loam) or lose the
connection, keeping its output in buffers (1 MiB per stream by default) for
"loam attach" and "loam logs". With -d it starts in the background and its
session id is printed. A memory checkpoint ends the connection but not the
session. With --sig-proxy, Ctrl-C and SIGTERM go to the command instead.`,
		Example: `  loam exec -d scratch -- sh -c 'while :; do date; sleep 1; done'
  loam exec -t scratch -- bash`,
		RunE: func(cmd *cobra.Command, args []string) error {
			sandbox, command, err := splitRunArgs(args, cmd.ArgsLenAtDash())
			if err != nil {
				return err
			}
			req.Cmd = command
			if req.Env, err = parseKV("env", env); err != nil {
				return err
			}
			if bufferSize != "" {
				n, err := parseBytes(bufferSize)
				if err != nil {
					return fmt.Errorf("--buffer-size: %w", err)
				}
				req.BufferSize = n
			}
			if req.TTY {
				// A terminal always takes input: it is how a person types.
				req.Stdin = true
				if ws, ok := windowSize(); ok && gc.localTerminal {
					req.Rows, req.Cols = ws.Rows, ws.Cols
				}
			}
			c, err := gc.connect()
			if err != nil {
				return err
			}
			ss, err := c.CreateSession(cmd.Context(), sandbox, req)
			if err != nil {
				return err
			}
			if detach {
				_, err := fmt.Fprintln(gc.stdout, ss.ID)
				return err
			}
			return gc.attach(cmd.Context(), c, sandbox, ss, req.Stdin, sigProxy)
		},
	}
	cmd.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf(`%w (put the command after "--": loam exec SANDBOX -- CMD [ARG...])`, err)
	})
	f := cmd.Flags()
	f.BoolVarP(&detach, "detach", "d", false, "start in the background and print the session's id")
	f.BoolVarP(&req.TTY, "tty", "t", false, "give the command a terminal")
	f.BoolVarP(&req.Stdin, "interactive", "i", false, "keep the command's stdin open for the clients that attach")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable `KEY=VALUE` (repeatable)")
	f.StringVarP(&req.Dir, "workdir", "w", "", "working `DIR` (default: the user's home)")
	f.StringVarP(&req.User, "user", "u", "", "`USER` to run as (default: loam)")
	f.StringVar(&bufferSize, "buffer-size", "", "output kept per stream, in bytes or like 64Ki, 4Mi (default 1Mi)")
	f.BoolVar(&sigProxy, "sig-proxy", false, sigProxyUsage)
	return cmd
}

// parseBytes reads a size in bytes: 4096, 64Ki, 4Mi (K and M mean Ki, Mi).
func parseBytes(s string) (int, error) {
	mult := 1
	num := s
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"K", 1 << 10}, {"M", 1 << 20}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = n, u.mult
			break
		}
	}
	n, err := strconv.Atoi(num)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a size such as 65536, 64Ki or 4Mi", s)
	}
	return n * mult, nil
}

func (gc *guestCommands) attachCmd() *cobra.Command {
	var sigProxy bool
	cmd := &cobra.Command{
		Use:   "attach SANDBOX SESSION",
		Short: "Attach to a detachable session",
		Long: `Attach to a detachable session: replay the output it still holds, then
follow it until the command exits, with this terminal's input when it is a
terminal. Exits with the command's exit status.

Leaving never ends the session: Ctrl-P Ctrl-Q detaches, and so do Ctrl-C
(SIGINT), SIGTERM and SIGHUP, and a lost connection. With --sig-proxy, Ctrl-C
and SIGTERM are passed on to the session's process group instead (as
"loam kill -s INT" would), which may end it.`,
		Example: `  loam attach scratch s-k3v9c0q2x7ab
  loam attach --sig-proxy scratch s-k3v9c0q2x7ab   # Ctrl-C interrupts the command`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := gc.connect()
			if err != nil {
				return err
			}
			ss, err := c.GetSession(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			return gc.attach(cmd.Context(), c, args[0], ss, gc.terminalIn(), sigProxy)
		},
	}
	cmd.Flags().BoolVar(&sigProxy, "sig-proxy", false, sigProxyUsage)
	return cmd
}

// terminalIn reports whether this process reads a terminal: only then does
// attach send its input, so that a script's empty stdin never closes a
// session's stdin for everyone (or types ^D into its terminal).
func (gc *guestCommands) terminalIn() bool {
	f, ok := gc.stdin.(*os.File)
	return ok && gc.localTerminal && term.IsTerminal(int(f.Fd()))
}

// ctrlP and ctrlQ, typed in a row, detach, as in docker.
const ctrlP, ctrlQ = 0x10, 0x11

// errDetached ends an attach that the user left: by Ctrl-P Ctrl-Q, or by a
// signal to loam without --sig-proxy.
var errDetached = errors.New("detached")

// sigProxyUsage is the --sig-proxy flag's help, for attach and exec.
const sigProxyUsage = "pass SIGINT (Ctrl-C) and SIGTERM on to the session's process group instead of detaching"

// attach attaches this process's streams to session ss until the command
// exits, the user detaches, or the stream ends. Leaving never ends the
// session: Ctrl-P Ctrl-Q, and SIGINT, SIGTERM or SIGHUP to this process,
// detach; with sigProxy, SIGINT and SIGTERM are passed on to the session
// instead.
func (gc *guestCommands) attach(ctx context.Context, c *client.Client, sandbox string, ss *api.Session, withStdin, sigProxy bool) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	detach := func() { cancel(errDetached) }
	opts := client.AttachOptions{Stdout: gc.stdout, Stderr: gc.stderr}
	if withStdin {
		opts.Stdin = &detachReader{r: gc.stdin, ctx: ctx, detach: detach}
	}
	if gc.localTerminal {
		undo, err := gc.attachTerminal(ctx, ss.TTY, withStdin, sigProxy, detach, &opts)
		if err != nil {
			return err
		}
		defer undo()
	}
	code, err := c.Attach(ctx, sandbox, ss.ID, opts)
	again := fmt.Sprintf("loam attach %s %s", sandbox, ss.ID)
	switch {
	case errors.Is(context.Cause(ctx), errDetached):
		fmt.Fprintf(gc.stderr, "\r\ndetached from %s; it runs on (%s attaches again)\r\n", ss.ID, again)
		return nil
	case errors.Is(err, client.ErrInterrupted):
		reason := "the sandbox was checkpointed or restored"
		var ae *api.Error
		if errors.As(err, &ae) && ae.Message != "" {
			reason = ae.Message
		}
		return &ExitError{Code: 1, Err: fmt.Errorf("session %s: the stream ended (%s); the session runs on and can be attached again: %s", ss.ID, reason, again)}
	case err != nil:
		return err
	case code != 0:
		return &ExitError{Code: code}
	}
	return nil
}

// attachTerminal readies this process's terminal and signals for an
// attach. A session with a terminal puts this one in raw mode (Ctrl-C is a
// byte for the session's terminal) and follows its size; one without keeps
// it cooked but lets Ctrl-P Ctrl-Q through (detachKeysMode). SIGINT,
// SIGTERM and SIGHUP detach, except that with sigProxy SIGINT and SIGTERM
// go to the session as "INT" and "TERM". The function returned undoes it
// all.
func (gc *guestCommands) attachTerminal(ctx context.Context, tty, withStdin, sigProxy bool, detach func(), opts *client.AttachOptions) (undo func(), err error) {
	var undos []func()
	undo = func() {
		for i := len(undos) - 1; i >= 0; i-- {
			undos[i]()
		}
	}
	if tty {
		eo := client.ExecOptions{TTY: true}
		restore, err := attachTerminal(&eo)
		if err != nil {
			return nil, err
		}
		undos = append(undos, restore)
		opts.Resize = withFirst(ctx, client.WindowSize{Rows: eo.Rows, Cols: eo.Cols}, eo.Resize)
	} else if f, ok := gc.stdin.(*os.File); ok && withStdin && term.IsTerminal(int(f.Fd())) {
		restore, err := detachKeysMode(int(f.Fd()))
		if err != nil {
			return nil, err
		}
		undos = append(undos, restore)
	}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	names := make(chan string, 4)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case s := <-sigs:
				name := map[os.Signal]string{os.Interrupt: "INT", syscall.SIGTERM: "TERM"}[s]
				if !sigProxy || name == "" {
					detach()
					continue
				}
				select {
				case names <- name:
				case <-done:
					return
				}
			}
		}
	}()
	if sigProxy {
		opts.Signal = names
	}
	undos = append(undos, func() {
		signal.Stop(sigs)
		close(done)
	})
	return undo, nil
}

// withFirst is a channel that yields first, then what in yields.
func withFirst(ctx context.Context, first client.WindowSize, in <-chan client.WindowSize) <-chan client.WindowSize {
	out := make(chan client.WindowSize, 1)
	if first.Rows > 0 && first.Cols > 0 {
		out <- first
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case ws, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- ws:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// detachReader passes input on until Ctrl-P Ctrl-Q, which detaches: it
// cancels the attach and, so that no "eof" closes the session's stdin,
// never ends the input by itself. A Ctrl-P not followed by Ctrl-Q is passed
// on.
type detachReader struct {
	r      io.Reader
	ctx    context.Context
	detach func()

	mu       sync.Mutex
	pendingP bool   // a Ctrl-P was read last
	carry    []byte // bytes due before the next read
	done     bool
}

func (d *detachReader) Read(p []byte) (int, error) {
	d.mu.Lock()
	if d.done {
		d.mu.Unlock()
		<-d.ctx.Done()
		return 0, d.ctx.Err()
	}
	if len(d.carry) > 0 {
		n := copy(p, d.carry)
		d.carry = d.carry[n:]
		d.mu.Unlock()
		return n, nil
	}
	d.mu.Unlock()

	buf := make([]byte, len(p))
	n, err := d.r.Read(buf)
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []byte
	for _, b := range buf[:n] {
		switch {
		case d.pendingP && b == ctrlQ:
			d.pendingP = false
			d.done = true
			d.detach()
			return copy(p, out), nil
		case d.pendingP:
			d.pendingP = false
			out = append(out, ctrlP)
			if b == ctrlP {
				d.pendingP = true
				continue
			}
			out = append(out, b)
		case b == ctrlP:
			d.pendingP = true
		default:
			out = append(out, b)
		}
	}
	k := copy(p, out)
	d.carry = append(d.carry, out[k:]...)
	if err != nil && d.pendingP {
		d.carry = append(d.carry, ctrlP)
		d.pendingP = false
	}
	if err != nil && len(d.carry) > 0 {
		// Hand the rest over before the error.
		err = nil
	}
	return k, err
}

func (gc *guestCommands) sessionsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "sessions SANDBOX",
		Short: "List a sandbox's sessions, oldest first",
		Long: `List a sandbox's exec sessions: the running ones and the newest 100 that
have exited.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return list(cmd.Context(), gc.app, asJSON, func(ctx context.Context, c *client.Client) ([]api.Session, error) {
				return c.ListSessions(ctx, args[0])
			}, listing[api.Session]{
				header: []string{"ID", "STATE", "EXIT", "PID", "DETACHABLE", "STARTED", "CMD"},
				row: func(s *api.Session) []string {
					exit := ""
					if s.ExitCode != nil {
						exit = strconv.Itoa(*s.ExitCode)
					}
					return []string{s.ID, s.State, orDash(exit), strconv.Itoa(s.PID), yesNo(s.Detachable), formatTime(s.StartedAt), strings.Join(s.Cmd, " ")}
				},
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sessions as a JSON array")
	return cmd
}

func (gc *guestCommands) logsCmd() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs [-f] SANDBOX SESSION",
		Short: "Print a detachable session's output",
		Long: `Print the output a detachable session still holds (its stdout on stdout,
its stderr on stderr). With -f, then follow it until the command exits.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := gc.connect()
			if err != nil {
				return err
			}
			_, err = c.Attach(cmd.Context(), args[0], args[1], client.AttachOptions{
				Stdout: gc.stdout, Stderr: gc.stderr, NoFollow: !follow,
			})
			if errors.Is(err, client.ErrInterrupted) {
				return fmt.Errorf("%w; the session runs on: loam logs -f %s %s follows it again", err, args[0], args[1])
			}
			return err
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output until the command exits")
	return cmd
}

func (gc *guestCommands) killCmd() *cobra.Command {
	var (
		sig  string
		tree bool
	)
	cmd := &cobra.Command{
		Use:   "kill [-s SIGNAL] SANDBOX SESSION",
		Short: "Signal a session, or kill its whole process tree",
		Long: `Send a signal (TERM by default) to a session's whole process group. With
--rm, kill its whole process tree instead, children that left the group
included, and forget the session.`,
		Example: `  loam kill scratch s-1a2b3c4d5e6f
  loam kill -s INT scratch s-1a2b3c4d5e6f
  loam kill --rm scratch s-1a2b3c4d5e6f`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := gc.connect()
			if err != nil {
				return err
			}
			if tree {
				return c.DeleteSession(cmd.Context(), args[0], args[1])
			}
			return c.SignalSession(cmd.Context(), args[0], args[1], sig)
		},
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", "TERM", "the `SIGNAL` to send: a name such as INT or KILL, or a number")
	cmd.Flags().BoolVar(&tree, "rm", false, "kill the whole process tree and forget the session")
	cmd.MarkFlagsMutuallyExclusive("signal", "rm")
	return cmd
}
