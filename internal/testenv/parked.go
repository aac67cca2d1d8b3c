package testenv

import (
	"os/exec"
	"runtime"
)

// StartParked starts cmd, a server a test binary runs for its tests
// (PostgreSQL, an S3 server) with Pdeathsig set so that it dies with the
// binary, from an OS thread kept for as long as the binary runs: Pdeathsig
// is sent when the thread that forked the child ends, not the process,
// and a test binary whose goroutines lock OS threads and end locked
// (network namespaces do) ends threads; one of them could be the thread
// that started the server, which would then stop under the other tests.
func StartParked(cmd *exec.Cmd) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		started <- cmd.Start()
		select {} // never unlocked: the thread lives as long as the binary
	}()
	return <-started
}
