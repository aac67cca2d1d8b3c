package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// ConsoleSessions is what a store that keeps web console sessions has
// (store/sqlite does; internal/console's SessionStore).
type ConsoleSessions interface {
	PutConsoleSession(ctx context.Context, cs *store.ConsoleSession) error
	GetConsoleSession(ctx context.Context, key string, now time.Time) (*store.ConsoleSession, error)
	ListConsoleSessions(ctx context.Context, now time.Time) ([]*store.ConsoleSession, error)
	DeleteConsoleSessions(ctx context.Context, now time.Time, keys ...string) error
}

// RunConsoleSessions runs the suite of console sessions; newStore must
// return a new, empty store that is also an Audit, which
// RunConsoleSessions closes. With WithReopen it checks that sessions
// outlive a Close too.
func RunConsoleSessions(t *testing.T, newStore func(t *testing.T) store.Store, opts ...Option) {
	c := &config{newStore: newStore}
	for _, o := range opts {
		o(c)
	}
	tests := []struct {
		name string
		fn   func(ctx context.Context, t *testing.T, c *config)
	}{
		{"KeptListedDeleted", testConsoleKept},
		{"Fields", testConsoleFields},
		{"Get", testConsoleGet},
		{"Expiry", testConsoleExpiry},
		{"TiesByKey", testConsoleTies},
		{"Audited", testConsoleAudited},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t.Context(), t, c) })
	}
}

// consoleStore is st as the ConsoleSessions it must be.
func consoleStore(t *testing.T, st store.Store) ConsoleSessions {
	t.Helper()
	cs, ok := st.(ConsoleSessions)
	if !ok {
		t.Fatal("the store keeps no console sessions")
	}
	return cs
}

// consoleNow is the now of the console tests.
var consoleNow = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

func mustPutConsoleSession(ctx context.Context, t *testing.T, st ConsoleSessions, cs *store.ConsoleSession) {
	t.Helper()
	if err := st.PutConsoleSession(ctx, cs); err != nil {
		t.Fatalf("PutConsoleSession(%s): %v", cs.Key, err)
	}
}

// listConsole lists the sessions of st at now as key=csrf@expiry after
// consoleNow, in the list's order.
func listConsole(ctx context.Context, t *testing.T, st ConsoleSessions, now time.Time) string {
	t.Helper()
	got, err := st.ListConsoleSessions(ctx, now)
	if err != nil {
		t.Fatalf("ListConsoleSessions: %v", err)
	}
	var b strings.Builder
	for _, cs := range got {
		b.WriteString(cs.Key + "=" + cs.CSRFToken + "@" + cs.ExpiresAt.Sub(consoleNow).String() + " ")
	}
	return b.String()
}

