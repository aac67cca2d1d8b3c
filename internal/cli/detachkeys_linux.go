package cli

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// detachKeysMode lets Ctrl-P Ctrl-Q reach attach from a terminal that
// stays cooked (for a session without a terminal of its own, whose input is
// lines): flow control off, so Ctrl-Q is not eaten; control characters
// echoed as they are rather than as "^P"; and Ctrl-Q an end of line (VEOL),
// so a Ctrl-P Ctrl-Q is read at once rather than at the next Enter. Line
// editing, Ctrl-D (end of input) and Ctrl-C (a SIGINT, see --sig-proxy)
// keep working. The function returned puts the terminal back.
func detachKeysMode(fd int) (restore func(), err error) {
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, fmt.Errorf("reading the terminal's mode: %w", err)
	}
	t := *old
	t.Iflag &^= unix.IXON
	t.Lflag &^= unix.ECHOCTL
	t.Cc[unix.VEOL] = ctrlQ
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &t); err != nil {
		return nil, fmt.Errorf("setting the terminal's mode: %w", err)
	}
	return func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }, nil
}
