package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

func testSandboxCreateGet(ctx context.Context, t *testing.T, st store.Store) {
	want := newSandbox(1)
	mustCreateSandbox(ctx, t, st, want)
	checkSandbox(t, "by id", mustGetSandbox(ctx, t, st, want.ID), want)
	checkSandbox(t, "by name", mustGetSandbox(ctx, t, st, want.Name), want)
}

func testSandboxRoundTrip(ctx context.Context, t *testing.T, st store.Store) {
	tests := []struct {
		name string
		edit func(sb *store.Sandbox)
	}{
		{"full", func(*store.Sandbox) {}},
		{"zero fields", func(sb *store.Sandbox) {
			// The owner node stays: a node's store writes its own records
			// only.
			*sb = store.Sandbox{Sandbox: api.Sandbox{ID: sb.ID, Name: sb.Name, CreatedAt: sb.CreatedAt, Node: sb.Node}}
		}},
		{"nil maps", func(sb *store.Sandbox) { sb.Env, sb.Labels = nil, nil }},
		{"empty maps", func(sb *store.Sandbox) { sb.Env, sb.Labels = map[string]string{}, map[string]string{} }},
		{"odd keys and values", func(sb *store.Sandbox) {
			sb.Env = map[string]string{"": "empty key", "A=B": "x=y", "NUL": "a\x00b", "NL": "line\nline"}
			sb.Labels = map[string]string{"a.b": "dotted", `q"uote`: `v"al`, "$.x": "[0]", "ключ": "значение", "e": ""}
		}},
		{"fork", func(sb *store.Sandbox) {
			sb.From = &api.ForkSource{Sandbox: "box-origin", Checkpoint: "v3"}
		}},
		{"error state", func(sb *store.Sandbox) {
			sb.State, sb.Error = api.StateError, "booting: runsc exited with status 1"
		}},
		{"fractional cpus", func(sb *store.Sandbox) { sb.Resources.CPUs = 0.1 }},
		{"secret references", func(sb *store.Sandbox) {
			sb.Secrets = map[string]string{"DB_PASS": "db-pass", "API_KEY": "api.key"}
			sb.SecretFiles = map[string]string{"/run/secrets/db": "db-pass"}
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sb := newSandbox(i)
			tc.edit(sb)
			want := *sb
			want.Env, want.Labels = copyMap(sb.Env), copyMap(sb.Labels)
			mustCreateSandbox(ctx, t, st, sb)
			checkSandbox(t, "GetSandbox", mustGetSandbox(ctx, t, st, sb.ID), &want)
			list := mustListSandboxes(ctx, t, st, store.Filter{})
			checkSandbox(t, "ListSandboxes", list[len(list)-1], &want)
		})
	}
}

func testSandboxGetNotFound(ctx context.Context, t *testing.T, st store.Store) {
	mustCreateSandbox(ctx, t, st, newSandbox(1))
	for _, ref := range []string{"sb-002", "box-2", "", "sb-00", "SB-001", "%"} {
		_, err := st.GetSandbox(ctx, "", ref)
		wantErr(t, "GetSandbox("+ref+")", err, store.ErrNotFound)
	}
}

func testSandboxConflict(ctx context.Context, t *testing.T, st store.Store) {
	orig := newSandbox(1)
	mustCreateSandbox(ctx, t, st, orig)
	tests := []struct {
		name string
		edit func(sb *store.Sandbox)
	}{
		{"same id", func(sb *store.Sandbox) { sb.Name = "other" }},
		{"same name", func(sb *store.Sandbox) { sb.ID = "sb-other" }},
		{"same id and name", func(*store.Sandbox) {}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sb := newSandbox(1)
			sb.NetIndex, sb.State = 99, api.StateStopped
			tc.edit(sb)
			wantErr(t, "CreateSandbox", st.CreateSandbox(ctx, sb), store.ErrExists)
			if got := sandboxIDs(mustListSandboxes(ctx, t, st, store.Filter{})); !slices.Equal(got, []string{orig.ID}) {
				t.Errorf("after the failed create, ListSandboxes = %v, want [%s]", got, orig.ID)
			}
			checkSandbox(t, "the first sandbox", mustGetSandbox(ctx, t, st, orig.ID), orig)
		})
	}
}

