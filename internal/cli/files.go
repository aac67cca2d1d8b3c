package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

func (gc *guestCommands) filesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "files",
		Short: "List, read, remove, make and move files in a sandbox",
		Long: `Work on a sandbox's files. Paths are the sandbox's own, absolute, and are
resolved inside it: no path or symlink reaches the host. Every command acts
as the sandbox's user, loam, unless --user names another (--user root).
To copy files and directories in and out, use 'loam cp'.`,
	}
	cmd.AddCommand(gc.filesLsCmd(), gc.filesCatCmd(), gc.filesRmCmd(), gc.filesMkdirCmd(), gc.filesMvCmd())
	return cmd
}

// userFlag adds --user to cmd.
func userFlag(cmd *cobra.Command, user *string) {
	cmd.Flags().StringVarP(user, "user", "u", "", "the sandbox user to act as (default loam)")
}

func (gc *guestCommands) filesLsCmd() *cobra.Command {
	var (
		opts   client.FileOptions
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "ls SANDBOX PATH",
		Aliases: []string{"list"},
		Short:   "List a directory of a sandbox, or describe a file",
		Example: `  loam files ls scratch /home/loam
  loam files ls scratch /etc --depth 2 --json`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := gc.connect()
			if err != nil {
				return err
			}
			info, err := c.ListFiles(cmd.Context(), args[0], args[1], &opts)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(gc.stdout, info)
			}
			t := newTable(gc.stdout, "TYPE", "MODE", "SIZE", "MODIFIED", "PATH")
			rows := []api.FileInfo{*info}
			if info.Type == api.FileTypeDir {
				rows = flatten(info.Entries)
			}
			for _, fi := range rows {
				name := fi.Path
				if fi.Target != "" {
					name += " -> " + fi.Target
				}
				t.row(string(fi.Type), fi.Mode, strconv.FormatInt(fi.Size, 10), formatTime(fi.MTime), name)
			}
			if err := t.flush(); err != nil {
				return err
			}
			if info.Truncated {
				fmt.Fprintf(gc.stderr, "loam: the listing stops at %d entries\n", api.MaxFileEntries)
			}
			return nil
		},
	}
	userFlag(cmd, &opts.User)
	cmd.Flags().IntVar(&opts.Depth, "depth", 1, fmt.Sprintf("how many levels of entries to list (at most %d)", api.MaxFileDepth))
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the listing as JSON")
	return cmd
}

// flatten lists entries and, after each directory, what it holds.
func flatten(entries []api.FileInfo) []api.FileInfo {
	var out []api.FileInfo
	for _, e := range entries {
		sub := e.Entries
		e.Entries = nil
		out = append(out, e)
		out = append(out, flatten(sub)...)
	}
	return out
}

func (gc *guestCommands) filesCatCmd() *cobra.Command {
	var opts client.FileOptions
	cmd := &cobra.Command{
		Use:   "cat SANDBOX PATH...",
		Short: "Print files of a sandbox",
		Long: `Print files of a sandbox, or with --offset and --length a part of each:
--length bytes from byte --offset (to the end when --length is left out).`,
		Example: `  loam files cat web /etc/os-release
  loam files cat web /var/log/app.log --offset 1048576 --length 4096`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := gc.connect()
			if err != nil {
				return err
			}
			for _, p := range args[1:] {
				r, err := c.ReadFile(cmd.Context(), args[0], p, &opts)
				if err != nil {
					return err
				}
				_, err = io.Copy(gc.stdout, r)
				r.Close()
				if err != nil {
					return err
				}
			}
			return nil
		},
	}
	userFlag(cmd, &opts.User)
	cmd.Flags().Int64Var(&opts.Offset, "offset", 0, "start at this byte")
	cmd.Flags().Int64Var(&opts.Length, "length", 0, "print at most this many bytes (0: to the end)")
	return cmd
}

