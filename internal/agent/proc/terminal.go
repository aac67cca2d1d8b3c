package proc

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// OpenTerminal opens a new pseudo-terminal of rows x cols and returns its
// master and slave sides.
//
// The master is opened non-blocking and stays registered with Go's poller,
// so that reads on it honour deadlines and are interrupted by Close. That is
// why this does not use creack/pty: its Open calls Fd() on the master, which
// makes it blocking for good, and a read would then stay stuck for as long
// as a background process of the command holds the terminal open.
func OpenTerminal(rows, cols uint16) (master, slave *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening /dev/ptmx: %w", err)
	}
	// A non-blocking descriptor makes NewFile register it with the poller.
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	defer func() {
		if err != nil {
			master.Close()
		}
	}()
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		return nil, nil, fmt.Errorf("getting the pty number: %w", err)
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		return nil, nil, fmt.Errorf("unlocking the pty: %w", err)
	}
	if err := unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		return nil, nil, fmt.Errorf("setting the pty size: %w", err)
	}
	name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
	slave, err = os.OpenFile(name, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening %s: %w", name, err)
	}
	return master, slave, nil
}

// SetTerminalSize resizes the terminal of master; the kernel sends SIGWINCH
// to its foreground process group. It goes through SyscallConn because Fd()
// would make master blocking.
func SetTerminalSize(master *os.File, rows, cols uint16) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return fmt.Errorf("resizing the terminal: %w", err)
	}
	var ioctlErr error
	err = rc.Control(func(fd uintptr) {
		ioctlErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	})
	if err == nil {
		err = ioctlErr
	}
	if err != nil {
		return fmt.Errorf("resizing the terminal to %dx%d: %w", rows, cols, err)
	}
	return nil
}
