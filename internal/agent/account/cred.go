package account

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
)

// AsUser runs fn with the file-system rights of a: on an OS thread of its
// own whose credentials (uid, gid, groups) are a's, so that every path fn
// resolves, every file it opens and every file it creates is checked and
// owned as if a did it. Doing it as root and then chowning would follow, as
// root, a symlink a planted to somewhere a could not write.
//
// The credentials are changed with raw syscalls, which act on the calling
// thread only (the syscall package's Setuid and friends change every thread
// of the process), and the thread is never handed back: fn's goroutine ends
// locked to it, and the Go runtime then ends the thread. Threads the runtime
// starts meanwhile come from its template thread, never from this one.
//
// Root runs fn as it is; an agent that is not root (in development) can act
// as itself only.
func AsUser(a Account, fn func() error) error {
	euid := os.Geteuid()
	switch {
	case euid != 0 && a.UID == uint32(euid):
		return fn()
	case euid != 0:
		return api.Errorf(api.CodeInvalid, "the agent does not run as root and cannot act as %q", a.Name)
	case a.UID == 0:
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: see above.
		if err := setThreadCreds(a); err != nil {
			errc <- fmt.Errorf("taking on the credentials of %q: %w", a.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// setThreadCreds gives the calling thread a's groups, gid and uid, in that
// order (each step needs the root rights the next one drops).
func setThreadCreds(a Account) error {
	groups := a.Groups
	if len(groups) == 0 {
		groups = []uint32{a.GID}
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(&groups[0])), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(a.GID), uintptr(a.GID), uintptr(a.GID)); e != 0 {
		return fmt.Errorf("setresgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(a.UID), uintptr(a.UID), uintptr(a.UID)); e != 0 {
		return fmt.Errorf("setresuid: %w", e)
	}
	if unix.Geteuid() != int(a.UID) {
		return errors.New("the thread's uid did not change")
	}
	return nil
}
