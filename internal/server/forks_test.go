package server

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"loam.dev/loam/api"
)

// TestForkCount: a create with a count makes each fork as a call of its
// own (its own audit record, the key's labels), answering the list in
// order with each fork's sandbox or error; a count none of whose forks
// was made answers the first one's error; a count that makes no sense is
// refused before any fork.
func TestForkCount(t *testing.T) {
	ks := newKeyServer(t)
	ks.fake.mu.Lock()
	ks.fake.sbs = append(ks.fake.sbs, api.Sandbox{ID: "sb-000000000008", Name: "dup-2", State: api.StateRunning},
		api.Sandbox{ID: "sb-000000000009", Name: "solo-1", State: api.StateRunning})
	ks.fake.mu.Unlock()
	// forks makes a count of forks of box's v1 with token, fields added to
	// the body, and returns the list it answered.
	forks := func(t *testing.T, token, fields string) []api.ForkResult {
		t.Helper()
		resp, body := do(t, ks.base, "", request{method: "POST", path: "/v1/sandboxes", token: token,
			body: `{"from":{"sandbox":"box","checkpoint":"v1"}` + fields + `}`})
		var l api.ForkList
		if err := json.Unmarshal(body, &l); resp.StatusCode != http.StatusCreated || err != nil {
			t.Fatalf("%d %s, want 201 and a list of forks", resp.StatusCode, body)
		}
		return l.Forks
	}
	w := ks.secrets["write"]

	t.Run("named", func(t *testing.T) {
		var names []string
		for _, f := range forks(t, w, `,"name":"many","count":3`) {
			if f.Sandbox == nil || f.Error != nil || f.Sandbox.Name != f.Name {
				t.Errorf("fork %+v, want its sandbox alone", f)
				continue
			}
			names = append(names, f.Name)
		}
		if strings.Join(names, " ") != "many-1 many-2 many-3" {
			t.Errorf("forks %v, want many-1 many-2 many-3 in order", names)
		}
	})
	t.Run("one of them taken", func(t *testing.T) {
		got := forks(t, w, `,"name":"dup","count":3`)
		if len(got) != 3 || got[0].Sandbox == nil || got[2].Sandbox == nil ||
			got[1].Name != "dup-2" || got[1].Sandbox != nil || got[1].Error == nil || got[1].Error.Code != api.CodeConflict {
			t.Errorf("forks %+v, want dup-1 and dup-3 made and dup-2 a conflict", got)
		}
	})
	t.Run("no name", func(t *testing.T) {
		got := forks(t, w, `,"count":2`)
		if len(got) != 2 || got[0].Name != "" || got[0].Sandbox == nil || got[1].Sandbox == nil {
			t.Errorf("forks %+v, want two sandboxes named by the daemon", got)
		}
	})
	t.Run("count 1 is a list", func(t *testing.T) {
		if got := forks(t, w, `,"name":"one","count":1`); len(got) != 1 || got[0].Name != "one-1" {
			t.Errorf("forks %+v, want one-1", got)
		}
	})
	t.Run("a label-limited key", func(t *testing.T) {
		for _, f := range forks(t, ks.secrets["red"], `,"name":"red","count":2`) {
			if f.Sandbox == nil || f.Sandbox.Labels["team"] != "red" {
				t.Errorf("fork %+v, want the key's label team=red", f)
			}
		}
	})

	for _, tc := range []struct {
		name, body string
		status     int
		msg        string
	}{
		{"no such checkpoint", `{"name":"x","count":3,"from":{"sandbox":"box","checkpoint":"v9"}}`, 404, `checkpoint \"v9\" of box not found`},
		{"no such source", `{"count":2,"from":{"sandbox":"nope","checkpoint":"v1"}}`, 404, "nope"},
		{"its one fork's name taken", `{"name":"solo","count":1,"from":{"sandbox":"box","checkpoint":"v1"}}`, 409, "solo-1"},
		{"not a fork", `{"name":"x","count":2}`, 400, "only a fork (from)"},
		{"too many", `{"count":65,"from":{"sandbox":"box","checkpoint":"v1"}}`, 400, "1 to 64 forks"},
		{"below 0", `{"count":-1,"from":{"sandbox":"box","checkpoint":"v1"}}`, 400, "count: -1"},
		{"a name too long for the last", `{"name":"` + strings.Repeat("n", 52) + `","count":10,"from":{"sandbox":"box","checkpoint":"v1"}}`, 400, "-10\\\": at most 54 characters"},
		{"an invalid name", `{"name":"Many","count":2,"from":{"sandbox":"box","checkpoint":"v1"}}`, 400, "the forks are named Many-1 … Many-2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, ks.base, "", request{method: "POST", path: "/v1/sandboxes", token: w, body: tc.body})
			if resp.StatusCode != tc.status || errorCode(body) == "" || !strings.Contains(string(body), tc.msg) {
				t.Errorf("%d %s, want %d, an error saying %q", resp.StatusCode, body, tc.status, tc.msg)
			}
		})
	}

	t.Run("audit", func(t *testing.T) {
		resp, body := do(t, ks.base, "", request{method: "GET", path: "/v1/audit?action=sandbox.fork", token: ks.secrets["admin"]})
		var log api.AuditList
		if err := json.Unmarshal(body, &log); err != nil || resp.StatusCode != 200 {
			t.Fatalf("audit: %d %s", resp.StatusCode, body)
		}
		var got []string
		for _, ev := range log.Events {
			got = append(got, ev.Target+" "+ev.Outcome)
		}
		for _, want := range []string{"sandboxes/many-1 ok", "sandboxes/many-2 ok", "sandboxes/many-3 ok", "sandboxes/dup-2 conflict", "sandboxes ok", "sandboxes/x-1 not_found", "sandboxes not_found"} {
			if !slices.Contains(got, want) {
				t.Errorf("the audit log of sandbox.fork lacks %q:\n%s", want, strings.Join(got, "\n"))
			}
		}
		// One per fork and one per call of a fork (a count of 3 is 4):
		// named, one taken, no name, count 1, the limited key, no such
		// checkpoint, no such source, its one fork taken, and the four
		// counts refused (which made no fork); the count without from is
		// a create.
		if n, want := len(got), 4+4+3+2+3+4+3+2+4; n != want {
			t.Errorf("%d sandbox.fork records, want %d:\n%s", n, want, strings.Join(got, "\n"))
		}
	})
}
