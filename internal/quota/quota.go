// Package quota holds an org's use to its quota (api.Quota): the check
// every admission makes (a create, fork, wake, restore, checkpoint or a
// warm pool's new member) before anything is made, and the message a user
// reads when it is refused. Counting the use is the sandbox core's: it
// knows what runs.
package quota

import (
	"fmt"
	"strconv"

	"loam.dev/loam/api"
)

// Check refuses, with api.CodeLimit, adding add to use when that would
// take org past q in any field add grows: a call that adds nothing to a
// field is never refused for it, so an org over a quota the operator
// lowered can still sleep, stop and delete.
func Check(org string, q api.Quota, use, add api.OrgUse) error {
	after := use.Add(add)
	over := func(limit *int, add, after int) bool { return limit != nil && add > 0 && after > *limit }
	const ask = "or ask the operator to raise it"
	switch {
	case over(q.Sandboxes, add.Sandboxes, after.Sandboxes):
		return api.Errorf(api.CodeLimit, "org %s would run %d sandboxes, its quota is %d; stop, sleep or delete a sandbox, %s", org, after.Sandboxes, *q.Sandboxes, ask)
	case over(q.MemoryMiB, add.MemoryMiB, after.MemoryMiB):
		return api.Errorf(api.CodeLimit, "org %s would use %s of memory, its quota is %s; stop, sleep or delete a sandbox, %s", org, MiB(after.MemoryMiB), MiB(*q.MemoryMiB), ask)
	case q.CPUs != nil && add.CPUs > 0 && after.CPUs > *q.CPUs+1e-9:
		return api.Errorf(api.CodeLimit, "org %s would use %s CPUs, its quota is %s; stop, sleep or delete a sandbox, %s", org, cpus(after.CPUs), cpus(*q.CPUs), ask)
	case over(q.DiskMiB, add.DiskMiB, after.DiskMiB):
		return api.Errorf(api.CodeLimit, "org %s would hold %s of disk, its quota is %s; delete a sandbox, checkpoints or templates, %s", org, MiB(after.DiskMiB), MiB(*q.DiskMiB), ask)
	case over(q.Checkpoints, add.Checkpoints, after.Checkpoints):
		return api.Errorf(api.CodeLimit, "org %s would keep %d checkpoints, its quota is %d; delete a checkpoint, %s", org, after.Checkpoints, *q.Checkpoints, ask)
	case over(q.PoolMembers, add.PoolMembers, after.PoolMembers):
		return api.Errorf(api.CodeLimit, "org %s would keep %d warm-pool members, its quota is %d; shrink a pool, %s", org, after.PoolMembers, *q.PoolMembers, ask)
	}
	return nil
}

// Validate refuses a quota with a negative limit.
func Validate(q api.Quota) error {
	for _, f := range []struct {
		name string
		v    *int
	}{{"sandboxes", q.Sandboxes}, {"memory_mib", q.MemoryMiB}, {"disk_mib", q.DiskMiB}, {"checkpoints", q.Checkpoints}, {"pool_members", q.PoolMembers}} {
		if f.v != nil && *f.v < 0 {
			return api.Errorf(api.CodeInvalid, "%s: %d is negative; leave it out for no limit", f.name, *f.v)
		}
	}
	if q.CPUs != nil && !(*q.CPUs >= 0) {
		return api.Errorf(api.CodeInvalid, "cpus: %v is negative; leave it out for no limit", *q.CPUs)
	}
	return nil
}

// MiB shows n MiB as a person reads it: 16 GiB when it is whole GiB,
// 1536 MiB otherwise (never rounded: a limit and a use that differ by a
// MiB read differently).
func MiB(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return strconv.Itoa(n/1024) + " GiB"
	}
	return strconv.Itoa(n) + " MiB"
}

func cpus(v float64) string { return fmt.Sprint(v) }
