package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Files the workload keeps in its directory (a tmpfs, /dev/shm, so that
// the data is the sandbox's memory).
const (
	blobFile  = "blob"
	sumFile   = "blob.sha256"
	readyFile = "ready"
	gapsFile  = "gaps"
)

// WorkloadDir is where the workload keeps its memory inside a sandbox.
const WorkloadDir = "/dev/shm"

// tick is how often the workload's ticker wakes; gapThreshold is the
// shortest gap between two ticks that it records.
const (
	tick         = time.Millisecond
	gapThreshold = 5 * time.Millisecond
)

// ErrChecksum is the error of Verify when the memory is not what the
// workload wrote.
var ErrChecksum = errors.New("checksum mismatch")

// Workload fills dir/blob with mib MiB of random bytes, writes their
// SHA-256 to dir/blob.sha256 and creates dir/ready, then ticks every
// millisecond until ctx ends, appending every gap longer than 5 ms between
// two ticks to dir/gaps as "END_UNIX_NANO GAP_NANO" lines. A checkpoint's
// pause, as the sandbox sees it, is such a gap.
func Workload(ctx context.Context, dir string, mib int) error {
	if err := writeBlob(dir, mib); err != nil {
		return fmt.Errorf("bench workload: %w", err)
	}
	gaps, err := os.OpenFile(filepath.Join(dir, gapsFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("bench workload: %w", err)
	}
	defer gaps.Close()
	if err := os.WriteFile(filepath.Join(dir, readyFile), nil, 0o644); err != nil {
		return fmt.Errorf("bench workload: %w", err)
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		// time.Now, not the ticker's time: a ticker drops ticks it could
		// not deliver, and the wall clock is what the host shares.
		now := time.Now()
		if gap := now.Sub(last); gap > gapThreshold {
			fmt.Fprintf(gaps, "%d %d\n", now.UnixNano(), gap.Nanoseconds())
		}
		last = now
	}
}

// writeBlob writes mib MiB of incompressible bytes (ChaCha8 from a random
// seed: fast, and no compressor or zero-page scan can shrink them) and
// their checksum.
func writeBlob(dir string, mib int) error {
	var seed [32]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return fmt.Errorf("seeding: %w", err)
	}
	src := mrand.NewChaCha8(seed)
	f, err := os.Create(filepath.Join(dir, blobFile))
	if err != nil {
		return err
	}
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for range mib {
		_, _ = src.Read(buf)
		h.Write(buf)
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return fmt.Errorf("writing memory: %w", err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing memory: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, sumFile), []byte(hex.EncodeToString(h.Sum(nil))+"\n"), 0o644)
}

// Verify checks that dir/blob still has the checksum the workload wrote;
// a mismatch is ErrChecksum.
func Verify(dir string) error {
	want, err := os.ReadFile(filepath.Join(dir, sumFile))
	if err != nil {
		return fmt.Errorf("verifying workload memory: %w", err)
	}
	f, err := os.Open(filepath.Join(dir, blobFile))
	if err != nil {
		return fmt.Errorf("verifying workload memory: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("verifying workload memory: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != strings.TrimSpace(string(want)) {
		return fmt.Errorf("verifying workload memory: sha256 %s, want %s: %w", got, strings.TrimSpace(string(want)), ErrChecksum)
	}
	return nil
}

// MaxGap returns the longest gap the workload in dir recorded that ended
// at or after since (0 when none did).
func MaxGap(dir string, since time.Time) (time.Duration, error) {
	f, err := os.Open(filepath.Join(dir, gapsFile))
	if err != nil {
		return 0, fmt.Errorf("reading workload gaps: %w", err)
	}
	defer f.Close()
	return parseGaps(f, since)
}

// parseGaps is MaxGap on the gaps file's contents.
func parseGaps(r io.Reader, since time.Time) (time.Duration, error) {
	var longest time.Duration
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue // a line cut short by a kill
		}
		end, err1 := strconv.ParseInt(f[0], 10, 64)
		gap, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if end >= since.UnixNano() && time.Duration(gap) > longest {
			longest = time.Duration(gap)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading workload gaps: %w", err)
	}
	return longest, nil
}
