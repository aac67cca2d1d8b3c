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

// Audit is what a store that keeps the audit log has (store/sqlite does):
// a store.AuditWriter that lists and prunes its records too.
type Audit interface {
	store.AuditWriter
	ListAudit(ctx context.Context, f store.AuditFilter) ([]api.AuditEvent, error)
	PruneAudit(ctx context.Context, before time.Time) (int64, error)
}

// RunAudit runs the suite of the audit log's own methods; newStore must
// return a new, empty store, which RunAudit closes.
func RunAudit(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(ctx context.Context, t *testing.T, log Audit)
	}{
		{"Empty", testAuditEmpty},
		{"AppendList", testAuditAppendList},
		{"SetOutcome", testAuditSetOutcome},
		{"Filters", testAuditFilters},
		{"Pages", testAuditPages},
		{"Prune", testAuditPrune},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log := openAs[Audit](t, newStore, "audit log")
			tc.fn(t.Context(), t, log)
		})
	}
}

// newEvent is a record with every field set, distinct for each n, at t0
// plus n seconds; the store gives its seq.
func newEvent(n int, org, action string) api.AuditEvent {
	return api.AuditEvent{
		Time:    t0.Add(time.Duration(n) * time.Second),
		Org:     org,
		Key:     fmt.Sprintf("k-%d", n),
		Action:  action,
		Target:  fmt.Sprintf("sandboxes/box-%d", n),
		Outcome: "ok",
		Client:  fmt.Sprintf("192.0.2.%d:41000", n),
	}
}

func mustAppendAudit(ctx context.Context, t *testing.T, log Audit, ev api.AuditEvent) {
	t.Helper()
	if err := log.AppendAudit(ctx, ev); err != nil {
		t.Fatalf("AppendAudit(%s): %v", ev.Action, err)
	}
}

func mustListAudit(ctx context.Context, t *testing.T, log Audit, f store.AuditFilter) []api.AuditEvent {
	t.Helper()
	list, err := log.ListAudit(ctx, f)
	if err != nil {
		t.Fatalf("ListAudit(%+v): %v", f, err)
	}
	return list
}

// auditKeys lists the Key of each record of list, in its order: the suite
// gives each record a key of its own.
func auditKeys(list []api.AuditEvent) []string {
	keys := []string{}
	for _, ev := range list {
		keys = append(keys, ev.Key)
	}
	return keys
}

func testAuditEmpty(ctx context.Context, t *testing.T, log Audit) {
	list := mustListAudit(ctx, t, log, store.AuditFilter{})
	if list == nil || len(list) != 0 {
		t.Errorf("ListAudit of a new store: %+v (nil %v); want an empty list, which the API shows as []", list, list == nil)
	}
	if n, err := log.PruneAudit(ctx, t0); err != nil || n != 0 {
		t.Errorf("PruneAudit of a new store: %d, %v; want 0", n, err)
	}
}

