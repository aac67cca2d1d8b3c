package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
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
