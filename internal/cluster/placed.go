package cluster

import (
	"fmt"
	"sync"
	"time"

	"loam.dev/loam/internal/store"
)

// placedFor is how long placement counts a sandbox it placed against its
// node when no newer report of the node's load comes: one comes with each
// renewal of its lease (every third of DefaultLease), so this only
// matters for a node that fell silent.
const placedFor = 30 * time.Second

// placed is what this node's router placed on each node since that node
// last reported its load. A node's free memory is what its last report
// said, seconds old: the creates placed between two reports all see the
// same numbers, and a burst of them (a count of forks) would otherwise
// pile onto the one node that looked freest. Placement counts what it
// placed on a node against it until a report newer than the placement
// comes (store.Node.RenewedAt), which counts the sandbox itself.
type placed struct {
	mu sync.Mutex
	on map[string][]placement // by node
}

// placement is a sandbox placed on a node.
type placement struct {
	// at is when, in the database's time (Member.Nodes), to compare with
	// the node's RenewedAt; forget is when, in local time, it is
	// forgotten however long the node stays silent.
	at, forget time.Time
	memoryMiB  int64
}

// recent is what was placed on a node since its last report: how many
// sandboxes, asking how much memory.
type recent struct {
	count     int
	memoryMiB int64
}

// String says what was placed, for the reasons placement gives.
func (s recent) String() string {
	if s.count == 1 {
		return fmt.Sprintf("1 sandbox (%d MiB) placed there since its last report", s.memoryMiB)
	}
	return fmt.Sprintf("%d sandboxes (%d MiB) placed there since its last report", s.count, s.memoryMiB)
}

// add records a sandbox asking a placed on node at now, the database's
// time.
func (p *placed) add(node string, now time.Time, a ask) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.on == nil {
		p.on = map[string][]placement{}
	}
	// Nodes that went (or fell silent) are forgotten here too.
	local := time.Now()
	for n, list := range p.on {
		if len(list) > 0 && !list[len(list)-1].forget.After(local) {
			delete(p.on, n)
		}
	}
	p.on[node] = append(p.on[node], placement{at: now, forget: local.Add(placedFor), memoryMiB: a.memoryMiB})
}

// recent is what was placed on each of nodes since its last report, by
// name; a node with none is absent. What a report has counted since is
// dropped.
func (p *placed) recent(nodes []*store.Node) map[string]recent {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]recent{}
	local := time.Now()
	for _, n := range nodes {
		list := p.on[n.Name]
		kept := list[:0]
		var s recent
		for _, pl := range list {
			if pl.at.After(n.RenewedAt) && pl.forget.After(local) {
				kept = append(kept, pl)
				s.count++
				s.memoryMiB += pl.memoryMiB
			}
		}
		switch {
		case len(kept) == 0:
			delete(p.on, n.Name)
		default:
			p.on[n.Name] = kept
			out[n.Name] = s
		}
	}
	return out
}
