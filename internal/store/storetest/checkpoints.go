package storetest

import (
	"context"
	"slices"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

func testCheckpointCreateGet(ctx context.Context, t *testing.T, st store.Store) {
	sb := newSandbox(1)
	mustCreateSandbox(ctx, t, st, sb)
	named := newCheckpoint(sb, "v1", "before-upgrade")
	unnamed := newCheckpoint(sb, "v2", "")
	unnamed.Memory, unnamed.Comment = false, ""
	unnamed.Resources = api.Resources{}
	auto := newCheckpoint(sb, "auto-1", "")
	for _, cp := range []*store.Checkpoint{named, unnamed, auto} {
		mustCreateCheckpoint(ctx, t, st, cp)
	}
	checkCheckpoint(t, "v1 by id", mustGetCheckpoint(ctx, t, st, sb.ID, "v1"), named)
	checkCheckpoint(t, "v1 by name", mustGetCheckpoint(ctx, t, st, sb.ID, "before-upgrade"), named)
	checkCheckpoint(t, "v2 by id", mustGetCheckpoint(ctx, t, st, sb.ID, "v2"), unnamed)
	checkCheckpoint(t, "auto-1 by id", mustGetCheckpoint(ctx, t, st, sb.ID, "auto-1"), auto)
	list := mustListCheckpoints(ctx, t, st, sb.ID)
	if len(list) != 3 {
		t.Fatalf("ListCheckpoints = %v, want [v1 v2 auto-1]", checkpointIDs(list))
	}
	for i, want := range []*store.Checkpoint{named, unnamed, auto} {
		checkCheckpoint(t, "listed "+want.ID, list[i], want)
	}
}

func testCheckpointGetNotFound(ctx context.Context, t *testing.T, st store.Store) {
	a, b := newSandbox(1), newSandbox(2)
	mustCreateSandbox(ctx, t, st, a)
	mustCreateSandbox(ctx, t, st, b)
	mustCreateCheckpoint(ctx, t, st, newCheckpoint(a, "v1", "named"))
	mustCreateCheckpoint(ctx, t, st, newCheckpoint(a, "v2", ""))
	tests := []struct{ name, sandbox, ref string }{
		{"unknown id", a.ID, "v3"},
		{"empty ref with unnamed checkpoints", a.ID, ""},
		{"other sandbox's checkpoint by id", b.ID, "v1"},
		{"other sandbox's checkpoint by name", b.ID, "named"},
		{"unknown sandbox", "sb-999", "v1"},
		{"sandbox by name instead of id", a.Name, "v1"},
		{"pattern", a.ID, "v%"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := st.GetCheckpoint(ctx, tc.sandbox, tc.ref)
			wantErr(t, "GetCheckpoint("+tc.sandbox+", "+tc.ref+")", err, store.ErrNotFound)
		})
	}
}

func testCheckpointConflict(ctx context.Context, t *testing.T, st store.Store) {
	a, b := newSandbox(1), newSandbox(2)
	mustCreateSandbox(ctx, t, st, a)
	mustCreateSandbox(ctx, t, st, b)
	first := newCheckpoint(a, "v1", "stable")
	mustCreateCheckpoint(ctx, t, st, first)

	tests := []struct {
		name string
		cp   *store.Checkpoint
		want error // nil: the create succeeds
	}{
		{"same id", newCheckpoint(a, "v1", "other-name"), store.ErrExists},
		{"same id unnamed", newCheckpoint(a, "v1", ""), store.ErrExists},
		{"same name", newCheckpoint(a, "v9", "stable"), store.ErrExists},
		{"unnamed", newCheckpoint(a, "v2", ""), nil},
		{"another unnamed", newCheckpoint(a, "v3", ""), nil},
		{"same id in another sandbox", newCheckpoint(b, "v1", ""), nil},
		{"same name in another sandbox", newCheckpoint(b, "v2", "stable"), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := st.CreateCheckpoint(ctx, tc.cp)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("CreateCheckpoint(%s, %s named %q): %v", tc.cp.Sandbox, tc.cp.ID, tc.cp.Name, err)
				}
				checkCheckpoint(t, "new checkpoint", mustGetCheckpoint(ctx, t, st, tc.cp.Sandbox, tc.cp.ID), tc.cp)
				return
			}
			wantErr(t, "CreateCheckpoint", err, tc.want)
		})
	}
	checkCheckpoint(t, "the first checkpoint by id", mustGetCheckpoint(ctx, t, st, a.ID, "v1"), first)
	checkCheckpoint(t, "the first checkpoint by name", mustGetCheckpoint(ctx, t, st, a.ID, "stable"), first)
	if got, want := checkpointIDs(mustListCheckpoints(ctx, t, st, a.ID)), []string{"v1", "v2", "v3"}; !slices.Equal(got, want) {
		t.Errorf("ListCheckpoints(a) = %v, want %v", got, want)
	}
	if got, want := checkpointIDs(mustListCheckpoints(ctx, t, st, b.ID)), []string{"v1", "v2"}; !slices.Equal(got, want) {
		t.Errorf("ListCheckpoints(b) = %v, want %v", got, want)
	}
}

