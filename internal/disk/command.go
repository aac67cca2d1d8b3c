package disk

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// maxStderr bounds how much of a command's stderr goes into an error
// message: enough for the reason, not a whole debootstrap log.
const maxStderr = 2048

// run runs a command and returns its stdout. A failure's error names the
// command and carries the tail of its stderr, since that is where tools such
// as btrfs and debootstrap say what went wrong.
//
// The command runs in its own process group so that cancelling ctx kills its
// children too (debootstrap runs dpkg in a chroot; killing only debootstrap
// would leave dpkg writing into a tree we are about to remove).
func run(ctx context.Context, name string, args ...string) (string, error) {
	return runFd3(ctx, nil, name, args...)
}

// runFd3 is run with the command's file descriptor 3 writing to fd3 (nil:
// none open), where debootstrap --debian-installer reports its progress.
func runFd3(ctx context.Context, fd3 *os.File, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, lookTool(name), args...)
	if fd3 != nil {
		cmd.ExtraFiles = []*os.File{fd3}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", context.Cause(ctx), err)
		}
		return stdout.String(), &commandError{line: commandLine(name, args), err: err, stderr: stderr.String()}
	}
	return stdout.String(), nil
}

// commandError is a failed command, with what it said on stderr.
type commandError struct {
	line   string // the command line
	err    error  // how it failed: an exit status, a context's cause
	stderr string
}

func (e *commandError) Error() string {
	return fmt.Sprintf("running %s: %v%s", e.line, e.err, stderrSuffix(e.stderr))
}

func (e *commandError) Unwrap() error { return e.err }

// lookTool finds a tool on PATH or, failing that, in the sbin directories
// that a non-login root shell (sudo, CI runners) may leave off PATH, where
// mkfs.btrfs, losetup and debootstrap live.
func lookTool(name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	if _, err := exec.LookPath(name); err == nil {
		return name
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		if path, err := exec.LookPath(filepath.Join(dir, name)); err == nil {
			return path
		}
	}
	return name // let exec report it missing
}

// commandLine renders a command for an error message.
func commandLine(name string, args []string) string {
	return strings.Join(append([]string{name}, args...), " ")
}

// stderrSuffix formats the tail of a command's stderr for an error message.
func stderrSuffix(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	if len(s) > maxStderr {
		s = "…" + s[len(s)-maxStderr:]
	}
	return ": " + s
}