// testSandboxIDBeatsName: a ref that is one sandbox's id and another's name
// finds the first, so an id always means the same sandbox. Both orders of
// creation, so that neither the table's order nor an index's decides.
func testSandboxIDBeatsName(ctx context.Context, t *testing.T, st store.Store) {
	for _, nameFirst := range []bool{false, true} {
		byID, byName := newSandbox(1), newSandbox(2)
		if nameFirst {
			byID, byName = newSandbox(4), newSandbox(3)
		}
		byName.Name = byID.ID
		if nameFirst {
			mustCreateSandbox(ctx, t, st, byName)
			mustCreateSandbox(ctx, t, st, byID)
		} else {
			mustCreateSandbox(ctx, t, st, byID)
			mustCreateSandbox(ctx, t, st, byName)
		}
		if got := mustGetSandbox(ctx, t, st, byID.ID); got.ID != byID.ID {
			t.Errorf("GetSandbox(%q) = %s, want %s (the id match)", byID.ID, got.ID, byID.ID)
		}
		if got := mustGetSandbox(ctx, t, st, byName.ID); got.ID != byName.ID {
			t.Errorf("GetSandbox(%q) = %s, want %s", byName.ID, got.ID, byName.ID)
		}
	}
}

// testSandboxRecordsAreCopies: neither the record given nor one returned
// shares memory with what the store keeps.
func testSandboxRecordsAreCopies(ctx context.Context, t *testing.T, st store.Store) {
	sb := newSandbox(1)
	sb.From = &api.ForkSource{Sandbox: "a", Checkpoint: "v1"}
	want := *sb
	want.Env, want.Labels = copyMap(sb.Env), copyMap(sb.Labels)
	want.From = &api.ForkSource{Sandbox: "a", Checkpoint: "v1"}
	mustCreateSandbox(ctx, t, st, sb)

	mutate := func(sb *store.Sandbox) {
		sb.Name, sb.State, sb.NetIndex = "changed", api.StateError, 1000
		sb.Env["PATH"], sb.Labels["team"] = "changed", "changed"
		sb.Labels["new"] = "label"
		sb.From.Checkpoint = "changed"
	}
	mutate(sb)
	checkSandbox(t, "after changing the created record", mustGetSandbox(ctx, t, st, want.ID), &want)

	mutate(mustGetSandbox(ctx, t, st, want.ID))
	checkSandbox(t, "after changing a got record", mustGetSandbox(ctx, t, st, want.ID), &want)

	mutate(mustListSandboxes(ctx, t, st, store.Filter{})[0])
	checkSandbox(t, "after changing a listed record", mustGetSandbox(ctx, t, st, want.ID), &want)
}

func testSandboxUpdate(ctx context.Context, t *testing.T, st store.Store) {
	sb := newSandbox(1)
	mustCreateSandbox(ctx, t, st, sb)
	other := newSandbox(2)
	mustCreateSandbox(ctx, t, st, other)
	cp := newCheckpoint(sb, "v1", "")
	mustCreateCheckpoint(ctx, t, st, cp)

	up := mustGetSandbox(ctx, t, st, sb.ID)
	oldName := up.Name
	up.Name = "renamed"
	up.State = api.StateSleeping
	up.Template, up.Image = "node", "docker.io/library/node:22"
	up.Resources = api.Resources{CPUs: 4, MemoryMiB: 8192}
	up.Env = map[string]string{"ONLY": "this"}
	up.Labels = nil
	up.Idle, up.HTTPPort, up.URL = "", 0, "https://renamed.loam.test"
	up.From = &api.ForkSource{Sandbox: "x", Checkpoint: "v9"}
	up.CreatedAt = t0.Add(-time.Hour)
	up.NetIndex, up.AgentGen, up.LegacyAgentToken, up.RestoreTarget = 77, 8, "legacy-token", "auto-3"
	up.CheckpointSeq, up.AutoSeq = 5, 3
	up.Error = "something"
	up.Public = true
	up.Pool = "checkpoint:x/v9"
	up.Node = "node-b"
	if err := st.UpdateSandbox(ctx, up); err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	checkSandbox(t, "by id", mustGetSandbox(ctx, t, st, sb.ID), up)
	checkSandbox(t, "by new name", mustGetSandbox(ctx, t, st, "renamed"), up)
	_, err := st.GetSandbox(ctx, "", oldName)
	wantErr(t, "GetSandbox(old name)", err, store.ErrNotFound)
	checkSandbox(t, "the other sandbox", mustGetSandbox(ctx, t, st, other.ID), other)
	checkCheckpoint(t, "its checkpoint", mustGetCheckpoint(ctx, t, st, sb.ID, "v1"), cp)

	// The old name is free again.
	reuse := newSandbox(3)
	reuse.Name = oldName
	mustCreateSandbox(ctx, t, st, reuse)
}

