package server

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"loam.dev/loam/api"
)

func (f *fakeSandboxes) SetNetwork(ctx context.Context, ref string, p api.NetworkPolicy) (*api.Sandbox, error) {
	if p.Egress != "" && p.Egress != api.EgressAll && p.Egress != api.EgressNone {
		return nil, api.Errorf(api.CodeInvalid, "network.egress: %q is neither all nor none", p.Egress)
	}
	if _, err := f.Get(ctx, ref); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.sbs {
		if f.sbs[i].ID == ref || f.sbs[i].Name == ref {
			f.sbs[i].Network = p
			sb := f.sbs[i]
			return &sb, nil
		}
	}
	return nil, api.Errorf(api.CodeNotFound, "sandbox %q not found", ref)
}

func TestSetNetwork(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	tests := []struct {
		name, path, body string
		status           int
		want             string
	}{
		{"set", "/v1/sandboxes/box/network", `{"egress":"none","allow":["192.0.2.7"]}`, http.StatusOK, `"network":{"egress":"none","allow":["192.0.2.7"],"deny":null}`},
		{"invalid", "/v1/sandboxes/box/network", `{"egress":"some"}`, http.StatusBadRequest, `"code":"invalid"`},
		{"not json", "/v1/sandboxes/box/network", `{`, http.StatusBadRequest, `"code":"invalid"`},
		{"missing", "/v1/sandboxes/nosuch/network", `{"egress":"all"}`, http.StatusNotFound, `"code":"not_found"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := do(t, base, testToken, request{method: http.MethodPut, path: tt.path, body: tt.body})
			if resp.StatusCode != tt.status || !strings.Contains(string(body), tt.want) {
				t.Errorf("PUT %s %s: %d %s, want %d with %s", tt.path, tt.body, resp.StatusCode, body, tt.status, tt.want)
			}
		})
	}
}