// testAuditAppendList: records come back as they were written, oldest
// first, each with a seq above the one before.
func testAuditAppendList(ctx context.Context, t *testing.T, log Audit) {
	want := []api.AuditEvent{
		newEvent(1, "docs", "sandbox.create"),
		newEvent(2, "ops", "secret.put"),
		newEvent(3, "docs", "key.create"),
	}
	want[1].Outcome, want[1].Client = "forbidden", ""
	// A time not in UTC comes back as the same instant in UTC.
	want[2].Time = want[2].Time.In(time.FixedZone("CET", 3600))
	for _, ev := range want {
		mustAppendAudit(ctx, t, log, ev)
	}
	got := mustListAudit(ctx, t, log, store.AuditFilter{})
	if len(got) != len(want) {
		t.Fatalf("ListAudit = %+v, want %d records", got, len(want))
	}
	var last int64
	for i, ev := range got {
		if ev.Seq <= last {
			t.Errorf("record %d: seq %d after %d; want each above the one before", i, ev.Seq, last)
		}
		last = ev.Seq
		checkTime(t, fmt.Sprintf("record %d: time", i), ev.Time, want[i].Time)
		g, w := ev, want[i]
		g.Seq, g.Time, w.Time = 0, time.Time{}, time.Time{}
		if g != w {
			t.Errorf("record %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
}

// testAuditSetOutcome: SetAuditOutcome changes its record's outcome
// alone; a seq no record has is no error and changes nothing.
func testAuditSetOutcome(ctx context.Context, t *testing.T, log Audit) {
	for n := range 3 {
		mustAppendAudit(ctx, t, log, newEvent(n, "docs", "sandbox.create"))
	}
	list := mustListAudit(ctx, t, log, store.AuditFilter{})
	if err := log.SetAuditOutcome(ctx, list[1].Seq, "internal"); err != nil {
		t.Fatalf("SetAuditOutcome: %v", err)
	}
	if err := log.SetAuditOutcome(ctx, list[2].Seq+100, "internal"); err != nil {
		t.Errorf("SetAuditOutcome of a seq no record has: %v, want no error", err)
	}
	got := mustListAudit(ctx, t, log, store.AuditFilter{})
	var outcomes []string
	for _, ev := range got {
		outcomes = append(outcomes, ev.Outcome)
	}
	if !slices.Equal(outcomes, []string{"ok", "internal", "ok"}) {
		t.Errorf("outcomes = %v, want [ok internal ok]", outcomes)
	}
	if got[1].Seq != list[1].Seq || got[1].Key != list[1].Key {
		t.Errorf("the record set: %+v, was %+v; want only its outcome changed", got[1], list[1])
	}
}

// auditFixture writes the records testAuditFilters and testAuditPages
// select from, k-0 to k-5, in that order (their seqs). k-4's time is an
// hour before the others (a call that began long before it wrote), so a
// store that ordered by time rather than seq would show it.
func auditFixture(ctx context.Context, t *testing.T, log Audit) (seqs []int64) {
	t.Helper()
	evs := []api.AuditEvent{
		newEvent(0, "docs", "sandbox.create"),
		newEvent(1, "ops", "sandbox.create"),
		newEvent(2, "docs", "secret.put"),
		newEvent(3, "docs", "sandbox.create"),
		newEvent(4, "ops", "secret.put"),
		newEvent(5, "docs", "sandbox.create"),
	}
	evs[4].Time = t0.Add(-time.Hour)
	for _, ev := range evs {
		mustAppendAudit(ctx, t, log, ev)
	}
	for _, ev := range mustListAudit(ctx, t, log, store.AuditFilter{}) {
		seqs = append(seqs, ev.Seq)
	}
	if len(seqs) != len(evs) {
		t.Fatalf("ListAudit of the fixture: %d records, want %d", len(seqs), len(evs))
	}
	return seqs
}

func testAuditFilters(ctx context.Context, t *testing.T, log Audit) {
	seqs := auditFixture(ctx, t, log)
	keys := func(ns ...int) []string {
		out := []string{}
		for _, n := range ns {
			out = append(out, fmt.Sprintf("k-%d", n))
		}
		return out
	}
	tests := []struct {
		what string
		f    store.AuditFilter
		want []string
	}{
		{"no filter: every record, by seq", store.AuditFilter{}, keys(0, 1, 2, 3, 4, 5)},
		{"an org", store.AuditFilter{Org: "docs"}, keys(0, 2, 3, 5)},
		{"an org without records", store.AuditFilter{Org: "none"}, keys()},
		{"an action", store.AuditFilter{Action: "secret.put"}, keys(2, 4)},
		{"an org and an action", store.AuditFilter{Org: "docs", Action: "sandbox.create"}, keys(0, 3, 5)},
		{"since: at or after", store.AuditFilter{Since: t0.Add(2 * time.Second)}, keys(2, 3, 5)},
		{"since, a nanosecond later", store.AuditFilter{Since: t0.Add(2*time.Second + 1)}, keys(3, 5)},
		{"since, in another zone", store.AuditFilter{Since: t0.Add(2 * time.Second).In(time.FixedZone("EST", -5*3600))}, keys(2, 3, 5)},
		{"since_seq: after", store.AuditFilter{SinceSeq: seqs[2]}, keys(3, 4, 5)},
		{"since_seq of the last", store.AuditFilter{SinceSeq: seqs[5]}, keys()},
		{"since_seq below every seq", store.AuditFilter{SinceSeq: -1}, keys(0, 1, 2, 3, 4, 5)},
		{"a limit: the oldest", store.AuditFilter{Limit: 2}, keys(0, 1)},
		{"a limit above the count", store.AuditFilter{Limit: 100}, keys(0, 1, 2, 3, 4, 5)},
		{"an org, since_seq and a limit", store.AuditFilter{Org: "docs", SinceSeq: seqs[0], Limit: 2}, keys(2, 3)},
		{"since and since_seq", store.AuditFilter{Since: t0.Add(time.Second), SinceSeq: seqs[2]}, keys(3, 5)},
		{"everything", store.AuditFilter{Org: "ops", Action: "secret.put", Since: t0.Add(-2 * time.Hour), SinceSeq: seqs[1], Limit: 1}, keys(4)},
	}
	for _, tc := range tests {
		got := mustListAudit(ctx, t, log, tc.f)
		if g := auditKeys(got); !slices.Equal(g, tc.want) {
			t.Errorf("%s (%+v): %v, want %v", tc.what, tc.f, g, tc.want)
		}
		if got == nil {
			t.Errorf("%s: a nil list, want an empty one", tc.what)
		}
	}
}

// testAuditPages: a client that pages with since_seq (the last seq it
// has) and a limit reads every record once, in order.
func testAuditPages(ctx context.Context, t *testing.T, log Audit) {
	seqs := auditFixture(ctx, t, log)
	var got []int64
	var pages int
	for f := (store.AuditFilter{Limit: 4}); ; pages++ {
		page := mustListAudit(ctx, t, log, f)
		if len(page) == 0 {
			break
		}
		if pages > len(seqs) {
			t.Fatal("paging does not end")
		}
		for _, ev := range page {
			got = append(got, ev.Seq)
		}
		f.SinceSeq = page[len(page)-1].Seq
	}
	if !slices.Equal(got, seqs) || pages != 2 {
		t.Errorf("paged by 4: seqs %v in %d pages, want %v in 2", got, pages, seqs)
	}
}

// testAuditPrune: PruneAudit deletes the records older than its time (not
// those at it) and counts them; the others stay, in order.
func testAuditPrune(ctx context.Context, t *testing.T, log Audit) {
	seqs := auditFixture(ctx, t, log)
	n, err := log.PruneAudit(ctx, t0.Add(2*time.Second))
	if err != nil || n != 3 {
		t.Errorf("PruneAudit: %d, %v; want 3 (k-0, k-1 and k-4)", n, err)
	}
	if got := auditKeys(mustListAudit(ctx, t, log, store.AuditFilter{})); !slices.Equal(got, []string{"k-2", "k-3", "k-5"}) {
		t.Errorf("after PruneAudit: %v, want [k-2 k-3 k-5]", got)
	}
	if n, err := log.PruneAudit(ctx, t0.Add(2*time.Second)); err != nil || n != 0 {
		t.Errorf("PruneAudit again: %d, %v; want 0", n, err)
	}
	// A new record takes a seq above every pruned one.
	mustAppendAudit(ctx, t, log, newEvent(9, "docs", "sandbox.create"))
	if got := mustListAudit(ctx, t, log, store.AuditFilter{SinceSeq: seqs[5]}); len(got) != 1 || got[0].Key != "k-9" {
		t.Errorf("a record after the prune: %+v; want k-9 after seq %d", got, seqs[5])
	}
	if n, err := log.PruneAudit(ctx, t0.Add(time.Hour)); err != nil || n != 4 {
		t.Errorf("PruneAudit of every record: %d, %v; want 4", n, err)
	}
	if got := mustListAudit(ctx, t, log, store.AuditFilter{}); len(got) != 0 {
		t.Errorf("after pruning all: %v, want none", auditKeys(got))
	}
}