func testSandboxUpdateNameConflict(ctx context.Context, t *testing.T, st store.Store) {
	a, b := newSandbox(1), newSandbox(2)
	mustCreateSandbox(ctx, t, st, a)
	mustCreateSandbox(ctx, t, st, b)
	up := *a
	up.Name, up.State = b.Name, api.StateStopped
	wantErr(t, "UpdateSandbox to a taken name", st.UpdateSandbox(ctx, &up), store.ErrExists)
	checkSandbox(t, "a", mustGetSandbox(ctx, t, st, a.ID), a)
	checkSandbox(t, "b", mustGetSandbox(ctx, t, st, b.ID), b)
}

func testSandboxUpdateNotFound(ctx context.Context, t *testing.T, st store.Store) {
	a := newSandbox(1)
	mustCreateSandbox(ctx, t, st, a)
	ghost := newSandbox(2)
	wantErr(t, "UpdateSandbox(unknown id)", st.UpdateSandbox(ctx, ghost), store.ErrNotFound)
	// An update finds its record by id only, never by name.
	byName := newSandbox(3)
	byName.ID = a.Name
	byName.Name = a.Name
	wantErr(t, "UpdateSandbox(id that is a name)", st.UpdateSandbox(ctx, byName), store.ErrNotFound)
	if got := sandboxIDs(mustListSandboxes(ctx, t, st, store.Filter{})); !slices.Equal(got, []string{a.ID}) {
		t.Errorf("ListSandboxes = %v, want [%s]", got, a.ID)
	}
	checkSandbox(t, "a", mustGetSandbox(ctx, t, st, a.ID), a)
}

func testSandboxDelete(ctx context.Context, t *testing.T, st store.Store) {
	a, b := newSandbox(1), newSandbox(2)
	mustCreateSandbox(ctx, t, st, a)
	mustCreateSandbox(ctx, t, st, b)
	if err := st.DeleteSandbox(ctx, a.ID); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	for _, ref := range []string{a.ID, a.Name} {
		_, err := st.GetSandbox(ctx, "", ref)
		wantErr(t, "GetSandbox("+ref+") after delete", err, store.ErrNotFound)
	}
	wantErr(t, "DeleteSandbox again", st.DeleteSandbox(ctx, a.ID), store.ErrNotFound)
	wantErr(t, "DeleteSandbox(name)", st.DeleteSandbox(ctx, b.Name), store.ErrNotFound)
	wantErr(t, "UpdateSandbox after delete", st.UpdateSandbox(ctx, a), store.ErrNotFound)
	if got := sandboxIDs(mustListSandboxes(ctx, t, st, store.Filter{})); !slices.Equal(got, []string{b.ID}) {
		t.Errorf("ListSandboxes = %v, want [%s]", got, b.ID)
	}
	// Its id and name may be used again.
	mustCreateSandbox(ctx, t, st, newSandbox(1))
}

