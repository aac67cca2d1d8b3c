package sandbox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/randid"
)

func TestNames(t *testing.T) {
	const org = "default"
	max := MaxNameLen(org) // NAME--default fills a 63-character DNS label
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"scratch", true}, {"scratch-2", true}, {"a", true}, {"a" + strings.Repeat("b", max-1), true},
		{"", false}, {"2x", false}, {"Scratch", false}, {"s_x", false}, {"a" + strings.Repeat("b", max), false},
		{"a" + strings.Repeat("b", 62), false}, {"x-", false}, {"a--b", false},
	} {
		err := checkName(tc.name, max)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, api.ErrInvalid)) {
			t.Errorf("checkName(%q) = %v", tc.name, err)
		}
		if err == nil {
			if label := tc.name + "--" + org; len(label) > 63 {
				t.Errorf("name %q accepted, but its URL label %q is %d characters", tc.name, label, len(label))
			}
		}
	}
}

func TestOrgs(t *testing.T) {
	for _, tc := range []struct {
		org string
		ok  bool
	}{
		{"default", true}, {"acme", true}, {"a" + strings.Repeat("b", 45), true},
		{"a" + strings.Repeat("b", 46), false}, {"", false}, {"Acme", false}, {"a--b", false}, {"a-", false}, {"a.b", false},
	} {
		if err := CheckOrg(tc.org); (err == nil) != tc.ok {
			t.Errorf("CheckOrg(%q) = %v", tc.org, err)
		}
	}
}

func TestIDShape(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := newID()
		if len(id) != 15 || !strings.HasPrefix(id, "sb-") || strings.Trim(id[3:], randid.Alphabet) != "" || seen[id] {
			t.Fatalf("id %q", id)
		}
		seen[id] = true
	}
}

func TestTransitions(t *testing.T) {
	for _, tc := range []struct {
		from, to api.State
		ok       bool
	}{
		{api.StateCreating, api.StateRunning, true},
		{api.StateRunning, api.StateDeleting, true},
		{api.StateDeleting, api.StateRunning, false},
		{api.StateCreating, api.StateSleeping, false},
		{api.StateError, api.StateRunning, true},
		{api.StateStopped, api.StateRunning, true},
	} {
		if got := canTransition(tc.from, tc.to); got != tc.ok {
			t.Errorf("%s -> %s: %v", tc.from, tc.to, got)
		}
	}
	if err := requireState("x", api.StateStopped, api.StateRunning); !errors.Is(err, api.ErrConflict) {
		t.Errorf("requireState: %v", err)
	}
}

func TestRequestChecks(t *testing.T) {
	bad := []error{
		checkResources(api.Resources{CPUs: 0.01}),
		checkResources(api.Resources{MemoryMiB: 10}),
		checkResources(api.Resources{DiskMiB: 1}),
		checkEnv(map[string]string{"1X": ""}),
		checkEnv(map[string]string{"LOAM_AGENT_TOKEN": "x"}),
		checkLabels(map[string]string{"": "x"}),
		checkLabels(map[string]string{"k": strings.Repeat("v", 256)}),
		checkLabels(map[string]string{"k": "caf\xe9"}), // Latin-1, not UTF-8
		checkIdle("10s", time.Minute),
		checkIdle("soon", time.Minute),
		checkPort(70000),
	}
	for i, err := range bad {
		if !errors.Is(err, api.ErrInvalid) {
			t.Errorf("case %d: %v", i, err)
		}
	}
	good := []error{
		checkResources(api.Resources{CPUs: 0.5, MemoryMiB: 512, DiskMiB: 4096}),
		checkEnv(map[string]string{"GREETING": "hi"}),
		checkLabels(map[string]string{"team": "red", "app.kubernetes.io/name": "x"}),
		checkLabels(map[string]string{"team": "café"}),
		checkIdle("10m", time.Minute), checkIdle("", time.Minute), checkIdle("0", time.Minute),
		checkPort(8080),
	}
	for i, err := range good {
		if err != nil {
			t.Errorf("good case %d: %v", i, err)
		}
	}
}
