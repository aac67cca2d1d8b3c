// Command clidoc writes the CLI reference, docs/reference/cli/*.md, one page
// per command, from the cobra commands themselves (internal/cli and the
// daemon's serve), so the reference cannot say other than --help does.
// Run it with go generate ./internal/cli; clidoc's test fails when the pages
// in the repository are not what it writes.
//
// The pages are the same on every machine and every day: no generation date
// or "auto generated" line, and the daemon's flag defaults as they are with
// no LOAM_* variable set.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"loam.dev/loam/internal/cli"
	"loam.dev/loam/internal/daemon"
)

func main() {
	out := flag.String("out", "docs/reference/cli", "directory to write the pages to; its *.md files are replaced")
	flag.Parse()
	if err := generate(*out); err != nil {
		fmt.Fprintln(os.Stderr, "clidoc:", err)
		os.Exit(1)
	}
}

// generate replaces the Markdown pages in dir with one page per command.
func generate(dir string) error {
	root, err := rootCommand()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		return err
	}
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	if err := doc.GenMarkdownTree(root, dir); err != nil {
		return fmt.Errorf("writing the CLI reference to %s: %w", dir, err)
	}
	return nil
}

// rootCommand is the loam command as the binary builds it, less the hidden
// in-sandbox agent, with flag defaults that do not depend on the
// environment it runs in.
func rootCommand() (*cobra.Command, error) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "LOAM_") {
			if err := os.Unsetenv(k); err != nil {
				return nil, err
			}
		}
	}
	root := cli.NewRoot(daemon.Command())
	disableAutoGenTag(root)
	return root, nil
}

func disableAutoGenTag(cmd *cobra.Command) {
	cmd.DisableAutoGenTag = true
	for _, c := range cmd.Commands() {
		disableAutoGenTag(c)
	}
}