func testSandboxDeleteCascades(ctx context.Context, t *testing.T, st store.Store) {
	a, b := newSandbox(1), newSandbox(2)
	mustCreateSandbox(ctx, t, st, a)
	mustCreateSandbox(ctx, t, st, b)
	for _, id := range []string{"v1", "v2", "auto-1"} {
		mustCreateCheckpoint(ctx, t, st, newCheckpoint(a, id, "name-"+id))
	}
	keep := newCheckpoint(b, "v1", "name-v1")
	mustCreateCheckpoint(ctx, t, st, keep)

	if err := st.DeleteSandbox(ctx, a.ID); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	for _, ref := range []string{"v1", "v2", "auto-1", "name-v1"} {
		_, err := st.GetCheckpoint(ctx, a.ID, ref)
		wantErr(t, "GetCheckpoint("+ref+") of the deleted sandbox", err, store.ErrNotFound)
	}
	_, err := st.ListCheckpoints(ctx, a.ID)
	wantErr(t, "ListCheckpoints of the deleted sandbox", err, store.ErrNotFound)
	checkCheckpoint(t, "the other sandbox's checkpoint", mustGetCheckpoint(ctx, t, st, b.ID, "v1"), keep)

	// A new sandbox with the same id starts with no checkpoints.
	mustCreateSandbox(ctx, t, st, newSandbox(1))
	if got := mustListCheckpoints(ctx, t, st, a.ID); len(got) != 0 {
		t.Errorf("ListCheckpoints of a new sandbox with a deleted one's id = %v, want none", checkpointIDs(got))
	}
}

func testSandboxListOrder(ctx context.Context, t *testing.T, st store.Store) {
	// Created out of order; two share a creation time and go by id.
	at := func(n int, sec int, nsec int) *store.Sandbox {
		sb := newSandbox(n)
		sb.CreatedAt = t0.Add(time.Duration(sec)*time.Second + time.Duration(nsec))
		return sb
	}
	for _, sb := range []*store.Sandbox{
		at(5, 10, 0),
		at(1, 30, 0),
		at(4, 10, 1),
		at(3, 10, 0),
		at(2, -10, 0),
		at(6, 9, 999999999),
	} {
		mustCreateSandbox(ctx, t, st, sb)
	}
	want := []string{"sb-002", "sb-006", "sb-003", "sb-005", "sb-004", "sb-001"}
	if got := sandboxIDs(mustListSandboxes(ctx, t, st, store.Filter{})); !slices.Equal(got, want) {
		t.Errorf("ListSandboxes = %v, want %v", got, want)
	}
	// A change of creation time moves a sandbox in the list.
	up := mustGetSandbox(ctx, t, st, "sb-001")
	up.CreatedAt = t0.Add(-time.Hour)
	if err := st.UpdateSandbox(ctx, up); err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	want = []string{"sb-001", "sb-002", "sb-006", "sb-003", "sb-005", "sb-004"}
	if got := sandboxIDs(mustListSandboxes(ctx, t, st, store.Filter{})); !slices.Equal(got, want) {
		t.Errorf("ListSandboxes after update = %v, want %v", got, want)
	}
}

