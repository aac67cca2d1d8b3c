package cli

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestDetachReader(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		want     string
		detached bool
	}{
		{"plain", "hello\n", "hello\n", false},
		{"ctrl-p ctrl-q detaches", "ab\x10\x11cd", "ab", true},
		{"ctrl-p alone passes", "a\x10b", "a\x10b", false},
		{"ctrl-p twice then ctrl-q", "\x10\x10\x11x", "\x10", true},
		{"ctrl-p at the end passes", "a\x10", "a\x10", false},
	}
	for _, tt := range tests {
		for _, oneByte := range []bool{false, true} {
			t.Run(tt.name, func(t *testing.T) {
				ctx, cancel := context.WithCancelCause(context.Background())
				defer cancel(nil)
				var r io.Reader = strings.NewReader(tt.in)
				if oneByte {
					r = iotest.OneByteReader(r)
				}
				d := &detachReader{r: r, ctx: ctx, detach: func() { cancel(errDetached) }}
				var got []byte
				buf := make([]byte, 4)
				for {
					n, err := d.Read(buf)
					got = append(got, buf[:n]...)
					if err != nil {
						break
					}
				}
				detached := errors.Is(context.Cause(ctx), errDetached)
				if string(got) != tt.want || detached != tt.detached {
					t.Errorf("read %q, detached %v; want %q, %v", got, detached, tt.want, tt.detached)
				}
			})
		}
	}
}

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"4096", 4096, true}, {"64Ki", 64 << 10, true}, {"4Mi", 4 << 20, true}, {"2M", 2 << 20, true},
		{"", 0, false}, {"-1", 0, false}, {"1Gi", 0, false}, {"x", 0, false},
	}
	for _, tt := range tests {
		got, err := parseBytes(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}
