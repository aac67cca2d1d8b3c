package quota

import (
	"errors"
	"testing"

	"loam.dev/loam/api"
)

func ptr[T any](v T) *T { return &v }

func TestCheck(t *testing.T) {
	q := api.Quota{Sandboxes: ptr(3), MemoryMiB: ptr(16 << 10), CPUs: ptr(4.0), DiskMiB: ptr(20 << 10), Checkpoints: ptr(10), PoolMembers: ptr(2)}
	use := api.OrgUse{Sandboxes: 2, MemoryMiB: 14 << 10, CPUs: 3, DiskMiB: 10 << 10, Checkpoints: 10, PoolMembers: 2}
	for _, tc := range []struct {
		name string
		q    api.Quota
		add  api.OrgUse
		want string // "" for admitted
	}{
		{"fits", q, api.OrgUse{Sandboxes: 1, MemoryMiB: 2 << 10, CPUs: 1, DiskMiB: 1024}, ""},
		{"sandboxes", q, api.OrgUse{Sandboxes: 2}, "org docs would run 4 sandboxes, its quota is 3; stop, sleep or delete a sandbox, or ask the operator to raise it"},
		{"memory", q, api.OrgUse{Sandboxes: 1, MemoryMiB: 4 << 10}, "org docs would use 18 GiB of memory, its quota is 16 GiB; stop, sleep or delete a sandbox, or ask the operator to raise it"},
		{"cpus", q, api.OrgUse{CPUs: 1.5}, "org docs would use 4.5 CPUs, its quota is 4; stop, sleep or delete a sandbox, or ask the operator to raise it"},
		{"disk", q, api.OrgUse{DiskMiB: 10<<10 + 512}, "org docs would hold 20992 MiB of disk, its quota is 20 GiB; delete a sandbox, checkpoints or templates, or ask the operator to raise it"},
		{"checkpoints", q, api.OrgUse{Checkpoints: 1}, "org docs would keep 11 checkpoints, its quota is 10; delete a checkpoint, or ask the operator to raise it"},
		{"pool members", q, api.OrgUse{PoolMembers: 1}, "org docs would keep 3 warm-pool members, its quota is 2; shrink a pool, or ask the operator to raise it"},
		// Already at the checkpoint quota: what adds none is let through.
		{"adds nothing over", q, api.OrgUse{Sandboxes: 1}, ""},
		{"unlimited", api.Quota{}, api.OrgUse{Sandboxes: 100, MemoryMiB: 1 << 30, CPUs: 99}, ""},
		{"zero", api.Quota{Sandboxes: ptr(0)}, api.OrgUse{Sandboxes: 1}, "org docs would run 3 sandboxes, its quota is 0; stop, sleep or delete a sandbox, or ask the operator to raise it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check("docs", tc.q, use, tc.add)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != api.CodeLimit || ae.Message != tc.want {
				t.Fatalf("got %v\nwant limit: %s", err, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	if err := Validate(api.Quota{Sandboxes: ptr(0), CPUs: ptr(0.5)}); err != nil {
		t.Errorf("a zero and a fraction: %v", err)
	}
	for _, q := range []api.Quota{{Sandboxes: ptr(-1)}, {MemoryMiB: ptr(-5)}, {CPUs: ptr(-0.1)}, {PoolMembers: ptr(-1)}} {
		if err := Validate(q); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("%+v: %v, want invalid", q, err)
		}
	}
}