func testSandboxListLabels(ctx context.Context, t *testing.T, st store.Store) {
	labels := []map[string]string{
		1: {"team": "infra", "env": "prod"},
		2: {"team": "infra", "env": "dev"},
		3: {"team": "web", "env": "prod", "a.b": `q"v`},
		4: {"team": ""},
		5: nil,
		6: {"env": "prod"},
	}
	for n := 1; n < len(labels); n++ {
		sb := newSandbox(n)
		sb.Labels = labels[n]
		mustCreateSandbox(ctx, t, st, sb)
	}
	tests := []struct {
		name   string
		labels map[string]string
		want   []string
	}{
		{"no filter", nil, []string{"sb-001", "sb-002", "sb-003", "sb-004", "sb-005", "sb-006"}},
		{"empty filter", map[string]string{}, []string{"sb-001", "sb-002", "sb-003", "sb-004", "sb-005", "sb-006"}},
		{"one label", map[string]string{"team": "infra"}, []string{"sb-001", "sb-002"}},
		{"every label must match", map[string]string{"team": "infra", "env": "prod"}, []string{"sb-001"}},
		{"other key", map[string]string{"env": "prod"}, []string{"sb-001", "sb-003", "sb-006"}},
		{"empty value is a value", map[string]string{"team": ""}, []string{"sb-004"}},
		{"no such key", map[string]string{"owner": "me"}, nil},
		{"no such value", map[string]string{"team": "data"}, nil},
		{"value is exact", map[string]string{"team": "Infra"}, nil},
		{"odd key", map[string]string{"a.b": `q"v`}, []string{"sb-003"}},
		{"one of two misses", map[string]string{"team": "web", "env": "dev"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := sandboxIDs(mustListSandboxes(ctx, t, st, store.Filter{Labels: tc.labels}))
			if !slices.Equal(got, tc.want) {
				t.Errorf("ListSandboxes(%v) = %v, want %v", tc.labels, got, tc.want)
			}
		})
	}
}

func testUsedNetIndexes(ctx context.Context, t *testing.T, st store.Store) {
	for _, n := range []int{7, 3, 12, 1} {
		mustCreateSandbox(ctx, t, st, newSandbox(n))
	}
	up := mustGetSandbox(ctx, t, st, "sb-012")
	up.NetIndex = 40
	if err := st.UpdateSandbox(ctx, up); err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	if err := st.DeleteSandbox(ctx, "sb-003"); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	got, err := st.UsedNetIndexes(ctx, "")
	if err != nil {
		t.Fatalf("UsedNetIndexes: %v", err)
	}
	slices.Sort(got)
	if want := []int{1, 7, 40}; !slices.Equal(got, want) {
		t.Errorf("UsedNetIndexes = %v, want %v in any order", got, want)
	}
}

// testByNode: a node lists, and counts addresses of, its own sandboxes
// alone; "" is every node's.
func testByNode(ctx context.Context, t *testing.T, st store.Store) {
	for _, n := range []int{1, 2, 3} {
		mustCreateSandbox(ctx, t, st, newSandbox(n))
	}
	// Handed over, as a move would: the node's own store writes it.
	moved := mustGetSandbox(ctx, t, st, "sb-002")
	moved.Node = "node-b"
	if err := st.UpdateSandbox(ctx, moved); err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	for _, c := range []struct {
		node string
		ids  []string
		nets []int
	}{
		{"", []string{"sb-001", "sb-002", "sb-003"}, []int{1, 2, 3}},
		{"node-a", []string{"sb-001", "sb-003"}, []int{1, 3}},
		{"node-b", []string{"sb-002"}, []int{2}},
		{"node-c", nil, nil},
	} {
		sbs, err := st.ListSandboxes(ctx, store.Filter{Node: c.node})
		if err != nil {
			t.Fatalf("ListSandboxes(node %q): %v", c.node, err)
		}
		var ids []string
		for _, sb := range sbs {
			ids = append(ids, sb.ID)
		}
		if !slices.Equal(ids, c.ids) {
			t.Errorf("ListSandboxes(node %q) = %v, want %v", c.node, ids, c.ids)
		}
		nets, err := st.UsedNetIndexes(ctx, c.node)
		if err != nil {
			t.Fatalf("UsedNetIndexes(%q): %v", c.node, err)
		}
		if len(nets) != len(c.nets) || (len(nets) > 0 && !slices.Equal(nets, c.nets)) {
			t.Errorf("UsedNetIndexes(%q) = %v, want %v", c.node, nets, c.nets)
		}
	}
}

