// Package host reads what the daemon and the CLI need to know of this
// machine from /proc: its memory and its CPU's features.
package host

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Memory is this host's memory, in bytes: MemTotal and MemAvailable of
// /proc/meminfo.
func Memory() (total, available int64, err error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	var seen int
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() && seen < 2 {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "MemTotal" && k != "MemAvailable") {
			continue
		}
		kib, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("reading %s of /proc/meminfo: %w", k, err)
		}
		if k == "MemTotal" {
			total = kib << 10
		} else {
			available = kib << 10
		}
		seen++
	}
	if seen < 2 {
		return 0, 0, fmt.Errorf("reading /proc/meminfo: no MemTotal and MemAvailable")
	}
	return total, available, sc.Err()
}

// CPUFeatures are the host CPU's features, as /proc/cpuinfo lists them
// (its "flags", or "Features" on arm64); nil when it cannot be read.
func CPUFeatures() []string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if k = strings.TrimSpace(k); ok && (k == "flags" || k == "Features") {
			return strings.Fields(v)
		}
	}
	return nil
}
