package daemon

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	"loam.dev/loam/internal/cluster"
)

// pinFeatures reads runsc's build and this host's CPU features once, for
// all that needs them (the node's load, the stored checkpoints'
// manifests, the pin), and sets d.cpuPin (see pinCPUFeatures); a front
// end boots no sandbox.
func (d *Daemon) pinFeatures(ctx context.Context, p *parts) error {
	d.runscVersion = runscBuild(ctx, p.runsc)
	if d.frontEnd() {
		return nil
	}
	d.hostFeatures = runscCPUFeatures(ctx, p.runsc)
	pin, err := d.pinCPUFeatures()
	if err != nil {
		return err
	}
	d.cpuPin = pin
	return nil
}

// runscCPUFeatures are this host's CPU features as gVisor names them
// (`runsc cpu-features`): the names the sandboxes' annotation takes, and
// a node's load reports. nil when runsc cannot say.
func runscCPUFeatures(ctx context.Context, runsc string) []string {
	if runsc == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, runsc, "cpu-features").Output()
	if err != nil {
		return nil
	}
	var fs []string
	for f := range strings.SplitSeq(strings.TrimSpace(string(out)), ",") {
		if f != "" {
			fs = append(fs, f)
		}
	}
	return fs
}

// pinCPUFeatures checks the operator's --cpu-features against the host's
// (every name must be one gVisor knows: an unknown one would fail every
// sandbox's boot) and returns what the core asks for each boot
// (sandbox.Config.CPUFeatures): the operator's list, else in a cluster
// the features every node that runs sandboxes has, else nil (all of the
// host's).
func (d *Daemon) pinCPUFeatures() (func() []string, error) {
	host := d.hostFeatures
	if d.cfg.CPUFeatures != "" {
		var want []string
		for f := range strings.SplitSeq(d.cfg.CPUFeatures, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			if host != nil && !slices.Contains(host, f) {
				return nil, fmt.Errorf("--cpu-features: %q is not a feature of this host's CPU (runsc cpu-features lists them)", f)
			}
			want = append(want, f)
		}
		if len(want) == 0 {
			return nil, fmt.Errorf("--cpu-features: no feature given")
		}
		return func() []string { return want }, nil
	}
	if host == nil || d.cfg.Node == "" {
		return nil, nil
	}
	// The cluster is joined later (opening storage); boots come after.
	return func() []string {
		if d.member == nil {
			return host
		}
		return commonCPUFeatures(host, d.member)
	}, nil
}

// commonCPUFeatures are the features of host that every other node that
// runs sandboxes reports too, as the last reading of the nodes has them
// (a node that reports none, a front end, or one whose runsc could not
// say, is left out).
func commonCPUFeatures(host []string, m *cluster.Member) []string {
	nodes, _ := m.Nodes()
	out := slices.Clone(host)
	for _, n := range nodes {
		if n.Name == m.Name() || n.Load.Role == cluster.RoleAPI || len(n.Load.CPUFeatures) == 0 {
			continue
		}
		out = slices.DeleteFunc(out, func(f string) bool { return !slices.Contains(n.Load.CPUFeatures, f) })
	}
	return out
}
