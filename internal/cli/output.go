package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"loam.dev/loam/api"
)

// timeLayout is how the CLI shows times, in the local time zone.
const timeLayout = "2006-01-02 15:04:05"

// blockKeyWidth is the column values start at in a block, "name:" included.
const blockKeyWidth = 13

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.In(time.Local).Format(timeLayout)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding JSON: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// table writes columns aligned with two spaces between them, like the
// checkpoint list in the docs.
type table struct {
	out io.Writer
	buf bytes.Buffer
	tw  *tabwriter.Writer
}

func newTable(out io.Writer, header ...string) *table {
	t := &table{out: out}
	t.tw = tabwriter.NewWriter(&t.buf, 0, 0, 2, ' ', 0)
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

// flush writes the table. Lines lose their trailing spaces, which tabwriter
// leaves when a row's last cells are empty.
func (t *table) flush() error {
	if err := t.tw.Flush(); err != nil {
		return err
	}
	var out strings.Builder
	for _, line := range strings.SplitAfter(t.buf.String(), "\n") {
		if line == "" {
			continue
		}
		out.WriteString(strings.TrimRight(line, " \n"))
		out.WriteString("\n")
	}
	_, err := io.WriteString(t.out, out.String())
	return err
}

// block writes "key:" padded to blockKeyWidth, then the value, one per line.
// A key as long as the padding (secret_files) still gets one space before
// its value.
type block struct {
	w   io.Writer
	err error
}

func (b *block) line(key, value string) {
	if b.err != nil {
		return
	}
	_, b.err = fmt.Fprintf(b.w, "%-*s %s\n", blockKeyWidth-1, key+":", orDash(value))
}

func writeSandbox(w io.Writer, sb *api.Sandbox) error {
	b := &block{w: w}
	b.line("name", sb.Name)
	b.line("id", sb.ID)
	b.line("state", string(sb.State))
	if sb.Reason != "" {
		b.line("reason", sb.Reason)
	}
	b.line("url", sb.URL)
	b.line("access", access(sb.Public))
	b.line("template", sb.Template)
	if sb.Image != "" {
		b.line("image", sb.Image)
	}
	b.line("cpus", formatCPUUse(sb.Resources.CPUs, sb.Usage))
	b.line("memory", formatMemory(sb.Resources.MemoryMiB, sb.Usage))
	b.line("disk", formatDisk(sb.Resources.DiskMiB, sb.Disk))
	b.line("idle", sb.Idle)
	b.line("http_port", formatPort(sb.HTTPPort))
	b.line("env", formatKV(sb.Env))
	b.line("labels", formatKV(sb.Labels))
	if len(sb.Secrets) > 0 {
		b.line("secrets", formatKV(sb.Secrets))
	}
	if len(sb.SecretFiles) > 0 {
		b.line("secret_files", formatKV(sb.SecretFiles))
	}
	if sb.Network.Egress != "" {
		b.line("network", formatNetwork(sb.Network))
	}
	if sb.From != nil {
		b.line("from", sb.From.Sandbox+"/"+sb.From.Checkpoint)
	}
	if sb.Node != "" {
		b.line("node", sb.Node)
	}
	if sb.Recover != "" {
		b.line("recover", sb.Recover)
	}
	b.line("created", formatTime(sb.CreatedAt))
	return b.err
}

// access says who may use a sandbox's URL.
func access(public bool) string {
	if public {
		return "public"
	}
	return "private"
}

func writeCheckpoint(w io.Writer, cp *api.Checkpoint) error {
	b := &block{w: w}
	b.line("id", cp.ID)
	if cp.Name != "" {
		b.line("name", cp.Name)
	}
	b.line("sandbox", cp.Sandbox)
	b.line("kind", checkpointKind(cp))
	b.line("auto", yesNo(cp.Auto))
	b.line("created", formatTime(cp.CreatedAt))
	b.line("comment", cp.Comment)
	return b.err
}

func checkpointKind(cp *api.Checkpoint) string {
	if cp.Memory {
		return "memory"
	}
	return "disk"
}

func formatPort(port int) string {
	if port == 0 {
		return ""
	}
	return strconv.Itoa(port)
}

func formatCPUs(cpus float64) string {
	if cpus == 0 {
		return ""
	}
	return strconv.FormatFloat(cpus, 'f', -1, 64)
}

// formatCPUUse shows a sandbox's CPU limit, with the CPU time a running
// one used since its container started.
func formatCPUUse(cpus float64, u *api.Usage) string {
	limit := formatCPUs(cpus)
	if u == nil || limit == "" {
		return limit
	}
	return limit + " (" + strconv.FormatFloat(u.CPUSeconds, 'f', 1, 64) + "s CPU time used)"
}

// formatMemory shows a sandbox's memory limit, with what a running one
// holds of it, as the disk's line does.
func formatMemory(limitMiB int, u *api.Usage) string {
	limit := formatMiB(limitMiB)
	if u == nil || limit == "" {
		return limit
	}
	return formatBytes(u.MemoryBytes) + " used of " + limit
}

// formatKV shows a map as k=v pairs sorted by key, comma-separated.
func formatKV(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	pairs := make([]string, len(keys))
	for i, k := range keys {
		pairs[i] = k + "=" + m[k]
	}
	return strings.Join(pairs, ",")
}

// parseKV turns repeated KEY=VALUE flags into a map; nil when there are none,
// so the request leaves the field out.
func parseKV(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("invalid --%s %q: want KEY=VALUE", flag, v)
		}
		m[k] = val
	}
	return m, nil
}
