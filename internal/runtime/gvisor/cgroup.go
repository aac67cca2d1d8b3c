package gvisor

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"loam.dev/loam/internal/runtime"
)

// runsc makes each container's cgroup, CgroupParent/<id> in every v1
// hierarchy or under the v2 root, and sets the spec's limits in it at run
// and restore. It has no command to change them afterwards, so the driver
// reads and writes the cgroup's control files itself.

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// Control files of a cgroup, v1 and v2.
const (
	cpuQuotaV1  = "cpu.cfs_quota_us"
	cpuPeriodV1 = "cpu.cfs_period_us"
	cpuMaxV2    = "cpu.max"
	memLimitV1  = "memory.limit_in_bytes"
	memMaxV2    = "memory.max"
)

// memNoLimitV1 is the least value cgroup v1 reports for "no memory limit"
// (it reports the largest page count it can hold, in bytes).
const memNoLimitV1 = 1 << 62

// SetLimits makes the cgroup of a running or paused container hold l: it
// reads each limit back and writes those that differ. A limit of 0 is
// removed.
func (r *Runtime) SetLimits(ctx context.Context, id string, l runtime.Limits) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("setting limits of %s: %w", id, err)
	}
	if l.CPUs < 0 || l.MemoryMiB < 0 {
		return fmt.Errorf("setting limits of %s: negative limits: %g CPUs, %d MiB", id, l.CPUs, l.MemoryMiB)
	}
	if !r.exists(id) {
		return fmt.Errorf("setting limits of %s: %w", id, runtime.ErrNotExist)
	}
	if err := r.applyLimits(id, l); err != nil {
		return fmt.Errorf("setting limits of %s: %w", id, err)
	}
	return nil
}

// applyLimits makes container id's cgroup hold l.
func (r *Runtime) applyLimits(id string, l runtime.Limits) error {
	return errors.Join(r.setCPUQuota(id, l.CPUs), r.setMemoryLimit(id, l.MemoryMiB))
}

// cgroupFiles finds a control file of container id's cgroup: in each v1
// hierarchy whose name starts with controller and has the file (one
// hierarchy may be mounted under several names, as cpu and cpu,cpuacct),
// or else in its v2 cgroup. v1 says which.
func cgroupFiles(id, controller, v1File, v2File string) (paths []string, v1 bool) {
	m, _ := filepath.Glob(filepath.Join(cgroupRoot, controller+"*", CgroupParent, id, v1File))
	if len(m) > 0 {
		return m, true
	}
	return []string{filepath.Join(cgroupRoot, CgroupParent, id, v2File)}, false
}

// writeCgroupFile writes value into a cgroup control file; the default of
// Runtime.writeCgroup.
func writeCgroupFile(path, value string) error {
	return os.WriteFile(path, []byte(value), 0)
}

// quotaMicros is the CPU quota per cfsPeriod of cpus cores, or -1 (no
// quota) for 0.
func quotaMicros(cpus float64) int64 {
	if cpus <= 0 {
		return -1
	}
	return int64(math.Round(cpus * cfsPeriod))
}

// cpuMax reads container id's CPU quota and period in microseconds; the
// quota is -1 when there is none.
func cpuMax(id string) (quota, period int64, err error) {
	files, v1 := cgroupFiles(id, "cpu", cpuQuotaV1, cpuMaxV2)
	if v1 {
		if quota, err = readInt(files[0]); err != nil {
			return 0, 0, err
		}
		period, err = readInt(filepath.Join(filepath.Dir(files[0]), cpuPeriodV1))
		return quota, period, err
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("reading %s: unexpected content %q", files[0], b)
	}
	if period, err = strconv.ParseInt(f[1], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("reading %s: %w", files[0], err)
	}
	if f[0] == "max" {
		return -1, period, nil
	}
	if quota, err = strconv.ParseInt(f[0], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("reading %s: %w", files[0], err)
	}
	return quota, period, nil
}

// cpuQuota reads a container's CPU quota in cores; 0 when it has none.
func cpuQuota(id string) (float64, error) {
	quota, period, err := cpuMax(id)
	if err != nil || quota < 0 || period <= 0 {
		return 0, err
	}
	return float64(quota) / float64(period), nil
}

