//go:build crashpoints

package crash

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// armVar names the crash point the process dies at. Its value is a point's
// name, or "@" and a file that holds one (read at each point, so that a
// test can arm a running daemon just before the operation it cuts short,
// and disarm it before the next start).
const armVar = "LOAM_CRASH_AT"

// Point kills the process with SIGKILL, after one line on stderr, when
// LOAM_CRASH_AT names point name: no deferred function runs and no buffer
// is flushed, as in a real crash.
func Point(name string) {
	want := os.Getenv(armVar)
	if file, ok := strings.CutPrefix(want, "@"); ok {
		b, err := os.ReadFile(file)
		if err != nil {
			return
		}
		want = strings.TrimSpace(string(b))
	}
	if want != name {
		return
	}
	fmt.Fprintf(os.Stderr, "crash point %s: killing the process (pid %d)\n", name, os.Getpid())
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not caught: nothing after this runs
}
