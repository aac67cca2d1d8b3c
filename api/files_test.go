package api

import (
	"errors"
	"net/url"
	"testing"
)

func TestReadRange(t *testing.T) {
	for _, tc := range []struct {
		query  string
		want   ReadRange
		bad    bool
		size   int64
		within int64
	}{
		{"", ReadRange{0, -1}, false, 10, 10},
		{"offset=3", ReadRange{3, -1}, false, 10, 7},
		{"offset=3&length=4", ReadRange{3, 4}, false, 10, 4},
		{"offset=8&length=4", ReadRange{8, 4}, false, 10, 2},
		{"offset=10", ReadRange{10, -1}, false, 10, 0},
		{"offset=99&length=1", ReadRange{99, 1}, false, 10, 0},
		{"length=0", ReadRange{0, 0}, false, 10, 0},
		{"offset=-1", ReadRange{}, true, 0, 0},
		{"length=x", ReadRange{}, true, 0, 0},
		{"offset=1e3", ReadRange{}, true, 0, 0},
		{"offset=99999999999999999999", ReadRange{}, true, 0, 0},
	} {
		q, _ := url.ParseQuery(tc.query)
		got, err := ParseReadRange(q)
		if tc.bad {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%q: %v, want invalid", tc.query, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v %v, want %+v", tc.query, got, err, tc.want)
			continue
		}
		if n := got.Within(tc.size); n != tc.within {
			t.Errorf("%q of %d bytes covers %d, want %d", tc.query, tc.size, n, tc.within)
		}
		back := url.Values{}
		got.Values(back)
		if again, _ := ParseReadRange(back); again != got {
			t.Errorf("%q: %+v went to %q and back as %+v", tc.query, got, back.Encode(), again)
		}
	}
}
