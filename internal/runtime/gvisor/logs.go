package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"loam.dev/loam/internal/atomicfile"
)

// The logs of a bundle (init.log, runsc.log) grow for as long as its
// container lives, and what a sandbox writes to init.log is up to the
// sandbox: root in it can write to /proc/1/fd/1 without end. LogKeeper
// caps them.

// Defaults of LogKeeper.
const (
	// DefaultLogMax is the size in bytes over which a log file is trimmed.
	DefaultLogMax = 8 << 20
	// DefaultLogInterval is how often LogKeeper looks at the logs.
	DefaultLogInterval = 10 * time.Second
)

// logFiles are the log files of a bundle that TrimLogs caps.
var logFiles = []string{initLogFile, runscLogFile}

// oldLogSuffix names the file that holds the newest part of a trimmed
// log: init.log.1.
const oldLogSuffix = ".1"

// TrimLogs caps the log files of the bundle in bundleDir (init.log and
// runsc.log) at max bytes each. A file over max is cut in two: its newest
// max/2 bytes, from the first line that starts in them, replace NAME.1
// (whole or not at all), and NAME itself is emptied in place. It is never
// renamed or replaced, so its writers keep their descriptors; runsc's and
// the sandbox's were opened with O_APPEND, so their next write lands at the
// file's new end, the start, and leaves no hole. What a writer adds in the
// moment between the copy and the emptying is lost. A file at or under
// max, or missing, is left alone. On disk a bundle's logs then take at most
// 1.5 max bytes each, plus what their writers add between two calls.
func TrimLogs(bundleDir string, max int64) error {
	if max < 2 {
		return fmt.Errorf("trimming logs in %s: cap %d is too small", bundleDir, max)
	}
	var errs []error
	for _, name := range logFiles {
		if err := trimLog(filepath.Join(bundleDir, name), max); err != nil {
			errs = append(errs, fmt.Errorf("trimming %s: %w", filepath.Join(bundleDir, name), err))
		}
	}
	return errors.Join(errs...)
}

// trimLog cuts the log file at path if it is over max; see TrimLogs.
func trimLog(path string, max int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Size() <= max {
		return nil
	}
	keep := max / 2
	// From one byte before the part kept, to tell whether that part
	// starts a line; and on to the end, as far as writers have taken it
	// meanwhile (within reason: a writer that is faster than this read
	// loses a little more).
	tail, err := readTail(f, st.Size()-keep-1, keep, max)
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	if int64(len(tail)) > keep+1 {
		tail = tail[int64(len(tail))-keep-1:]
	}
	if len(tail) > 0 {
		// No line starts in the part (a line end, if any, is its last
		// byte): it ends one long line, keep that end.
		if i := bytes.IndexByte(tail[:len(tail)-1], '\n'); i >= 0 {
			tail = tail[i+1:]
		} else {
			tail = tail[1:]
		}
	}
	// Emptied first, so that as little as possible is written in between
	// and lost; if NAME.1 cannot be written, its part is lost instead.
	return atomicfile.Replace(path+oldLogSuffix, bytes.NewReader(tail), st.Mode().Perm())
}

// readTail reads f from offset to its end, keeping the last keep+1 bytes,
// and gives up after limit bytes more than the file held at first.
func readTail(f *os.File, offset, keep, limit int64) ([]byte, error) {
	buf := make([]byte, 0, 2*(keep+1))
	chunk := make([]byte, 64<<10)
	for read := int64(0); read < keep+1+limit; {
		n, err := f.ReadAt(chunk, offset)
		buf = append(buf, chunk[:n]...)
		offset += int64(n)
		read += int64(n)
		if int64(len(buf)) > 2*(keep+1) {
			buf = append(buf[:0], buf[int64(len(buf))-keep-1:]...)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	return buf, nil
}

// LogKeeper keeps the logs of every bundle under a directory capped: every
// Interval it runs TrimLogs on each directory that matches Bundles. The
// daemon runs one as a component for as long as it runs: Run(ctx) until
// ctx ends. Set the fields before Run.
type LogKeeper struct {
	// Bundles is a filepath.Glob pattern that matches the bundle
	// directories, such as DATA_DIR/sandboxes/*/bundle.
	Bundles string
	// Max is the cap of each log file in bytes; DefaultLogMax when 0.
	Max int64
	// Interval is the time between two rounds; DefaultLogInterval when 0.
	Interval time.Duration
	// Logger receives a warning for each log that could not be trimmed;
	// default none.
	Logger *slog.Logger

	// running refuses a second Run at once: two keepers would rename the
	// same files under each other.
	running atomic.Bool
}

// Run trims the logs at once and then every Interval, until ctx ends; then
// it returns nil, with no trim under way. It returns an error at once for
// a Bundles pattern that is not one, or when it runs already.
func (k *LogKeeper) Run(ctx context.Context) error {
	if k.Bundles == "" {
		return errors.New("running log keeper: no bundle pattern")
	}
	if _, err := filepath.Glob(k.Bundles); err != nil {
		return fmt.Errorf("running log keeper: pattern %q: %w", k.Bundles, err)
	}
	max, interval := k.Max, k.Interval
	if max == 0 {
		max = DefaultLogMax
	}
	if interval <= 0 {
		interval = DefaultLogInterval
	}
	log := k.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !k.running.CompareAndSwap(false, true) {
		return errors.New("running log keeper: it runs already")
	}
	defer k.running.Store(false)

	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		k.trimAll(ctx, max, log)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// trimAll trims the logs of every bundle once.
func (k *LogKeeper) trimAll(ctx context.Context, max int64, log *slog.Logger) {
	dirs, _ := filepath.Glob(k.Bundles) // checked by Run
	for _, dir := range dirs {
		if ctx.Err() != nil {
			return
		}
		// A bundle removed meanwhile (its sandbox deleted) is no error.
		if err := TrimLogs(dir, max); err != nil && !errors.Is(err, fs.ErrNotExist) {
			log.WarnContext(ctx, "trimming a sandbox's logs", "bundle", dir, "err", err)
		}
	}
}
