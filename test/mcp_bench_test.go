package test

import (
	"context"
	"testing"

	"loam.dev/loam/api"
	imcp "loam.dev/loam/internal/mcp"
	"loam.dev/loam/test/harness"
)

// BenchmarkMCPRunCommand measures what a guardrail costs an agent: one
// run_command ("true") through `loam mcp` over stdio, with no checkpoint,
// with a disk-only checkpoint before it, and with a memory one (the
// server's own pruning to --checkpoint-keep included).
func BenchmarkMCPRunCommand(b *testing.B) {
	d := harness.StartDaemonB(b)
	if _, err := d.C.CreateSandbox(context.Background(), api.CreateSandbox{Name: "bench"}); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		args []string
	}{
		{"never", []string{"--checkpoint-before=never"}},
		{"exec-disk", []string{"--checkpoint-before=exec"}},
		{"exec-memory", []string{"--checkpoint-before=exec", "--checkpoint-memory"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := startMCP(b, d, bc.args...)
			args := map[string]any{"sandbox": "bench", "command": "true"}
			var out imcp.RunOutput
			m.ok(b, "run_command", args, &out) // the first call connects to the daemon
			for b.Loop() {
				m.ok(b, "run_command", args, &out)
				if out.ExitCode != 0 {
					b.Fatalf("run_command: %+v", out)
				}
			}
		})
	}
}