func (gc *guestCommands) filesRmCmd() *cobra.Command {
	var (
		opts client.FileOptions
		yes  bool
	)
	cmd := &cobra.Command{
		Use:   "rm SANDBOX PATH...",
		Short: "Remove files of a sandbox",
		Long: `Remove files of a sandbox; directories only with -r, which removes all they
hold. On a terminal rm asks first; elsewhere it needs --yes.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			what := "remove " + strings.Join(args[1:], " ") + " in " + args[0]
			if opts.Recursive {
				what = "remove, with all they hold, " + strings.Join(args[1:], " ") + " in " + args[0]
			}
			if err := gc.confirm(yes, what); err != nil {
				return err
			}
			c, err := gc.connect()
			if err != nil {
				return err
			}
			for _, p := range args[1:] {
				if err := c.RemoveFile(cmd.Context(), args[0], p, &opts); err != nil {
					return err
				}
			}
			return nil
		},
	}
	userFlag(cmd, &opts.User)
	cmd.Flags().BoolVarP(&opts.Recursive, "recursive", "r", false, "remove directories and all they hold")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

func (gc *guestCommands) filesMkdirCmd() *cobra.Command {
	var (
		opts client.FileOptions
		mode string
	)
	cmd := &cobra.Command{
		Use:   "mkdir SANDBOX PATH...",
		Short: "Make directories of a sandbox, and their parents",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := parseMode(mode)
			if err != nil {
				return err
			}
			opts.Mode = m
			c, err := gc.connect()
			if err != nil {
				return err
			}
			for _, p := range args[1:] {
				if _, err := c.Mkdir(cmd.Context(), args[0], p, &opts); err != nil {
					return err
				}
			}
			return nil
		},
	}
	userFlag(cmd, &opts.User)
	cmd.Flags().StringVarP(&mode, "mode", "m", "", "permission bits in octal (default 0755)")
	return cmd
}

// parseMode reads an octal mode flag; "" is 0.
func parseMode(s string) (fs.FileMode, error) {
	if s == "" {
		return 0, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("--mode: %q is not an octal mode such as 0644", s)
	}
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
	return mode, nil
}

func (gc *guestCommands) filesMvCmd() *cobra.Command {
	var opts client.FileOptions
	cmd := &cobra.Command{
		Use:   "mv SANDBOX FROM TO",
		Short: "Rename a file of a sandbox",
		Long:  `Rename FROM to TO, replacing a file at TO; into a directory TO when TO is one.`,
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := gc.connect()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			to := args[2]
			if fi, err := c.StatFile(ctx, args[0], to, &opts); err == nil && fi.Type == api.FileTypeDir {
				to = path.Join(to, path.Base(args[1]))
			}
			_, err = c.MoveFile(ctx, args[0], args[1], to, &opts)
			return err
		},
	}
	userFlag(cmd, &opts.User)
	return cmd
}

func (gc *guestCommands) watchCmd() *cobra.Command {
	var (
		opts   client.FileOptions
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "watch SANDBOX PATH",
		Short: "Print changes to files of a sandbox as they happen",
		Long: `Print one line per change to PATH (a file, or a directory's entries; with -r
every directory below it too): TYPE PATH, where TYPE is create, write,
remove, rename (moved away) or chmod, or "overflow" when the sandbox dropped
events. It runs until interrupted or PATH goes away; a memory checkpoint or a
restore of the sandbox ends it with an error.`,
		Example: `  loam watch scratch /home/loam/app -r`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := gc.connect()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			w, err := c.Watch(ctx, args[0], args[1], &opts)
			if err != nil {
				return err
			}
			defer w.Close()
			for {
				ev, err := w.Next(ctx)
				if errors.Is(err, io.EOF) {
					return nil
				}
				if err != nil {
					return err
				}
				if asJSON {
					err = printJSONLine(gc.stdout, ev)
				} else {
					_, err = fmt.Fprintf(gc.stdout, "%s %s\n", ev.Type, ev.Path)
				}
				if err != nil {
					return err
				}
			}
		},
	}
	userFlag(cmd, &opts.User)
	cmd.Flags().BoolVarP(&opts.Recursive, "recursive", "r", false, "watch every directory below PATH too")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each event as a line of JSON")
	return cmd
}
