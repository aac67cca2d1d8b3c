package test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// TestForkCount makes many forks at once on one daemon: a count of 3 of a
// memory checkpoint makes many-1 … many-3, each running the source's
// process, each with its own audit record; a count one of whose names is
// taken makes the others and lists the conflict, with 201; a count of a
// checkpoint that does not exist answers 404, as one fork would; a count
// without from, or over 64, answers 400 and makes nothing.
func TestForkCount(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	t.Cleanup(func() {
		sbs, err := d.C.ListSandboxes(ctx, client.ListOptions{})
		if err != nil {
			t.Errorf("listing the sandboxes to delete: %v", err)
		}
		for _, sb := range sbs {
			if err := d.C.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Errorf("deleting %s: %v", sb.Name, err)
			}
		}
	})
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src"}); err != nil {
		t.Fatal(err)
	}
	d.Run("src", "sh", "-c", "sleep 1000 >/dev/null 2>&1 &")
	cp, err := d.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Comment: "sleep runs"})
	if err != nil {
		t.Fatal(err)
	}
	// runs says whether sandbox sb runs the source's sleep, looked for by
	// its command line.
	runs := func(sb string) bool {
		out, _, _, err := d.C.Output(ctx, sb, "sh", "-c", "if grep -qs '[s]leep.1000' /proc/[0-9]*/cmdline; then echo yes; fi")
		return err == nil && string(out) == "yes\n"
	}
	// count posts a body with a count and returns the status and body.
	count := func(body string) (int, string) {
		t.Helper()
		return d.Curl("POST", "/v1/sandboxes", body)
	}
	from := fmt.Sprintf(`"from":{"sandbox":"src","checkpoint":%q}`, cp.ID)

	list, err := d.C.ForkMany(ctx, "src", cp.ID, api.CreateSandbox{Name: "many", Count: 3, Labels: map[string]string{"batch": "many"}})
	if err != nil {
		t.Fatalf("3 forks: %v", err)
	}
	var names []string
	for _, f := range list.Forks {
		names = append(names, f.Name)
		if f.Error != nil || f.Sandbox == nil || f.Sandbox.Name != f.Name || f.Sandbox.State != api.StateRunning ||
			f.Sandbox.From == nil || f.Sandbox.From.Checkpoint != cp.ID || f.Sandbox.Labels["batch"] != "many" {
			t.Errorf("fork %s: %+v, error %v; want it running, from %s, with its label", f.Name, f.Sandbox, f.Error, cp.ID)
			continue
		}
		if !runs(f.Name) {
			t.Errorf("fork %s does not run the source's sleep", f.Name)
		}
	}
	if strings.Join(names, " ") != "many-1 many-2 many-3" {
		t.Errorf("forks %v, want many-1 many-2 many-3 in order", names)
	}

	// One name of the count taken: the others are made.
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "more-2"}); err != nil {
		t.Fatal(err)
	}
	status, body := count(`{"name":"more","count":3,` + from + `}`)
	var more api.ForkList
	if err := json.Unmarshal([]byte(body), &more); err != nil || status != 201 || len(more.Forks) != 3 {
		t.Fatalf("3 forks with more-2 taken: %d %s, want 201 and a list of 3", status, body)
	}
	for i, f := range more.Forks {
		want := fmt.Sprintf("more-%d", i+1)
		switch {
		case f.Name != want:
			t.Errorf("fork %d is %q, want %s", i+1, f.Name, want)
		case i == 1 && (f.Sandbox != nil || f.Error == nil || f.Error.Code != api.CodeConflict):
			t.Errorf("more-2: %+v, %v; want a conflict alone", f.Sandbox, f.Error)
		case i != 1 && (f.Sandbox == nil || f.Error != nil || !runs(f.Sandbox.Name)):
			t.Errorf("%s: %+v, %v; want it made, running the source's sleep", want, f.Sandbox, f.Error)
		}
	}

	// A count none of whose forks can be made is a plain error, and one
	// that makes no sense makes nothing.
	for _, tc := range []struct {
		body   string
		status int
		code   api.Code
	}{
		{`{"name":"none","count":3,"from":{"sandbox":"src","checkpoint":"v9"}}`, 404, api.CodeNotFound},
		{`{"name":"none","count":3}`, 400, api.CodeInvalid},
		{`{"name":"none","count":65,` + from + `}`, 400, api.CodeInvalid},
	} {
		status, body := count(tc.body)
		var eb api.ErrorBody
		if err := json.Unmarshal([]byte(body), &eb); err != nil || status != tc.status || eb.Error == nil || eb.Error.Code != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.body, status, body, tc.status, tc.code)
		}
	}
	sbs, err := d.C.ListSandboxes(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, sb := range sbs {
		all = append(all, sb.Name)
	}
	slices.Sort(all)
	if want := "many-1 many-2 many-3 more-1 more-2 more-3 src"; strings.Join(all, " ") != want {
		t.Errorf("sandboxes %v, want %s", all, want)
	}

	// Each fork has its record in the audit log, and so has each call.
	status, body = d.Curl("GET", "/v1/audit?action=sandbox.fork", "")
	var audit api.AuditList
	if err := json.Unmarshal([]byte(body), &audit); err != nil || status != 200 {
		t.Fatalf("audit: %d %s", status, body)
	}
	var records []string
	for _, ev := range audit.Events {
		records = append(records, ev.Target+" "+ev.Outcome)
	}
	for _, want := range []string{"sandboxes/many-1 ok", "sandboxes/many-2 ok", "sandboxes/many-3 ok", "sandboxes/more-2 conflict", "sandboxes ok", "sandboxes/none-1 not_found"} {
		if !slices.Contains(records, want) {
			t.Errorf("the audit log of sandbox.fork lacks %q:\n%s", want, strings.Join(records, "\n"))
		}
	}
}
