package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// appendLog opens a bundle's log file the way runsc does: O_APPEND.
func appendLog(tb testing.TB, path string) *os.File {
	tb.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	return f
}

func writeString(tb testing.TB, f *os.File, s string) {
	tb.Helper()
	if _, err := f.WriteString(s); err != nil {
		tb.Fatal(err)
	}
}

func readFile(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// keptPart is what TrimLogs keeps of content under cap max: from the first
// line that starts in its last max/2 bytes, or those bytes if none does.
func keptPart(content string, max int64) string {
	from := int64(len(content)) - max/2
	for i := from; i < int64(len(content)); i++ {
		if i > 0 && content[i-1] == '\n' {
			return content[i:]
		}
	}
	return content[from:]
}

// TestTrimLogs writes a log past its cap through an O_APPEND descriptor
// that stays open, trims it, and writes on.
func TestTrimLogs(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, max := range []int64{2, 3, 64, 1000, 4096} {
		t.Run(strconv.FormatInt(max, 10), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, initLogFile)
			if err := os.WriteFile(path+oldLogSuffix, []byte("stale\n"), 0o640); err != nil {
				t.Fatal(err)
			}
			small := "runsc: under the cap\n"
			if err := os.WriteFile(filepath.Join(dir, runscLogFile), []byte(small[:min(int64(len(small)), max)]), 0o640); err != nil {
				t.Fatal(err)
			}
			w := appendLog(t, path)
			var before strings.Builder
			for i := 0; int64(before.Len()) <= max; i++ {
				line := fmt.Sprintf("%d %s\n", i, strings.Repeat("x", rnd.IntN(int(max)/4+2)))
				before.WriteString(line)
				writeString(t, w, line)
			}
			if err := TrimLogs(dir, max); err != nil {
				t.Fatal(err)
			}
			if got := readFile(t, path); got != "" {
				t.Errorf("after the trim %s holds %q, want nothing", initLogFile, got)
			}
			kept := readFile(t, path+oldLogSuffix)
			if want := keptPart(before.String(), max); kept != want {
				t.Errorf("%s = %q, want %q", initLogFile+oldLogSuffix, kept, want)
			}
			if int64(len(kept)) > max/2 {
				t.Errorf("%s holds %d bytes, over half the cap %d", initLogFile+oldLogSuffix, len(kept), max)
			}

			// Writes after the trim start the file again, with no hole
			// where the old content was.
			after := "after 1\nafter 2\n"
			writeString(t, w, after)
			if got := readFile(t, path); got != after {
				t.Errorf("after the trim and two writes %s = %q, want %q", initLogFile, got, after)
			}
			if st, err := os.Stat(path); err != nil || st.Size() != int64(len(after)) {
				t.Errorf("size after the trim: %v, %v; want %d", st.Size(), err, len(after))
			}

			// Files under the cap are left alone, and nothing else is
			// left behind.
			if got := readFile(t, filepath.Join(dir, runscLogFile)); int64(len(got)) > max || !strings.HasPrefix(small, got) {
				t.Errorf("%s = %q, want it untouched", runscLogFile, got)
			}
			entries, _ := os.ReadDir(dir)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			if want := []string{initLogFile, initLogFile + oldLogSuffix, runscLogFile}; !slices.Equal(names, want) {
				t.Errorf("bundle holds %v, want %v", names, want)
			}
		})
	}
	if err := TrimLogs(t.TempDir(), 1000); err != nil {
		t.Errorf("TrimLogs of a bundle without logs: %v", err)
	}
	if err := TrimLogs(t.TempDir(), 1); err == nil {
		t.Error("TrimLogs with a cap of 1: nil error, want one")
	}
}