// testCreatedAtExact: times come back as the same instant, to the
// nanosecond, in UTC, whatever zone they went in with.
func testCreatedAtExact(ctx context.Context, t *testing.T, st store.Store) {
	india := time.FixedZone("IST", 5*3600+1800)
	tests := []struct {
		name string
		at   time.Time
	}{
		{"nanoseconds", t0},
		{"one nanosecond", time.Date(2030, 1, 1, 0, 0, 0, 1, time.UTC)},
		{"whole second", time.Date(2024, 2, 29, 23, 59, 59, 0, time.UTC)},
		{"other zone", time.Date(2025, 6, 1, 3, 4, 5, 600700800, india)},
		{"local zone", time.Date(2025, 6, 1, 3, 4, 5, 999999999, time.Local)},
		{"from the clock", store.Now()},
		{"zero", time.Time{}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sb := newSandbox(i)
			sb.CreatedAt = tc.at
			mustCreateSandbox(ctx, t, st, sb)
			checkTime(t, "sandbox created_at", mustGetSandbox(ctx, t, st, sb.ID).CreatedAt, tc.at)

			cp := newCheckpoint(sb, "v1", "")
			cp.CreatedAt = tc.at
			mustCreateCheckpoint(ctx, t, st, cp)
			checkTime(t, "checkpoint created_at", mustGetCheckpoint(ctx, t, st, sb.ID, "v1").CreatedAt, tc.at)
			checkTime(t, "listed checkpoint created_at", mustListCheckpoints(ctx, t, st, sb.ID)[0].CreatedAt, tc.at)
		})
	}
}

// testSandboxOrgs: a name is unique within an org, not across orgs; a
// lookup in one org never finds another's sandbox, by name or by id; a
// lookup in no org finds any by id.
func testSandboxOrgs(ctx context.Context, t *testing.T, st store.Store) {
	a, b, c := newSandbox(1), newSandbox(2), newSandbox(3)
	a.Org, b.Org, c.Org = "docs", "ops", "docs"
	b.Name = a.Name
	mustCreateSandbox(ctx, t, st, a)
	mustCreateSandbox(ctx, t, st, b)
	for _, tc := range []struct {
		org, ref string
		want     *store.Sandbox
	}{
		{"docs", a.Name, a}, {"ops", a.Name, b}, {"docs", a.ID, a}, {"ops", b.ID, b},
		{"docs", b.ID, nil}, {"ops", a.ID, nil}, {"other", a.Name, nil},
		{"", a.ID, a}, {"", b.ID, b},
	} {
		got, err := st.GetSandbox(ctx, tc.org, tc.ref)
		if tc.want == nil {
			wantErr(t, fmt.Sprintf("GetSandbox(%q, %q)", tc.org, tc.ref), err, store.ErrNotFound)
			continue
		}
		if err != nil {
			t.Errorf("GetSandbox(%q, %q): %v", tc.org, tc.ref, err)
			continue
		}
		checkSandbox(t, fmt.Sprintf("GetSandbox(%q, %q)", tc.org, tc.ref), got, tc.want)
	}
	taken := *c
	taken.Name = a.Name
	wantErr(t, "CreateSandbox with a name taken in its org", st.CreateSandbox(ctx, &taken), store.ErrExists)
	mustCreateSandbox(ctx, t, st, c)
	up := *c
	up.Name = a.Name
	wantErr(t, "UpdateSandbox to a name taken in its org", st.UpdateSandbox(ctx, &up), store.ErrExists)
	if got := sandboxIDs(mustListSandboxes(ctx, t, st, store.Filter{Org: "docs"})); !slices.Equal(got, []string{a.ID, c.ID}) {
		t.Errorf("ListSandboxes(org docs) = %v, want %v", got, []string{a.ID, c.ID})
	}
	if got := sandboxIDs(mustListSandboxes(ctx, t, st, store.Filter{Org: "ops", Labels: map[string]string{"n": "2"}})); !slices.Equal(got, []string{b.ID}) {
		t.Errorf("ListSandboxes(org ops, n=2) = %v, want %v", got, []string{b.ID})
	}
	if got := mustListSandboxes(ctx, t, st, store.Filter{Org: "ops", Labels: map[string]string{"n": "1"}}); len(got) != 0 {
		t.Errorf("ListSandboxes(org ops, n=1) = %v, want none", sandboxIDs(got))
	}
}
