package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
)

// The checkpoint list exactly as the docs show it.
func TestCheckpointTableGolden(t *testing.T) {
	cps := []api.Checkpoint{
		{ID: "v1", Sandbox: "sb-2kjiso7vff5b", Comment: "site up, state v1", Memory: true,
			CreatedAt: time.Date(2026, 10, 12, 9, 17, 36, 94927000, time.UTC)},
		{ID: "v2", Sandbox: "sb-2kjiso7vff5b", Comment: "disk only",
			CreatedAt: time.Date(2026, 10, 12, 9, 17, 37, 727794283, time.UTC)},
		{ID: "auto-1", Sandbox: "sb-2kjiso7vff5b", Comment: "before restoring v1", Memory: true, Auto: true,
			CreatedAt: time.Date(2026, 10, 12, 9, 17, 38, 500000000, time.UTC)},
	}
	tests := []struct {
		name string
		cps  []api.Checkpoint
		want string
	}{
		{"two", cps[:2], "" +
			"ID  KIND    AUTO  CREATED              COMMENT\n" +
			"v1  memory  no    2026-10-12 05:17:36  site up, state v1\n" +
			"v2  disk    no    2026-10-12 05:17:37  disk only\n"},
		{"after restore", cps, "" +
			"ID      KIND    AUTO  CREATED              COMMENT\n" +
			"v1      memory  no    2026-10-12 05:17:36  site up, state v1\n" +
			"v2      disk    no    2026-10-12 05:17:37  disk only\n" +
			"auto-1  memory  yes   2026-10-12 05:17:38  before restoring v1\n"},
		{"no comment", []api.Checkpoint{{ID: "v1", Memory: true, CreatedAt: cps[0].CreatedAt}}, "" +
			"ID  KIND    AUTO  CREATED              COMMENT\n" +
			"v1  memory  no    2026-10-12 05:17:36\n"},
		{"none", nil, "ID  KIND  AUTO  CREATED  COMMENT\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := checkpointListing.write(&buf, tt.cps); err != nil {
				t.Fatal(err)
			}
			if buf.String() != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", buf.String(), tt.want)
			}
		})
	}
}

func TestSandboxBlockGolden(t *testing.T) {
	sb := &api.Sandbox{
		ID: "sb-y6sgfql7k3ra", Name: "scratch-copy", State: api.StateRunning, Template: "base",
		Resources: api.Resources{CPUs: 1, MemoryMiB: 512, DiskMiB: 4096},
		Env:       map[string]string{}, Labels: map[string]string{"owner": "docs", "app": "site"},
		Idle: "10m", HTTPPort: 8080, URL: "https://scratch-copy--docs.loam.example.com",
		From:      &api.ForkSource{Sandbox: "scratch", Checkpoint: "v1"},
		CreatedAt: t0,
	}
	want := `name:        scratch-copy
id:          sb-y6sgfql7k3ra
state:       running
url:         https://scratch-copy--docs.loam.example.com
access:      private
template:    base
cpus:        1
memory:      512Mi
disk:        4Gi
idle:        10m
http_port:   8080
env:         -
labels:      app=site,owner=docs
from:        scratch/v1
created:     2026-10-12 05:17:36
`
	var buf bytes.Buffer
	if err := writeSandbox(&buf, sb); err != nil {
		t.Fatal(err)
	}
	if buf.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", buf.String(), want)
	}

	// An image sandbox with nothing set shows dashes, never trailing spaces.
	bare := &api.Sandbox{ID: "sb-1", Name: "img", State: api.StateCreating, Image: "python:3.13",
		Resources: api.Resources{CPUs: 0.5, MemoryMiB: 1536}, Env: map[string]string{"B": "2", "A": "1"}}
	want = `name:        img
id:          sb-1
state:       creating
url:         -
access:      private
template:    -
image:       python:3.13
cpus:        0.5
memory:      1536Mi
disk:        -
idle:        -
http_port:   -
env:         A=1,B=2
labels:      -
created:     -
`
	buf.Reset()
	if err := writeSandbox(&buf, bare); err != nil {
		t.Fatal(err)
	}
	if buf.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", buf.String(), want)
	}
}

func TestCheckpointBlock(t *testing.T) {
	cp := &api.Checkpoint{ID: "v2", Sandbox: "sb-2kjiso7vff5b", Comment: "disk only", CreatedAt: t0}
	want := `id:          v2
sandbox:     sb-2kjiso7vff5b
kind:        disk
auto:        no
created:     2026-10-12 05:17:36
comment:     disk only
`
	var buf bytes.Buffer
	if err := writeCheckpoint(&buf, cp); err != nil {
		t.Fatal(err)
	}
	if buf.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", buf.String(), want)
	}
}

