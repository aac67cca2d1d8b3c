package server

import (
	"testing"
)

// TestBearerScheme: the scheme of Authorization is matched in any case
// (RFC 9110), by the daemon's API and by the in-sandbox one.
func TestBearerScheme(t *testing.T) {
	in := NewInside(newFake(), []byte("secret"), discardLog())
	apis := []struct {
		name, base, token string
	}{
		{"daemon", serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...)), testToken},
		{"inside", serve(t, in.handler("sb-000000000001")), in.Token("sb-000000000001")},
	}
	for _, a := range apis {
		for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEARER"} {
			t.Run(a.name+" "+scheme, func(t *testing.T) {
				resp, body := do(t, a.base, "", request{method: "GET", path: "/v1/sandboxes/box", token: "-",
					header: map[string]string{"Authorization": scheme + " " + a.token}})
				if resp.StatusCode != 200 {
					t.Errorf("status %d, want 200: %s", resp.StatusCode, body)
				}
			})
		}
		resp, _ := do(t, a.base, "", request{method: "GET", path: "/v1/sandboxes/box", token: "-",
			header: map[string]string{"Authorization": "Basic " + a.token}})
		if resp.StatusCode != 401 {
			t.Errorf("%s: the token as Basic: status %d, want 401", a.name, resp.StatusCode)
		}
	}
}
