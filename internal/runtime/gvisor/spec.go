package gvisor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/runtime"
)

// Files in a bundle directory.
const (
	configFile   = "config.json"
	initLogFile  = "init.log"
	runscLogFile = "runsc.log"
	debugDir     = "debug"
)

// CgroupParent is the cgroup (in every v1 hierarchy, or under the v2 root)
// that each container's cgroup is made in: CgroupParent/<id>.
const CgroupParent = "/loam"

// QuotaAnnotation is the OCI annotation that gives runsc the sysfs
// directory of the btrfs qgroup limiting the container's rootfs
// (Spec.DiskQuota). loam's patched runsc (tools/runsc/patches/
// 0003-statfs-qgroup.patch) reads the qgroup's counters there for statfs of
// /, so that df inside the sandbox shows its disk limit, not the whole
// pool; an unpatched runsc ignores it.
const QuotaAnnotation = "dev.loam.qgroup"

// CPUFeaturesAnnotation is gVisor's annotation of the CPU features a
// sandbox may see (Spec.CPUFeatures): the sentry offers the host's
// features that are in it, and no other.
const CPUFeaturesAnnotation = "dev.gvisor.internal.cpufeatures"

// cfsPeriod is the CPU quota period in microseconds (the kernel's default).
const cfsPeriod = 100000

// maxFiles is init's RLIMIT_NOFILE, what Docker and Kubernetes give a
// container. It is enforced by gVisor's kernel, not the host's, so it is not
// bounded by the daemon's own limit; each open file of the sandbox is an
// object in the sandbox's memory, charged to its memory limit.
const maxFiles = 1 << 20

// processes is init's RLIMIT_NPROC, which every process inherits: the
// tasks (threads included) one user of the sandbox may have, as Linux counts
// them. Past it, fork and clone fail with EAGAIN. gVisor's systrap platform
// backs each address space of a sandbox with host processes (about 3.5 host
// tasks per sandbox process, measured), charged to the sandbox's memory
// cgroup, so the limit follows the memory limit: a fork bomb of 1,000
// sleepers killed a 512 MiB sandbox outright, and 512 a 256 MiB one, while
// 500 left a 512 MiB one answering. One process per MiB of memory, 128 to
// 4,096 (4,096 without a memory limit; AWS Lambda allows 1,024). The
// agent, which keeps CAP_SYS_ADMIN, is exempt, so the sandbox stays
// manageable. The limit is part of each process's kernel state: a
// checkpoint keeps it, and a restored or forked sandbox has it too.
func processes(memoryMiB int) uint64 {
	if memoryMiB <= 0 {
		return 4096
	}
	return uint64(min(max(memoryMiB, 128), 4096))
}

// defaultPath is init's PATH when Spec.Env does not set one, so that the
// agent finds commands by name like a login shell would.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// capabilities is init's capability set: Docker's default, which lets the
// agent (root) change users and own files for the processes it starts, plus
// CAP_SYS_PTRACE so that debuggers and strace work inside the sandbox.
// gVisor drops CAP_NET_RAW unless runsc runs with --net-raw.
var capabilities = []string{
	"CAP_AUDIT_WRITE",
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_MKNOD",
	"CAP_NET_BIND_SERVICE",
	"CAP_NET_RAW",
	"CAP_SETFCAP",
	"CAP_SETGID",
	"CAP_SETPCAP",
	"CAP_SETUID",
	"CAP_SYS_CHROOT",
	"CAP_SYS_PTRACE",
}

