package api

import "time"

// Quota is what an org may use at most, as PUT /v1/orgs/{org}/quota sets
// it: each field is a limit, and a field left out (null) is unlimited.
type Quota struct {
	// Sandboxes is how many of the org's sandboxes may run at once
	// (creating, running or restoring; sleeping and stopped ones do not
	// count, and waking one counts as what it makes).
	Sandboxes *int `json:"sandboxes,omitempty"`
	// MemoryMiB and CPUs bound the sum of resources.memory_mib and
	// resources.cpus of the org's running sandboxes.
	MemoryMiB *int     `json:"memory_mib,omitempty"`
	CPUs      *float64 `json:"cpus,omitempty"`
	// DiskMiB bounds the disk the org's things hold: every sandbox's
	// resources.disk_mib, whatever its state, and every memory
	// checkpoint's memory image (the sandbox's memory_mib when it was
	// taken; a checkpoint's disk is a copy-on-write snapshot that shares
	// its blocks with the sandbox's disk).
	DiskMiB *int `json:"disk_mib,omitempty"`
	// Checkpoints bounds how many checkpoints the org's sandboxes have,
	// automatic ones included.
	Checkpoints *int `json:"checkpoints,omitempty"`
	// PoolMembers bounds the members the org's warm pools keep ready.
	PoolMembers *int `json:"pool_members,omitempty"`
}

// OrgUse is what an org uses now, in the fields of Quota.
type OrgUse struct {
	Sandboxes   int     `json:"sandboxes"`
	MemoryMiB   int     `json:"memory_mib"`
	CPUs        float64 `json:"cpus"`
	DiskMiB     int     `json:"disk_mib"`
	Checkpoints int     `json:"checkpoints"`
	PoolMembers int     `json:"pool_members"`
}

// Add is u and v summed.
func (u OrgUse) Add(v OrgUse) OrgUse {
	return OrgUse{
		Sandboxes: u.Sandboxes + v.Sandboxes, MemoryMiB: u.MemoryMiB + v.MemoryMiB, CPUs: u.CPUs + v.CPUs,
		DiskMiB: u.DiskMiB + v.DiskMiB, Checkpoints: u.Checkpoints + v.Checkpoints, PoolMembers: u.PoolMembers + v.PoolMembers,
	}
}

// Sub is u less v, field by field.
func (u OrgUse) Sub(v OrgUse) OrgUse {
	return OrgUse{
		Sandboxes: u.Sandboxes - v.Sandboxes, MemoryMiB: u.MemoryMiB - v.MemoryMiB, CPUs: u.CPUs - v.CPUs,
		DiskMiB: u.DiskMiB - v.DiskMiB, Checkpoints: u.Checkpoints - v.Checkpoints, PoolMembers: u.PoolMembers - v.PoolMembers,
	}
}

// Org is an org as GET /v1/org (the caller's) and GET /v1/orgs show it.
type Org struct {
	Name      string    `json:"name"`
	Quota     Quota     `json:"quota"`
	Use       OrgUse    `json:"use"`
	CreatedAt time.Time `json:"created_at"`
}

// OrgList is the body of GET /v1/orgs, by name.
type OrgList struct {
	Orgs []Org `json:"orgs"`
}

// CreateOrg is the body of POST /v1/orgs.
type CreateOrg struct {
	Name string `json:"name"`
}
