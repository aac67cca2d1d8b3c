package api

import (
	"net/http"
	"testing"
)

func TestBearerToken(t *testing.T) {
	for _, tc := range []struct {
		header, token string
		ok            bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer abc", "abc", true},
		{"BEARER abc", "abc", true},
		{"bEaReR abc", "abc", true},
		{"Bearer   abc", "abc", true},
		{"", "", false},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Basic abc", "", false},
		{"Bearerabc", "", false},
		{"Bearer-x abc", "", false},
	} {
		h := http.Header{}
		if tc.header != "" {
			h.Set("Authorization", tc.header)
		}
		token, ok := BearerToken(h)
		if token != tc.token || ok != tc.ok {
			t.Errorf("%q: %q, %v; want %q, %v", tc.header, token, ok, tc.token, tc.ok)
		}
	}
}