// testConsoleKept: sessions are kept (across a reopen, with WithReopen),
// listed while they last, those that end first first, replaced by key,
// and deleted by key or once expired.
func testConsoleKept(ctx context.Context, t *testing.T, c *config) {
	st := c.newStore(t)
	closed := false
	t.Cleanup(func() {
		if !closed {
			if err := st.Close(); err != nil {
				t.Errorf("closing store: %v", err)
			}
		}
	})
	cs := consoleStore(t, st)
	now := consoleNow
	for _, s := range []*store.ConsoleSession{
		{Key: "a", CSRFToken: "ca", ExpiresAt: now.Add(2 * time.Hour)},
		{Key: "b", CSRFToken: "cb", ExpiresAt: now.Add(time.Hour)},
		{Key: "old", CSRFToken: "co", ExpiresAt: now.Add(-time.Minute)},
		{Key: "a", CSRFToken: "ca2", ExpiresAt: now.Add(3 * time.Hour)},
	} {
		mustPutConsoleSession(ctx, t, cs, s)
	}
	if c.reopen != nil {
		closed = true
		if err := st.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		st = c.reopen(t, st)
		t.Cleanup(func() {
			if err := st.Close(); err != nil {
				t.Errorf("closing reopened store: %v", err)
			}
		})
		cs = consoleStore(t, st)
	}
	if got := listConsole(ctx, t, cs, now); got != "b=cb@1h0m0s a=ca2@3h0m0s " {
		t.Errorf("the sessions kept: %q", got)
	}
	// An hour before, old had not expired: it is there until a delete.
	if got := listConsole(ctx, t, cs, now.Add(-time.Hour)); got != "old=co@-1m0s b=cb@1h0m0s a=ca2@3h0m0s " {
		t.Errorf("an hour before: %q", got)
	}
	if err := cs.DeleteConsoleSessions(ctx, now, "b", "nope"); err != nil {
		t.Fatalf("DeleteConsoleSessions of b and a key not there: %v", err)
	}
	if got := listConsole(ctx, t, cs, now); got != "a=ca2@3h0m0s " {
		t.Errorf("after deleting b: %q", got)
	}
	// The delete at now also deleted old, expired then: listed as of
	// before it expired, it is not there.
	if got := listConsole(ctx, t, cs, now.Add(-time.Hour)); got != "a=ca2@3h0m0s " {
		t.Errorf("after a delete that also prunes, an hour before: %q; want old gone", got)
	}
	if err := cs.DeleteConsoleSessions(ctx, now.Add(4*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := listConsole(ctx, t, cs, now); got != "" {
		t.Errorf("after everything expired: %q", got)
	}
}

// testConsoleFields: every field comes back as it was put, the expiry
// the same instant in UTC; a replace replaces every field.
func testConsoleFields(ctx context.Context, t *testing.T, c *config) {
	cs := consoleStore(t, c.open(t))
	want := &store.ConsoleSession{
		Key:       "3f1c0a7b9e2d4c6a8b0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e",
		CSRFToken: "Zm9vYmFy-_x",
		ExpiresAt: t0.In(time.FixedZone("CET", 3600)),
		Org:       "docs",
		APIKey:    "k-1",
	}
	mustPutConsoleSession(ctx, t, cs, want)
	check := func(what string, want *store.ConsoleSession) {
		t.Helper()
		got, err := cs.ListConsoleSessions(ctx, t0.Add(-time.Hour))
		if err != nil || len(got) != 1 {
			t.Fatalf("%s: ListConsoleSessions: %v, %v; want the one", what, got, err)
		}
		checkTime(t, what+": expires_at", got[0].ExpiresAt, want.ExpiresAt)
		g, w := *got[0], *want
		g.ExpiresAt, w.ExpiresAt = time.Time{}, time.Time{}
		if g != w {
			t.Errorf("%s:\n got %+v\nwant %+v", what, g, w)
		}
	}
	check("as put", want)
	again := &store.ConsoleSession{Key: want.Key, CSRFToken: "other", ExpiresAt: t0.Add(time.Hour), Org: "ops", APIKey: api.AdminKeyID}
	mustPutConsoleSession(ctx, t, cs, again)
	check("replaced", again)
}

// testConsoleExpiry: a session has expired at its expiry itself: not
// listed then, and deleted by a delete then; one a nanosecond later is
// neither.
func testConsoleExpiry(ctx context.Context, t *testing.T, c *config) {
	cs := consoleStore(t, c.open(t))
	now := consoleNow
	mustPutConsoleSession(ctx, t, cs, &store.ConsoleSession{Key: "ends", CSRFToken: "c1", ExpiresAt: now})
	mustPutConsoleSession(ctx, t, cs, &store.ConsoleSession{Key: "later", CSRFToken: "c2", ExpiresAt: now.Add(time.Nanosecond)})
	if got := listConsole(ctx, t, cs, now); got != "later=c2@1ns " {
		t.Errorf("at the expiry of ends: %q; want later alone", got)
	}
	if got := listConsole(ctx, t, cs, now.Add(-time.Nanosecond)); got != "ends=c1@0s later=c2@1ns " {
		t.Errorf("a nanosecond before: %q; want both", got)
	}
	if err := cs.DeleteConsoleSessions(ctx, now); err != nil {
		t.Fatal(err)
	}
	if got := listConsole(ctx, t, cs, now.Add(-time.Nanosecond)); got != "later=c2@1ns " {
		t.Errorf("after a delete at the expiry of ends: %q; want later alone", got)
	}
}

// testConsoleTies: sessions that end at once are listed by the bytes of
// their keys ("B" before "a"), as SQLite orders text.
func testConsoleTies(ctx context.Context, t *testing.T, c *config) {
	cs := consoleStore(t, c.open(t))
	for _, key := range []string{"b", "a", "_", "B", "-"} {
		mustPutConsoleSession(ctx, t, cs, &store.ConsoleSession{Key: key, CSRFToken: "c", ExpiresAt: consoleNow.Add(time.Hour)})
	}
	if got := listConsole(ctx, t, cs, consoleNow); got != "-=c@1h0m0s B=c@1h0m0s _=c@1h0m0s a=c@1h0m0s b=c@1h0m0s " {
		t.Errorf("sessions that end at once: %q; want them by key", got)
	}
}

// testConsoleAudited: a login or logout is an API call's change, so the
// call's record commits with the session written; a delete that deletes
// nothing writes none.
func testConsoleAudited(ctx context.Context, t *testing.T, c *config) {
	st := c.open(t)
	cs := consoleStore(t, st)
	log, ok := st.(Audit)
	if !ok {
		t.Fatal("the store keeps no audit log")
	}
	ev := api.AuditEvent{Time: t0, Org: "docs", Key: "console", Action: "console.login", Target: "console", Client: "192.0.2.1:41000"}
	call := store.NewAuditCall(ev, log)
	mustPutConsoleSession(store.WithAudit(ctx, call), t, cs, &store.ConsoleSession{Key: "a", CSRFToken: "ca", ExpiresAt: consoleNow})
	got := mustListAudit(ctx, t, log, store.AuditFilter{})
	if len(got) != 1 || got[0].Action != "console.login" || got[0].Outcome != "ok" {
		t.Errorf("audit log after a login: %+v; want its record", got)
	}
	ev.Action = "console.logout"
	call = store.NewAuditCall(ev, log)
	if err := cs.DeleteConsoleSessions(store.WithAudit(ctx, call), consoleNow.Add(-time.Hour), "nope"); err != nil {
		t.Fatal(err)
	}
	if got := mustListAudit(ctx, t, log, store.AuditFilter{}); len(got) != 1 {
		t.Errorf("audit log after a delete that deleted nothing: %+v; want no new record", got)
	}
	if err := cs.DeleteConsoleSessions(store.WithAudit(ctx, call), consoleNow.Add(-time.Hour), "a"); err != nil {
		t.Fatal(err)
	}
	if got := mustListAudit(ctx, t, log, store.AuditFilter{}); len(got) != 2 || got[1].Action != "console.logout" {
		t.Errorf("audit log after a logout: %+v; want its record", got)
	}
}

// testConsoleGet: a session is found by its key until it expires, and not
// once deleted; an unknown key is ErrNotFound.
func testConsoleGet(ctx context.Context, t *testing.T, c *config) {
	st := c.newStore(t)
	defer st.Close()
	cs := consoleStore(t, st)
	want := &store.ConsoleSession{Key: "k1", CSRFToken: "c1", ExpiresAt: consoleNow.Add(time.Hour), Org: "acme", APIKey: "key-1"}
	mustPutConsoleSession(ctx, t, cs, want)
	got, err := cs.GetConsoleSession(ctx, "k1", consoleNow)
	if err != nil || got.Key != "k1" || got.CSRFToken != "c1" || got.Org != "acme" || got.APIKey != "key-1" || !got.ExpiresAt.Equal(want.ExpiresAt) {
		t.Fatalf("GetConsoleSession(k1): %+v, %v; want %+v", got, err, want)
	}
	if _, err := cs.GetConsoleSession(ctx, "k1", consoleNow.Add(time.Hour)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetConsoleSession(k1) once expired: %v, want ErrNotFound", err)
	}
	if _, err := cs.GetConsoleSession(ctx, "k2", consoleNow); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetConsoleSession(k2), never kept: %v, want ErrNotFound", err)
	}
	if err := cs.DeleteConsoleSessions(ctx, consoleNow, "k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.GetConsoleSession(ctx, "k1", consoleNow); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetConsoleSession(k1) once deleted: %v, want ErrNotFound", err)
	}
}