// testCheckpointUnknownSandbox: a checkpoint needs its sandbox, and the
// sandbox is named by id, so a name passed for an id is caught.
func testCheckpointUnknownSandbox(ctx context.Context, t *testing.T, st store.Store) {
	sb := newSandbox(1)
	mustCreateSandbox(ctx, t, st, sb)
	for _, ref := range []string{"sb-999", sb.Name, ""} {
		ghost := newCheckpoint(sb, "v1", "")
		ghost.Sandbox = ref
		wantErr(t, "CreateCheckpoint in sandbox "+ref, st.CreateCheckpoint(ctx, ghost), store.ErrNotFound)
		_, err := st.ListCheckpoints(ctx, ref)
		wantErr(t, "ListCheckpoints("+ref+")", err, store.ErrNotFound)
		wantErr(t, "DeleteCheckpoint("+ref+", v1)", st.DeleteCheckpoint(ctx, ref, "v1"), store.ErrNotFound)
	}
}

// testCheckpointIDBeatsName is testSandboxIDBeatsName for checkpoints.
func testCheckpointIDBeatsName(ctx context.Context, t *testing.T, st store.Store) {
	a, b := newSandbox(1), newSandbox(2)
	mustCreateSandbox(ctx, t, st, a)
	mustCreateSandbox(ctx, t, st, b)
	mustCreateCheckpoint(ctx, t, st, newCheckpoint(a, "v1", ""))
	mustCreateCheckpoint(ctx, t, st, newCheckpoint(a, "v2", "v1"))
	mustCreateCheckpoint(ctx, t, st, newCheckpoint(b, "v2", "v1"))
	mustCreateCheckpoint(ctx, t, st, newCheckpoint(b, "v1", ""))
	for _, sb := range []*store.Sandbox{a, b} {
		if got := mustGetCheckpoint(ctx, t, st, sb.ID, "v1"); got.ID != "v1" {
			t.Errorf("GetCheckpoint(%s, v1) = %s, want v1 (the id match)", sb.ID, got.ID)
		}
	}
}

func testCheckpointRecordsAreCopies(ctx context.Context, t *testing.T, st store.Store) {
	sb := newSandbox(1)
	mustCreateSandbox(ctx, t, st, sb)
	cp := newCheckpoint(sb, "v1", "n")
	want := *cp
	mustCreateCheckpoint(ctx, t, st, cp)

	mutate := func(cp *store.Checkpoint) {
		cp.Name, cp.Comment, cp.AgentGen, cp.Inside = "changed", "changed", 99, !cp.Inside
		cp.Resources.CPUs = 64
	}
	mutate(cp)
	checkCheckpoint(t, "after changing the created record", mustGetCheckpoint(ctx, t, st, sb.ID, "v1"), &want)
	mutate(mustGetCheckpoint(ctx, t, st, sb.ID, "v1"))
	checkCheckpoint(t, "after changing a got record", mustGetCheckpoint(ctx, t, st, sb.ID, "v1"), &want)
	mutate(mustListCheckpoints(ctx, t, st, sb.ID)[0])
	checkCheckpoint(t, "after changing a listed record", mustGetCheckpoint(ctx, t, st, sb.ID, "v1"), &want)
}

