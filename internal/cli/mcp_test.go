package cli

import (
	"strings"
	"testing"
)

// TestMCPFlags checks that loam mcp refuses bad guardrail flags before it
// serves anything, with the message on stderr and nothing on stdout (the
// stdio transport).
func TestMCPFlags(t *testing.T) {
	_, srv := newFakeAPI(t)
	for _, tt := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"mcp", "--checkpoint-before", "always"}, `loam: checkpoint-before "always": give exec, write or never` + "\n"},
		{[]string{"mcp", "--checkpoint-keep", "-1"}, "loam: checkpoint-keep -1: give 0 (keep all) or more\n"},
		{[]string{"mcp", "--sandboxes", "a,,b"}, "loam: sandboxes: an empty name in the list\n"},
		{[]string{"mcp", "extra"}, `loam: unknown command "extra" for "loam mcp"` + "\n"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := runCLI(t, srv, "", false, nil, tt.args...)
			if r.code != 1 || r.stderr != tt.stderr || r.stdout != "" {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 1, stderr %q", r.code, r.stdout, r.stderr, tt.stderr)
			}
		})
	}
}

// TestMCPStdioEOF checks that loam mcp ends cleanly when its client closes
// stdin, having written nothing on stdout that is not the protocol's.
func TestMCPStdioEOF(t *testing.T) {
	_, srv := newFakeAPI(t)
	r := runCLI(t, srv, "", false, nil, "mcp", "--checkpoint-before=exec")
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, `msg="serving MCP" checkpoint_before=exec`) {
		t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}