// TestTrimLogsWhileWriting trims a log again and again while a writer
// keeps appending numbered lines: every line kept is whole, in order, and
// the newest ones are kept.
func TestTrimLogsWhileWriting(t *testing.T) {
	const max = 4096
	dir := t.TempDir()
	path := filepath.Join(dir, initLogFile)
	w := appendLog(t, path)
	var last atomic.Int64
	last.Store(-1)
	stop := make(chan struct{})
	done := make(chan error)
	go func() {
		for i := int64(0); ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if _, err := fmt.Fprintf(w, "line %08d\n", i); err != nil {
				done <- err
				return
			}
			last.Store(i)
		}
	}()
	for range 20 {
		for {
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Size() > max {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err := TrimLogs(dir, max); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := TrimLogs(dir, max); err != nil {
		t.Fatal(err)
	}

	lines := func(name string) []int64 {
		t.Helper()
		s := readFile(t, filepath.Join(dir, name))
		if strings.ContainsRune(s, 0) {
			t.Errorf("%s holds NUL bytes: a hole", name)
		}
		var ns []int64
		for l := range strings.Lines(s) {
			n, err := strconv.ParseInt(strings.TrimPrefix(strings.TrimSuffix(l, "\n"), "line "), 10, 64)
			if err != nil || len(l) != len("line 00000000\n") {
				t.Fatalf("%s holds a line that is not whole: %q", name, l)
			}
			if len(ns) > 0 && n != ns[len(ns)-1]+1 {
				t.Errorf("%s: line %d after line %d", name, n, ns[len(ns)-1])
			}
			ns = append(ns, n)
		}
		return ns
	}
	cur, old := lines(initLogFile), lines(initLogFile+oldLogSuffix)
	if st, _ := os.Stat(path); st.Size() > max {
		t.Errorf("%s holds %d bytes, over the cap %d", initLogFile, st.Size(), max)
	}
	if len(old) == 0 {
		t.Fatalf("%s is empty", initLogFile+oldLogSuffix)
	}
	newest := old[len(old)-1]
	if len(cur) > 0 {
		if cur[0] <= newest {
			t.Errorf("%s starts at line %d, not after %s's last, %d", initLogFile, cur[0], initLogFile+oldLogSuffix, newest)
		}
		newest = cur[len(cur)-1]
	}
	if newest != last.Load() {
		t.Errorf("newest line kept %d, want the last written, %d", newest, last.Load())
	}
}

func TestLogKeeper(t *testing.T) {
	const max = 1000
	root := t.TempDir()
	var paths []string
	for _, id := range []string{"a", "b"} {
		dir := filepath.Join(root, id, "bundle")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, name := range logFiles {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, bytes.Repeat([]byte("0123456789\n"), 2*max/11), 0o640); err != nil {
				t.Fatal(err)
			}
			paths = append(paths, p)
		}
	}
	k := &LogKeeper{Bundles: filepath.Join(root, "*", "bundle"), Max: max, Interval: 10 * time.Millisecond}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- k.Run(runCtx) }()
	for _, p := range paths {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			// The file is emptied first and NAME.1 written after it: a
			// trim is done when both are seen.
			_, oldErr := os.Stat(p + oldLogSuffix)
			if st.Size() <= max && oldErr == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still holds %d bytes, or has no %s (%v)", p, st.Size(), oldLogSuffix, oldErr)
			}
		}
	}
	// A second Run while it runs is refused (its ctx ended, so that one
	// wrongly let in returns at once); the end of its ctx stops the first.
	ended, end := context.WithCancel(context.Background())
	end()
	if err := k.Run(ended); err == nil {
		t.Error("a second Run while the first runs: nil error, want one")
	}
	stop()
	select {
	case err := <-ran:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still running 10 s after its ctx ended")
	}

	// A bad pattern is an error.
	bad := &LogKeeper{Bundles: "[", Interval: time.Hour}
	if err := bad.Run(context.Background()); err == nil {
		t.Error("Run with a bad pattern: nil error, want one")
	}
	// A cancelled context stops it too.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (&LogKeeper{Bundles: k.Bundles}).Run(ctx); err != nil {
		t.Errorf("Run with a cancelled context: %v", err)
	}
}

// TestInitLogTrimmed trims a running sandbox's init.log: what init writes
// afterwards, through gVisor, starts the file again.
func TestInitLogTrimmed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestlogtrm", 12)
	if err := e.rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	for range 3 {
		sb.ask(t)
	}
	sb.waitLog(t, "counter: served 3\n")
	path := filepath.Join(sb.spec.BundleDir, initLogFile)
	if err := TrimLogs(sb.spec.BundleDir, 40); err != nil {
		t.Fatal(err)
	}
	if got, want := readFile(t, path+oldLogSuffix), "counter: served 3\n"; got != want {
		t.Errorf("%s = %q, want %q", initLogFile+oldLogSuffix, got, want)
	}
	if r := sb.ask(t); r.N != 4 {
		t.Errorf("n = %d, want 4", r.N)
	}
	want := "counter: served 4\n"
	sb.waitLog(t, want)
	if got := readFile(t, path); got != want {
		t.Errorf("after the trim %s = %q, want %q", initLogFile, got, want)
	}
}

// TestReadErrorsAfterTrim reads runsc's errors from a runsc.log trimmed
// while runsc ran: they are at its start, not at the offset it had.
func TestReadErrorsAfterTrim(t *testing.T) {
	path := filepath.Join(t.TempDir(), runscLogFile)
	if err := os.WriteFile(path, []byte(`{"msg":"it failed"}`+"\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if got := readErrors(path, 1000); got != "it failed" {
		t.Errorf("readErrors = %q, want %q", got, "it failed")
	}
}