// testCheckpointListOrder: checkpoints list in the order they were made,
// even when they share a creation time and their ids sort otherwise.
func testCheckpointListOrder(ctx context.Context, t *testing.T, st store.Store) {
	a, b := newSandbox(1), newSandbox(2)
	mustCreateSandbox(ctx, t, st, a)
	mustCreateSandbox(ctx, t, st, b)
	if got := mustListCheckpoints(ctx, t, st, a.ID); len(got) != 0 {
		t.Errorf("ListCheckpoints with none = %v, want none", checkpointIDs(got))
	}
	want := []string{"v9", "v10", "auto-1", "v11", "v2", "auto-10", "v1"}
	for i, id := range want {
		mustCreateCheckpoint(ctx, t, st, newCheckpoint(a, id, "")) // all at the same instant
		if i%2 == 0 {
			mustCreateCheckpoint(ctx, t, st, newCheckpoint(b, id, ""))
		}
	}
	if got := checkpointIDs(mustListCheckpoints(ctx, t, st, a.ID)); !slices.Equal(got, want) {
		t.Errorf("ListCheckpoints = %v, want %v", got, want)
	}
	// Deleting one keeps the others' order, and a new one comes last even
	// if it reuses a deleted id.
	if err := st.DeleteCheckpoint(ctx, a.ID, "auto-1"); err != nil {
		t.Fatalf("DeleteCheckpoint: %v", err)
	}
	if err := st.DeleteCheckpoint(ctx, a.ID, "v1"); err != nil {
		t.Fatalf("DeleteCheckpoint: %v", err)
	}
	mustCreateCheckpoint(ctx, t, st, newCheckpoint(a, "auto-1", ""))
	want = []string{"v9", "v10", "v11", "v2", "auto-10", "auto-1"}
	if got := checkpointIDs(mustListCheckpoints(ctx, t, st, a.ID)); !slices.Equal(got, want) {
		t.Errorf("ListCheckpoints after delete and create = %v, want %v", got, want)
	}
	if got, want := checkpointIDs(mustListCheckpoints(ctx, t, st, b.ID)), []string{"v9", "auto-1", "v2", "v1"}; !slices.Equal(got, want) {
		t.Errorf("ListCheckpoints of the other sandbox = %v, want %v", got, want)
	}
}

func testCheckpointDelete(ctx context.Context, t *testing.T, st store.Store) {
	a, b := newSandbox(1), newSandbox(2)
	mustCreateSandbox(ctx, t, st, a)
	mustCreateSandbox(ctx, t, st, b)
	v1 := newCheckpoint(a, "v1", "named")
	mustCreateCheckpoint(ctx, t, st, v1)
	v2 := newCheckpoint(a, "v2", "")
	mustCreateCheckpoint(ctx, t, st, v2)
	other := newCheckpoint(b, "v1", "named")
	mustCreateCheckpoint(ctx, t, st, other)

	wantErr(t, "DeleteCheckpoint by name", st.DeleteCheckpoint(ctx, a.ID, "named"), store.ErrNotFound)
	wantErr(t, "DeleteCheckpoint of unknown id", st.DeleteCheckpoint(ctx, a.ID, "v3"), store.ErrNotFound)
	wantErr(t, "DeleteCheckpoint with sandbox name", st.DeleteCheckpoint(ctx, a.Name, "v1"), store.ErrNotFound)

	if err := st.DeleteCheckpoint(ctx, a.ID, "v1"); err != nil {
		t.Fatalf("DeleteCheckpoint: %v", err)
	}
	for _, ref := range []string{"v1", "named"} {
		_, err := st.GetCheckpoint(ctx, a.ID, ref)
		wantErr(t, "GetCheckpoint("+ref+") after delete", err, store.ErrNotFound)
	}
	wantErr(t, "DeleteCheckpoint again", st.DeleteCheckpoint(ctx, a.ID, "v1"), store.ErrNotFound)
	if got := checkpointIDs(mustListCheckpoints(ctx, t, st, a.ID)); !slices.Equal(got, []string{"v2"}) {
		t.Errorf("ListCheckpoints after delete = %v, want [v2]", got)
	}
	checkCheckpoint(t, "the same id in another sandbox", mustGetCheckpoint(ctx, t, st, b.ID, "v1"), other)
	checkSandbox(t, "the sandbox", mustGetSandbox(ctx, t, st, a.ID), a)

	// The name is free again.
	mustCreateCheckpoint(ctx, t, st, newCheckpoint(a, "v3", "named"))
}

// testCheckpointFields: the fields added by later schema versions (token
// generation, legacy token, origin) come back as written.
func testCheckpointFields(ctx context.Context, t *testing.T, st store.Store) {
	sb := newSandbox(1)
	mustCreateSandbox(ctx, t, st, sb)
	for i, cp := range []*store.Checkpoint{newCheckpoint(sb, "v1", ""), newCheckpoint(sb, "v2", "")} {
		cp.AgentGen, cp.Inside, cp.LegacyAgentToken = i+3, i == 1, ""
		mustCreateCheckpoint(ctx, t, st, cp)
		checkCheckpoint(t, cp.ID, mustGetCheckpoint(ctx, t, st, sb.ID, cp.ID), cp)
	}
}
