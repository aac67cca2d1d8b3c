package proc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"
)

// readAll reads r from off until EOF.
func readAll(t *testing.T, r *Ring, off int64, chunk int) ([]byte, int64) {
	t.Helper()
	var out []byte
	first := int64(-1)
	p := make([]byte, chunk)
	for {
		n, at, err := r.ReadAt(context.Background(), p, off)
		if errors.Is(err, io.EOF) {
			return out, first
		}
		if err != nil {
			t.Fatal(err)
		}
		if first < 0 {
			first = at
		}
		out = append(out, p[:n]...)
		off = at + int64(n)
	}
}

func TestRing(t *testing.T) {
	tests := []struct {
		name      string
		size      int
		writes    []string
		off       int64
		chunk     int
		want      string
		wantFirst int64
	}{
		{"empty", 8, nil, 0, 4, "", -1},
		{"fits", 8, []string{"abc", "de"}, 0, 3, "abcde", 0},
		{"from an offset", 8, []string{"abcdef"}, 2, 3, "cdef", 2},
		{"exactly full", 4, []string{"ab", "cd"}, 0, 8, "abcd", 0},
		{"wrapped", 4, []string{"abc", "def", "g"}, 0, 2, "defg", 3},
		{"wrapped, from inside", 4, []string{"abcdef"}, 4, 8, "ef", 4},
		{"one write larger than the ring", 4, []string{"abcdefghij"}, 0, 3, "ghij", 6},
		{"many small wraps", 3, []string{"a", "b", "c", "d", "e", "f", "g"}, 1, 1, "efg", 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRing(tt.size)
			for _, w := range tt.writes {
				r.Write([]byte(w))
			}
			r.Close()
			got, first := readAll(t, r, tt.off, tt.chunk)
			if string(got) != tt.want || first != tt.wantFirst {
				t.Errorf("read %q from %d, want %q from %d", got, first, tt.want, tt.wantFirst)
			}
		})
	}
}

// TestRingFollow checks that a reader waiting at the end gets bytes as they
// come, in order, while the ring wraps under it.
func TestRingFollow(t *testing.T) {
	r := NewRing(64)
	var want bytes.Buffer
	done := make(chan []byte)
	go func() {
		got, _ := readAll(t, r, 0, 7)
		done <- got
	}()
	for i := range 200 {
		b := []byte{byte('a' + i%26)}
		want.Write(b)
		r.Write(b)
		if i%10 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	r.Close()
	got := <-done
	// The reader is never more than a few bytes behind here, but a slow
	// one may lose bytes: what it got must be the tail of what was written,
	// contiguous from some offset.
	if !bytes.HasSuffix(want.Bytes(), got) || len(got) < 64 {
		t.Fatalf("follower got %d bytes %q, not a tail of %q", len(got), got, want.Bytes())
	}
}

func TestRingReadWaitsForContext(t *testing.T) {
	r := NewRing(8)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := r.ReadAt(ctx, make([]byte, 4), 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ReadAt on an empty ring = %v, want the context's deadline", err)
	}
}

// TestRingMemory checks that a ring never holds more than its size, however
// it is written, and gives back what it does not use once closed.
func TestRingMemory(t *testing.T) {
	const size = 100 << 10
	r := NewRing(size)
	chunk := bytes.Repeat([]byte("x"), 999)
	for range 300 {
		r.Write(chunk)
		if cap(r.buf) > size {
			t.Fatalf("ring of %d bytes holds a buffer of %d", size, cap(r.buf))
		}
	}
	small := NewRing(size)
	small.Write([]byte("hello"))
	small.Close()
	if cap(small.buf) != 5 {
		t.Fatalf("a closed ring holding 5 bytes keeps a buffer of %d", cap(small.buf))
	}
}
