// Package proc is the agent's processes at the level of the kernel: the one
// reaper that starts, signals and collects every child of the sandbox
// (Reaper), the bounded output buffers sessions and services read at their
// own offsets (Ring) and the pseudo-terminals of interactive commands.
package proc

import (
	"context"
	"io"
	"sync"
)

// Ring is a bounded byte buffer that keeps the newest bytes written to it.
// Bytes are addressed by absolute offsets: the n-th byte ever written is at
// offset n, whatever has wrapped out since, so a reader that comes back
// knows exactly what it missed. Any number of readers read at their own
// offsets and wait for more; writers never wait for readers. A ring is
// meant for any output the agent keeps for later clients (sessions' output,
// services' logs). It is safe for concurrent use.
type Ring struct {
	mu   sync.Mutex
	size int
	// buf grows up to size as bytes come, so a quiet command costs little;
	// once full, the byte at offset o is buf[o%size].
	buf    []byte
	end    int64 // the offset of the next byte written: all bytes ever written
	closed bool
	// more is closed, and replaced, whenever bytes come or the ring closes.
	more chan struct{}
}

func NewRing(size int) *Ring {
	return &Ring{size: size, more: make(chan struct{})}
}

// Write appends p, dropping the oldest bytes beyond the ring's size. It
// never fails and never waits.
func (r *Ring) Write(p []byte) (int, error) {
	n := len(p)
	if n == 0 {
		return 0, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, io.ErrClosedPipe
	}
	if n > r.size {
		// Only the last size bytes can be kept. They fill the whole
		// ring, so it is full from here on (bytes at offset o at
		// buf[o%size]); what was in it is all overwritten below.
		r.end += int64(n - r.size)
		p = p[n-r.size:]
		if len(r.buf) < r.size {
			r.buf = make([]byte, r.size)
		}
	}
	for len(p) > 0 {
		if len(r.buf) < r.size {
			// Still growing: the ring has not wrapped, and end == len(buf).
			k := min(len(p), r.size-len(r.buf))
			if len(r.buf)+k > cap(r.buf) {
				// Grow as append would, but never past size.
				nb := make([]byte, len(r.buf), min(max(2*cap(r.buf), len(r.buf)+k, 4096), r.size))
				copy(nb, r.buf)
				r.buf = nb
			}
			r.buf = append(r.buf, p[:k]...)
			r.end += int64(k)
			p = p[k:]
			continue
		}
		i := int(r.end % int64(r.size))
		k := copy(r.buf[i:], p)
		r.end += int64(k)
		p = p[k:]
	}
	close(r.more)
	r.more = make(chan struct{})
	return n, nil
}

// Close marks the end of the output: readers that have read everything get
// io.EOF instead of waiting. The ring keeps only what it holds from then on.
func (r *Ring) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		close(r.more)
		if cap(r.buf) > len(r.buf) {
			nb := make([]byte, len(r.buf))
			copy(nb, r.buf)
			r.buf = nb
		}
	}
}

// Bounds returns the offsets of the oldest byte held and of the next byte
// to be written.
func (r *Ring) Bounds() (start, end int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.start(), r.end
}

func (r *Ring) start() int64 {
	return r.end - int64(len(r.buf))
}

// ReadAt copies bytes from offset off on into p, waiting until there are
// some, the ring is closed (io.EOF once everything was read) or ctx is done.
// When off has wrapped out of the ring it reads from the oldest byte held
// instead; at is the offset of p[0], so at-off bytes were lost. An off past
// the end waits for the bytes to come.
func (r *Ring) ReadAt(ctx context.Context, p []byte, off int64) (n int, at int64, err error) {
	for {
		r.mu.Lock()
		start := r.start()
		at = max(off, start)
		if at < r.end {
			n = r.copyOut(p, at)
			r.mu.Unlock()
			return n, at, nil
		}
		if r.closed {
			r.mu.Unlock()
			return 0, at, io.EOF
		}
		more := r.more
		r.mu.Unlock()
		select {
		case <-more:
		case <-ctx.Done():
			return 0, at, ctx.Err()
		}
	}
}

// copyOut copies from offset at (held by the ring) into p; r.mu is held.
func (r *Ring) copyOut(p []byte, at int64) int {
	avail := int(r.end - at)
	if len(r.buf) < r.size {
		return copy(p, r.buf[int(at):int(at)+avail])
	}
	n := 0
	for n < len(p) && n < avail {
		i := int((at + int64(n)) % int64(r.size))
		k := min(len(p)-n, avail-n, r.size-i)
		copy(p[n:n+k], r.buf[i:i+k])
		n += k
	}
	return n
}
