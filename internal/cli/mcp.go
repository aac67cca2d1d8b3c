package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"loam.dev/loam/internal/mcp"
	"loam.dev/loam/internal/tlsconfig"
	"loam.dev/loam/internal/version"
)

func (a *app) mcpCmd() *cobra.Command {
	var (
		listen    string
		tlsCert   string
		tlsKey    string
		before    string
		memory    bool
		keep      int
		sandboxes []string
		readOnly  bool
	)
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve loam to AI agents over the Model Context Protocol",
		Long: `Serve loam's tools to an AI agent over the Model Context Protocol (MCP): on
stdin and stdout, as MCP clients run a local server, or with --listen over
streamable HTTP at http://ADDR/mcp (https:// with --tls-cert and --tls-key),
where every request must carry the daemon's token as
"Authorization: Bearer $LOAM_TOKEN".

Tools: create_sandbox, list_sandboxes, delete_sandbox, sandbox_url;
run_command (exit code, stdout, stderr, with a timeout); start_session,
list_sessions, read_session, kill_session; read_file, write_file, list_files,
remove_file; create_checkpoint, list_checkpoints, restore_checkpoint,
fork_sandbox.

Guardrails:
  --checkpoint-before=exec   a checkpoint before every command (run_command,
                             start_session) and every change (write_file,
                             remove_file, kill_session)
  --checkpoint-before=write  a checkpoint before every change, but not before
                             commands
  --checkpoint-before=never  no checkpoint (the default)
The checkpoints are disk-only unless --checkpoint-memory is given; each is
named mcp-…, commented "before mcp exec: CMD" (or write_file: PATH, …), and
its id comes back in the tool's result, so the agent (or you) can restore to
it. The server keeps the newest --checkpoint-keep of its own per sandbox and
deletes older ones. When a checkpoint cannot be taken, the call is refused.
No checkpoint comes before create_sandbox, fork_sandbox or create_checkpoint
(nothing to undo), restore_checkpoint (the daemon keeps the sandbox as it was
as auto-N, whose id comes back in the result) or delete_sandbox (a sandbox's
checkpoints are deleted with it: keep agents from it with --read-only or
--sandboxes).
  --sandboxes NAME,…  the agent sees and touches only these sandboxes, and may
                      create or fork only sandboxes of these names
  --read-only         offer only the tools that change nothing

Every tool call is logged on stderr (never stdout, the stdio transport), with
the checkpoint taken before it.`,
		Example: `  loam mcp --checkpoint-before=exec
  loam mcp --sandboxes agent-1,agent-2 --checkpoint-before=write --checkpoint-memory
  loam mcp --listen 127.0.0.1:7071 --read-only
  loam mcp --listen 0.0.0.0:7071 --tls-cert cert.pem --tls-key key.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			policy, err := mcp.ParseCheckpointing(before)
			if err != nil {
				return err
			}
			c, err := a.connect()
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(a.stderr, nil))
			srv, err := mcp.New(c, mcp.Config{
				CheckpointBefore: policy, CheckpointMemory: memory, CheckpointKeep: keep,
				Sandboxes: sandboxes, ReadOnly: readOnly, Logger: log, Version: version.String(),
			})
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			tlsConfig, err := tlsconfig.Load(tlsCert, tlsKey)
			if err != nil {
				return err
			}
			if tlsConfig != nil && listen == "" {
				return errors.New("--tls-cert and --tls-key are for --listen: stdio needs no TLS")
			}
			if listen != "" {
				l, err := net.Listen("tcp", listen)
				if err != nil {
					return fmt.Errorf("listening for MCP clients: %w", err)
				}
				return srv.ListenAndServe(ctx, l, c.Token(), tlsConfig)
			}
			return srv.Run(ctx, &sdk.IOTransport{Reader: io.NopCloser(a.stdin), Writer: nopWriteCloser{a.stdout}})
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "", "serve over streamable HTTP on this address (such as 127.0.0.1:7071) instead of stdio, requiring the daemon's token")
	f.StringVar(&tlsCert, "tls-cert", "", "with --listen, serve HTTPS with this certificate (PEM; with --tls-key)")
	f.StringVar(&tlsKey, "tls-key", "", "the private key of --tls-cert (PEM)")
	f.StringVar(&before, "checkpoint-before", string(mcp.CheckpointNever), "take a checkpoint before: exec (every command and change), write (every change but commands) or never")
	f.BoolVar(&memory, "checkpoint-memory", false, "take memory checkpoints (memory and disk; a restore resumes the processes) instead of disk-only ones")
	f.IntVar(&keep, "checkpoint-keep", mcp.DefaultCheckpointKeep, "how many of its own checkpoints the server keeps per sandbox, deleting older ones; 0 keeps all")
	f.StringSliceVar(&sandboxes, "sandboxes", nil, "the only sandboxes (names or ids) the agent may see, touch, create or fork to")
	f.BoolVar(&readOnly, "read-only", false, "offer only the tools that change nothing")
	return cmd
}

// nopWriteCloser lets the process's stdout serve as the stdio transport's
// writer without the transport closing it.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
