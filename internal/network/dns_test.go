package network

import "testing"

func TestJudge(t *testing.T) {
	p := Policy{Egress: EgressAll, AllowNames: []string{"a.example.com"}, DenyNames: []string{"*.example.com", "evil.test"}}
	none := Policy{Egress: EgressNone, AllowNames: []string{"pypi.org", "*.pythonhosted.org"}}
	tests := []struct {
		p    Policy
		name string
		want nameVerdict
	}{
		{p, "a.example.com", nameAllowed}, // allow wins over deny
		{p, "b.example.com", nameDenied},
		{p, "x.b.example.com", nameDenied},
		{p, "example.com", nameForwarded}, // *.x is below x, not x
		{p, "evil.test", nameDenied},
		{p, "sub.evil.test", nameForwarded},
		{p, "other.org", nameForwarded},
		{none, "pypi.org", nameAllowed},
		{none, "files.pythonhosted.org", nameAllowed},
		{none, "pythonhosted.org", nameRefused},
		{none, "xpypi.org", nameRefused},
		{none, "other.org", nameRefused},
	}
	for _, tt := range tests {
		if got := judge(tt.p, tt.name); got != tt.want {
			t.Errorf("judge(%s, %q) = %d, want %d", tt.p.Egress, tt.name, got, tt.want)
		}
	}
}

func TestValidNamePattern(t *testing.T) {
	for s, want := range map[string]bool{
		"pypi.org": true, "*.example.com": true, "a-b.c0.io": true, "localhost": true,
		"": false, "*.": false, "*": false, "a..b": false, "-a.b": false, "a-.b": false,
		"A.b": false, "a_b.c": false, "a.*.b": false, "**.a": false,
	} {
		if got := ValidNamePattern(s); got != want {
			t.Errorf("ValidNamePattern(%q) = %v, want %v", s, got, want)
		}
	}
}
