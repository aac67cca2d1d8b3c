package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"loam.dev/loam/api"
)

// sizeUnits are the suffixes parseSize accepts, in MiB. Decimal-looking
// suffixes (M, G) mean the binary units: nobody sizing a sandbox means
// 512,000,000 bytes when they write 512M.
var sizeUnits = map[string]float64{
	"": 1, "m": 1, "mi": 1, "mb": 1, "mib": 1,
	"g": 1024, "gi": 1024, "gb": 1024, "gib": 1024,
	"t": 1 << 20, "ti": 1 << 20, "tb": 1 << 20, "tib": 1 << 20,
}

// parseSize reads a memory or disk size (512Mi, 2Gi, 512M, or a plain
// number of MiB) as a whole number of MiB.
func parseSize(s string) (int, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	}
	mult, ok := sizeUnits[unit]
	n, err := strconv.ParseFloat(num, 64)
	if !ok || err != nil || num == "" {
		return 0, fmt.Errorf("invalid size %q: want MiB, or a size like 512Mi or 2Gi", s)
	}
	mib := n * mult
	if mib < 1 || mib > math.MaxInt32 || mib != float64(int(mib)) {
		return 0, fmt.Errorf("invalid size %q: want a whole number of MiB, at least 1", s)
	}
	return int(mib), nil
}

// formatMiB shows a size in MiB the way parseSize reads it: 512Mi, 2Gi.
func formatMiB(mib int) string {
	switch {
	case mib == 0:
		return ""
	case mib%1024 == 0:
		return fmt.Sprintf("%dGi", mib/1024)
	default:
		return fmt.Sprintf("%dMi", mib)
	}
}

// formatBytes shows a byte count in binary units, to one decimal under 10:
// 512B, 3.4Ki, 12Mi, 1.5Gi.
func formatBytes(n int64) string {
	units := []string{"B", "Ki", "Mi", "Gi", "Ti"}
	f, i := float64(n), 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 || f >= 10 {
		return fmt.Sprintf("%.0f%s", f, units[i])
	}
	return fmt.Sprintf("%.1f%s", f, units[i])
}

// formatDisk shows a sandbox's disk limit and, where the daemon measures
// it, its use: "12Mi used of 4Gi", or "4Gi (not enforced)" on a disk pool
// that cannot limit sandboxes.
func formatDisk(limitMiB int, d *api.DiskUse) string {
	limit := formatMiB(limitMiB)
	switch {
	case d == nil || limit == "":
		return limit
	case d.UsedBytes == nil && !d.Enforced:
		return limit + " (not enforced)"
	case d.UsedBytes == nil:
		return limit
	case !d.Enforced:
		return formatBytes(*d.UsedBytes) + " used of " + limit + " (not enforced)"
	}
	return formatBytes(*d.UsedBytes) + " used of " + limit
}
