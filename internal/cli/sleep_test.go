package cli

import (
	"strings"
	"testing"
)

// loam sleep and loam wake print each sandbox with its new state; ls shows
// it; a missing sandbox among several is reported and fails the command.
func TestSleepWakeCLI(t *testing.T) {
	_, srv := newFakeAPI(t)
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"sleep", "scratch"}, 0, "scratch\tsleeping\n", ""},
		{[]string{"ls"}, 0, "", ""},
		{[]string{"wake", "scratch"}, 0, "scratch\trunning\n", ""},
		{[]string{"sleep", "scratch", "nope"}, 1, "scratch\tsleeping\n", "loam: sandbox nope not found\n"},
		{[]string{"wake", "nope"}, 1, "", "loam: sandbox nope not found\n"},
	} {
		r := runCLI(t, srv, "", false, nil, tc.args...)
		if tc.args[0] == "ls" {
			if r.code != 0 || !strings.Contains(r.stdout, "sleeping") {
				t.Errorf("ls: %d %q", r.code, r.stdout)
			}
			continue
		}
		if r.code != tc.code || r.stdout != tc.stdout || r.stderr != tc.stderr {
			t.Errorf("loam %v: %d %q %q, want %d %q %q", tc.args, r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderr)
		}
	}
}
