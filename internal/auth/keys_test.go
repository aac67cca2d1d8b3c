package auth

import (
	"context"
	"io"
	"log/slog"
	"testing"
)

// TestForgetOrg: the calls open with any key of a deleted org end, a key
// its delete never listed (made while it ran) included; another org's
// stay open.
func TestForgetOrg(t *testing.T) {
	k := NewKeys("default", "admin-token", nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	open := func(org, key string) (context.Context, func()) {
		return k.Hold(context.Background(), Principal{Org: org, Key: key, Scope: "write"})
	}
	listed, r1 := open("docs", "key-listed")
	defer r1()
	late, r2 := open("docs", "key-made-mid-delete")
	defer r2()
	other, r3 := open("other", "key-other")
	defer r3()
	k.Forget("key-listed")
	if listed.Err() == nil {
		t.Fatal("Forget left a call of its key open")
	}
	if late.Err() != nil {
		t.Fatal("Forget ended a call of another key")
	}
	k.ForgetOrg("docs")
	if late.Err() == nil {
		t.Error("ForgetOrg left a call of a key of the org open")
	} else if cause := context.Cause(late).Error(); cause != "key key-made-mid-delete was revoked" {
		t.Errorf("cause: %q", cause)
	}
	if other.Err() != nil {
		t.Error("ForgetOrg ended a call of another org's key")
	}
}