// setCPUQuota makes the CPU quota of container id's cgroup cpus cores, or
// none for 0, in every hierarchy that has a cpu controller. A cgroup that
// holds that quota already is left alone.
func (r *Runtime) setCPUQuota(id string, cpus float64) error {
	want := quotaMicros(cpus)
	if quota, period, err := cpuMax(id); err == nil && quota == want && (want < 0 || period == cfsPeriod) {
		return nil
	}
	files, v1 := cgroupFiles(id, "cpu", cpuQuotaV1, cpuMaxV2)
	if !v1 {
		max := strconv.FormatInt(want, 10)
		if want < 0 {
			max = "max"
		}
		if err := r.writeCgroup(files[0], fmt.Sprintf("%s %d", max, cfsPeriod)); err != nil {
			return fmt.Errorf("setting CPU quota: %w", err)
		}
		return nil
	}
	for _, f := range files {
		if err := r.writeCgroup(filepath.Join(filepath.Dir(f), cpuPeriodV1), strconv.Itoa(cfsPeriod)); err != nil {
			return fmt.Errorf("setting CPU period: %w", err)
		}
		if err := r.writeCgroup(f, strconv.FormatInt(want, 10)); err != nil {
			return fmt.Errorf("setting CPU quota: %w", err)
		}
	}
	return nil
}

// memoryMax reads container id's memory limit in bytes; -1 when it has
// none.
func memoryMax(id string) (int64, error) {
	files, v1 := cgroupFiles(id, "memory", memLimitV1, memMaxV2)
	b, err := os.ReadFile(files[0])
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", files[0], err)
	}
	if v1 && n >= memNoLimitV1 {
		return -1, nil
	}
	return n, nil
}

// setMemoryLimit makes the memory limit of container id's cgroup mib MiB,
// or none for 0. A cgroup that holds that limit already is left alone: a
// write makes the kernel reclaim memory down to the limit.
func (r *Runtime) setMemoryLimit(id string, mib int) error {
	want := int64(mib) << 20
	if mib <= 0 {
		want = -1
	}
	if limit, err := memoryMax(id); err == nil && limit == want {
		return nil
	}
	files, v1 := cgroupFiles(id, "memory", memLimitV1, memMaxV2)
	value := strconv.FormatInt(want, 10)
	if want < 0 && !v1 {
		value = "max"
	}
	for _, f := range files {
		if err := r.writeCgroup(f, value); err != nil {
			return fmt.Errorf("setting memory limit: %w", err)
		}
	}
	return nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", path, err)
	}
	return n, nil
}

// removeCgroups removes the container's cgroups, if any are left: runsc
// makes them before it has state for the container, so after a failed
// start it has nothing to delete them by. Best effort: one still in use
// stays.
func removeCgroups(id string) {
	dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", CgroupParent, id))
	dirs = append(dirs, filepath.Join(cgroupRoot, CgroupParent, id)) // cgroup v2
	for _, d := range dirs {
		_ = unix.Rmdir(d)
	}
}

// MemoryBytes is the host memory container id's cgroup holds now (its
// usage, page cache included: what the host would have to find to keep
// it).
func (r *Runtime) MemoryBytes(id string) (int64, error) {
	files, _ := cgroupFiles(id, "memory", "memory.usage_in_bytes", "memory.current")
	b, err := os.ReadFile(files[0])
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", files[0], err)
	}
	return n, nil
}

// CPUSeconds is the CPU time container id's cgroup has used
// (cpuacct.usage on cgroup v1, in nanoseconds; cpu.stat's usage_usec on
// v2).
func (r *Runtime) CPUSeconds(id string) (float64, error) {
	files, v1 := cgroupFiles(id, "cpuacct", "cpuacct.usage", "cpu.stat")
	if v1 {
		ns, err := readInt(files[0])
		if err != nil {
			return 0, err
		}
		return float64(ns) / 1e9, nil
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "usage_usec "); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("reading %s: %w", files[0], err)
			}
			return float64(us) / 1e6, nil
		}
	}
	return 0, fmt.Errorf("reading %s: no usage_usec", files[0])
}

// OOMKills is how many times the kernel's OOM killer has killed a process
// of container id's cgroup (memory.oom_control's oom_kill on cgroup v1,
// memory.events' on v2): it tells a sandbox that ran out of memory from
// one killed from outside, both of which end with SIGKILL.
func (r *Runtime) OOMKills(id string) (int64, error) {
	files, _ := cgroupFiles(id, "memory", "memory.oom_control", "memory.events")
	b, err := os.ReadFile(files[0])
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "oom_kill "); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, nil
}
