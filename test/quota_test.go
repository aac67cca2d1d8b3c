package test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// TestQuota holds a real daemon's org to its quota: only the operator
// sets it; a create, a fork and a wake past it are refused with limit and
// a message naming the quota, its use and its limit, and nothing is made;
// a sleep or a delete makes room; GET /v1/org shows the use; the change
// of the quota is in the audit log.
func TestQuota(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	admin := client.New(d.URL, d.Token)
	writer := client.New(d.URL, makeKey(t, d, `{"name":"ci","scope":"write"}`).Secret)

	org, err := writer.Org(ctx)
	if err != nil || org.Name != "default" || org.Quota != (api.Quota{}) {
		t.Fatalf("GET /v1/org: %+v, %v; want the default org, no quota", org, err)
	}
	two := 2
	if _, err := writer.SetQuota(ctx, "default", api.Quota{Sandboxes: &two}); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("a write key setting the quota: %v, want forbidden", err)
	}
	if _, err := admin.SetQuota(ctx, "default", api.Quota{Sandboxes: &two}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if _, err := writer.CreateSandbox(ctx, api.CreateSandbox{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	want := "org default would run 3 sandboxes, its quota is 2"
	_, err = writer.CreateSandbox(ctx, api.CreateSandbox{Name: "c"})
	if !errors.Is(err, api.ErrLimit) || !strings.Contains(err.Error(), want) {
		t.Fatalf("a third create: %v, want limit saying %q", err, want)
	}
	if _, err := writer.GetSandbox(ctx, "c"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("the refused create made something: %v", err)
	}
	if _, err := writer.CreateCheckpoint(ctx, "a", api.CreateCheckpoint{}); err != nil {
		t.Fatal(err)
	}
	_, err = writer.CreateSandbox(ctx, api.CreateSandbox{Name: "fork", From: &api.ForkSource{Sandbox: "a", Checkpoint: "v1"}})
	if !errors.Is(err, api.ErrLimit) || !strings.Contains(err.Error(), want) {
		t.Errorf("a fork past the quota: %v, want limit saying %q", err, want)
	}
	if _, err := writer.Sleep(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.CreateSandbox(ctx, api.CreateSandbox{Name: "fork", From: &api.ForkSource{Sandbox: "a", Checkpoint: "v1"}}); err != nil {
		t.Fatalf("a fork once b sleeps: %v", err)
	}
	if _, err := writer.Wake(ctx, "b"); !errors.Is(err, api.ErrLimit) || !strings.Contains(err.Error(), want) {
		t.Errorf("waking b past the quota: %v, want limit saying %q", err, want)
	}
	if org, err = writer.Org(ctx); err != nil || org.Use.Sandboxes != 2 || org.Use.Checkpoints != 1 || org.Use.MemoryMiB != 2*512 {
		t.Errorf("GET /v1/org: %+v, %v; want 2 running sandboxes of 512 MiB and 1 checkpoint", org, err)
	}
	if err := writer.DeleteSandbox(ctx, "fork"); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Wake(ctx, "b"); err != nil {
		t.Errorf("waking b once the fork is gone: %v", err)
	}

	st, out := d.Curl("GET", "/v1/audit?action=quota.set", "")
	var log api.AuditList
	if err := json.Unmarshal([]byte(out), &log); err != nil || st != 200 {
		t.Fatalf("GET /v1/audit: %d %s", st, out)
	}
	var outcomes []string
	for _, ev := range log.Events {
		outcomes = append(outcomes, ev.Key+" "+ev.Target+" "+ev.Outcome)
	}
	if len(outcomes) != 2 || !strings.HasSuffix(outcomes[0], "forbidden") || outcomes[1] != "admin orgs/default/quota ok" {
		t.Errorf("the audit log's quota changes: %q; want the write key's refused, then the admin's", outcomes)
	}
}