// checkSpec refuses a spec runsc would fail on later, or in a confusing way.
func checkSpec(spec runtime.Spec) error {
	if err := checkID(spec.ID); err != nil {
		return err
	}
	for _, p := range []struct{ name, path string }{
		{"bundle dir", spec.BundleDir},
		{"rootfs", spec.Rootfs},
		{"netns", spec.Netns},
		{"agent binary", spec.AgentBinary},
	} {
		if !filepath.IsAbs(p.path) {
			return fmt.Errorf("%s %q is not an absolute path", p.name, p.path)
		}
	}
	if spec.CPUs < 0 || spec.MemoryMiB < 0 {
		return fmt.Errorf("negative limits: %g CPUs, %d MiB", spec.CPUs, spec.MemoryMiB)
	}
	// runsc says less clearly what is missing, if at all.
	if st, err := os.Stat(spec.Rootfs); err != nil {
		return fmt.Errorf("checking rootfs: %w", err)
	} else if !st.IsDir() {
		return fmt.Errorf("rootfs %s is not a directory", spec.Rootfs)
	}
	if st, err := os.Stat(spec.AgentBinary); err != nil {
		return fmt.Errorf("checking agent binary: %w", err)
	} else if !st.Mode().IsRegular() {
		return fmt.Errorf("agent binary %s is not a regular file", spec.AgentBinary)
	}
	if _, err := os.Stat(spec.Netns); err != nil {
		return fmt.Errorf("checking network namespace: %w", err)
	}
	return nil
}

// checkID refuses ids runsc would refuse, and so ids with characters that
// mean something in a file name glob.
func checkID(id string) error {
	if id == "" {
		return fmt.Errorf("empty container id")
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.+", r)
		if !ok {
			return fmt.Errorf("container id %q has a character other than letters, digits and -_.+", id)
		}
	}
	return nil
}

// ociSpec is the OCI runtime spec of a container for spec.
func ociSpec(spec runtime.Spec) *specs.Spec {
	env := spec.Env
	hasPath := false
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			hasPath = true
		}
	}
	if !hasPath {
		env = append([]string{defaultPath}, env...)
	}
	// CAP_SYS_ADMIN is init's alone: the agent keeps it to rename the
	// sandbox (a warm pool's member taking a request's name) and drops it
	// from the bounding set of everything it starts (agent.Run).
	initCaps := append(append([]string(nil), capabilities...), "CAP_SYS_ADMIN")
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Terminal: false,
			User:     specs.User{UID: 0, GID: 0},
			Args:     append([]string(nil), runtime.AgentArgs...),
			Env:      env,
			Cwd:      "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  initCaps,
				Effective: initCaps,
				Permitted: initCaps,
			},
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: maxFiles, Soft: maxFiles},
				{Type: "RLIMIT_NPROC", Hard: processes(spec.MemoryMiB), Soft: processes(spec.MemoryMiB)},
			},
		},
		Root:     &specs.Root{Path: spec.Rootfs, Readonly: false},
		Hostname: spec.Hostname,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			// The single file is mounted; gVisor makes the mount point
			// (an empty file) in the rootfs if it is missing.
			{Destination: runtime.AgentPath, Type: "bind", Source: spec.AgentBinary, Options: []string{"rbind", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: CgroupParent + "/" + spec.ID,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: spec.Netns},
			},
		},
	}
	if spec.DiskQuota != "" {
		s.Annotations = map[string]string{QuotaAnnotation: spec.DiskQuota}
	}
	if len(spec.CPUFeatures) > 0 {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[CPUFeaturesAnnotation] = strings.Join(spec.CPUFeatures, ",")
	}
	if spec.MemoryMiB > 0 || spec.CPUs > 0 {
		res := &specs.LinuxResources{}
		if spec.MemoryMiB > 0 {
			limit := int64(spec.MemoryMiB) << 20
			res.Memory = &specs.LinuxMemory{Limit: &limit}
		}
		if spec.CPUs > 0 {
			period := uint64(cfsPeriod)
			quota := quotaMicros(spec.CPUs)
			res.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
		}
		s.Linux.Resources = res
	}
	return s
}

// writeBundle writes spec's config.json into its bundle directory, whole
// or not at all, so that a crashed daemon never leaves a half-written config
// for runsc to find. It is not synced: runsc copies the spec into its own
// state at start, and a host crash ends the container anyway.
func writeBundle(spec runtime.Spec) error {
	if err := os.MkdirAll(spec.BundleDir, 0o700); err != nil {
		return fmt.Errorf("making bundle dir: %w", err)
	}
	b, err := json.MarshalIndent(ociSpec(spec), "", "  ")
	if err != nil {
		return fmt.Errorf("encoding OCI spec: %w", err)
	}
	if err := atomicfile.Replace(filepath.Join(spec.BundleDir, configFile), bytes.NewReader(b), 0o600); err != nil {
		return fmt.Errorf("writing OCI spec: %w", err)
	}
	return nil
}
