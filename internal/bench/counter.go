package bench

import "sync/atomic"

// atomicCounter hands out 1, 2, 3, … to concurrent callers.
type atomicCounter struct{ n atomic.Int64 }

func (c *atomicCounter) next() int64 { return c.n.Add(1) }