func TestTableTrimsTrailingSpaces(t *testing.T) {
	var buf bytes.Buffer
	tb := newTable(&buf, "NAME", "DESCRIPTION")
	tb.row("go", "")
	tb.row("base", "Debian")
	if err := tb.flush(); err != nil {
		t.Fatal(err)
	}
	want := "NAME  DESCRIPTION\ngo\nbase  Debian\n"
	if buf.String() != want {
		t.Errorf("got %q, want %q", buf.String(), want)
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr bool
	}{
		{"512Mi", 512, false},
		{"512M", 512, false},
		{"512", 512, false},
		{"512MiB", 512, false},
		{"2Gi", 2048, false},
		{"2G", 2048, false},
		{"2gi", 2048, false},
		{"1.5Gi", 1536, false},
		{"1Ti", 1 << 20, false},
		{" 4Gi ", 4096, false},
		{"0", 0, true},
		{"0.5", 0, true},
		{"0.3Gi", 0, true}, // 307.2 MiB
		{"", 0, true},
		{"Gi", 0, true},
		{"12Ki", 0, true},
		{"1e3", 0, true},
		{"-1Gi", 0, true},
		{"1..5Gi", 0, true},
		{"99999999999Ti", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseSize(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parseSize(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestFormatMiB(t *testing.T) {
	for mib, want := range map[int]string{0: "", 512: "512Mi", 1024: "1Gi", 1536: "1536Mi", 4096: "4Gi"} {
		if got := formatMiB(mib); got != want {
			t.Errorf("formatMiB(%d) = %q, want %q", mib, got, want)
		}
		if mib != 0 {
			if back, err := parseSize(formatMiB(mib)); err != nil || back != mib {
				t.Errorf("parseSize(formatMiB(%d)) = %d, %v", mib, back, err)
			}
		}
	}
}

func TestParseKV(t *testing.T) {
	m, err := parseKV("env", []string{"A=1", "B=x=y", "C="})
	if err != nil || m["A"] != "1" || m["B"] != "x=y" || m["C"] != "" || len(m) != 3 {
		t.Errorf("parseKV = %v, %v", m, err)
	}
	if m, err := parseKV("env", nil); m != nil || err != nil {
		t.Errorf("parseKV(nil) = %v, %v; want nil, nil", m, err)
	}
	for _, bad := range []string{"A", "=1"} {
		if _, err := parseKV("label", []string{bad}); err == nil || !strings.Contains(err.Error(), "--label") {
			t.Errorf("parseKV(%q) = %v, want an error naming --label", bad, err)
		}
	}
}

// TestSandboxBlockSecrets: secret_files, as long as the keys' column, still
// has a space before its value.
func TestSandboxBlockSecrets(t *testing.T) {
	sb := &api.Sandbox{ID: "sb-2kjiso7vff5b", Name: "app", State: api.StateRunning, Template: "base",
		Secrets:     map[string]string{"DB_PASSWORD": "db-password"},
		SecretFiles: map[string]string{"/run/secrets/db": "db-password"},
		CreatedAt:   t0}
	var buf bytes.Buffer
	if err := writeSandbox(&buf, sb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"\nsecrets:     DB_PASSWORD=db-password\n",
		"\nsecret_files: /run/secrets/db=db-password\n",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("no line %q in:\n%s", strings.TrimSpace(want), buf.String())
		}
	}
}

func TestFormatDisk(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		limit int
		d     *api.DiskUse
		want  string
	}{
		{4096, nil, "4Gi"},
		{4096, &api.DiskUse{LimitMiB: 4096}, "4Gi (not enforced)"},
		{4096, &api.DiskUse{LimitMiB: 4096, UsedBytes: n(12 << 20), Enforced: true}, "12Mi used of 4Gi"},
		{512, &api.DiskUse{LimitMiB: 512, UsedBytes: n(16384), Enforced: true}, "16Ki used of 512Mi"},
		{512, &api.DiskUse{LimitMiB: 512, UsedBytes: n(3 << 29), Enforced: true}, "1.5Gi used of 512Mi"},
		{512, &api.DiskUse{LimitMiB: 512, UsedBytes: n(100)}, "100B used of 512Mi (not enforced)"},
		{0, &api.DiskUse{}, ""},
	} {
		if got := formatDisk(tc.limit, tc.d); got != tc.want {
			t.Errorf("formatDisk(%d, %+v) = %q, want %q", tc.limit, tc.d, got, tc.want)
		}
	}
}

func TestFormatUsage(t *testing.T) {
	u := &api.Usage{MemoryBytes: 41 << 20, CPUSeconds: 12.34}
	for _, tc := range []struct{ got, want string }{
		{formatMemory(512, nil), "512Mi"},
		{formatMemory(512, u), "41Mi used of 512Mi"},
		{formatMemory(0, u), ""},
		{formatCPUUse(2, nil), "2"},
		{formatCPUUse(0.5, u), "0.5 (12.3s CPU time used)"},
		{formatCPUUse(0, u), ""},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}
