package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/runtime/gvisor"
	"loam.dev/loam/internal/store"
)

// subnetFile, in the data dir, records the --subnet of the daemon that last
// ran on it, so that a teardown drops that daemon's firewall table and no
// other daemon's, whatever --subnet it is given.
const subnetFile = "subnet"

// storeFile, in the data dir, is the metadata store.
const storeFile = "loam.db"

// Inventory is what a teardown of a data dir takes down.
type Inventory struct {
	// DataDir is the data dir, its symlinks resolved.
	DataDir string
	// Sandboxes are the ids of the sandboxes that have a directory in it.
	Sandboxes []string
	// Containers are the ids of the runsc containers it has state for.
	Containers []string
	// Table is the nftables table of its daemon's firewall.
	Table string
}

// String says what the teardown will do, for a confirmation.
func (inv Inventory) String() string {
	return fmt.Sprintf("take down data dir %s: delete its %d sandboxes (%d containers to stop) with their checkpoints and templates, "+
		"destroy its disk pool (unmount it, detach its loop device), drop firewall table %s, and remove the data dir",
		inv.DataDir, len(inv.Sandboxes), len(inv.Containers), inv.Table)
}

// Teardown takes a data dir down completely, as if no daemon had ever run
// on it: it stops every sandbox's runsc container (and removes its
// cgroups), deletes the sandboxes' network namespaces and veths, drops the
// daemon's nftables table, unmounts runsc's null-netns, destroys the disk
// pool (unmounts it and detaches its loop device), unmounts anything else
// mounted below the data dir, and removes the data dir. A daemon's stop
// leaves all but the files in place on purpose (its sandboxes run on, and
// the next start takes them back); this is for when the data dir is done.
//
// It takes the data dir's lock first, so it refuses (ErrDataDirInUse) while
// a daemon runs on it. confirm is called with the inventory once the lock
// is held and before anything changes; an error from it stops the
// teardown. cfg gives the data dir, runsc, and the subnet to fall back on
// when the data dir does not record its own (a data dir of a loam from
// before the record).
func Teardown(ctx context.Context, cfg Config, log *slog.Logger, confirm func(Inventory) error) error {
	if os.Geteuid() != 0 {
		return errors.New("loam serve --teardown must run as root (it unmounts, deletes network namespaces and firewall tables)")
	}
	dir := cfg.DataDir
	// Never a directory that is not a data dir: a mistyped --data-dir must
	// not be removed.
	_, err := os.Stat(filepath.Join(dir, storeFile))
	if errors.Is(err, fs.ErrNotExist) {
		_, err = os.Stat(filepath.Join(dir, recordsFile))
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s is no loam data dir (it has no %s or %s): nothing torn down", dir, storeFile, recordsFile)
		}
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	unlock, err := lockDataDir(dir, log)
	if err != nil {
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	defer unlock()
	// A data dir whose records are in PostgreSQL takes its sandboxes'
	// records with it, from the database it names (and only that one).
	records, err := teardownRecords(ctx, cfg)
	if err != nil {
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	if records != nil {
		defer records.Close()
	}
	if dir, err = canonicalDir(dir); err != nil {
		return err
	}
	subnet, err := recordedSubnet(dir, cfg.Subnet)
	if err != nil {
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	nets, err := network.New(network.Config{Subnet: subnet, InsidePort: network.DefaultInsidePort, Node: cfg.Node, Log: log})
	if err != nil {
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	runsc, err := findRunsc(cfg.Runsc)
	if err != nil {
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	rt, err := gvisor.New(gvisor.Config{Runsc: runsc, Root: filepath.Join(dir, "runsc"), Logger: log})
	if err != nil {
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	inv := Inventory{DataDir: dir, Table: network.TableName(subnet)}
	if inv.Containers, err = rt.List(); err != nil {
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	entries, err := os.ReadDir(filepath.Join(dir, "sandboxes"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "sb-") {
			inv.Sandboxes = append(inv.Sandboxes, e.Name())
		}
	}
	if err := confirm(inv); err != nil {
		return err
	}

	// The containers first: they hold the namespaces, the pool's files and
	// their cgroups.
	var errs []error
	for _, id := range inv.Containers {
		log.Info("stopping sandbox", "container", id)
		errs = append(errs, rt.Delete(ctx, id))
	}
	for _, id := range inv.Sandboxes {
		ep, err := nets.Endpoint(id, 0) // the names do not depend on the slot
		if err == nil {
			err = nets.Delete(ctx, ep)
		}
		errs = append(errs, err)
	}
	errs = append(errs, nets.Firewall().Remove(ctx), rt.Close())
	if err := errors.Join(errs...); err != nil {
		// Nothing is unmounted or removed while a sandbox may still run.
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	if err := disk.Destroy(ctx, filepath.Join(dir, "disk"), cfg.DiskSize); err != nil {
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	if err := disk.Teardown(ctx, dir); err != nil {
		return err
	}
	if records != nil {
		for _, id := range inv.Sandboxes {
			if err := records.DeleteSandbox(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("tearing down %s: deleting the record of sandbox %s: %w", dir, id, err)
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("tearing down %s: removing it: %w", dir, err)
	}
	log.Info("data dir taken down", "data_dir", dir, "sandboxes", len(inv.Sandboxes), "table", inv.Table)
	return nil
}

// confirmTeardown asks on the terminal before a teardown, unless yes; with
// no terminal to ask on it refuses, as the CLI's destructive commands do.
func confirmTeardown(cmd *cobra.Command, yes bool, inv Inventory) error {
	if yes {
		return nil
	}
	if !term.IsTerminal(int(os.Stdin.Fd())) || !term.IsTerminal(int(os.Stderr.Fd())) {
		return fmt.Errorf("cannot ask to confirm (not a terminal): pass --yes to %s", inv)
	}
	fmt.Fprintf(os.Stderr, "%s%s? [y/N] ", strings.ToUpper(inv.String()[:1]), inv.String()[1:])
	answer, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
	if err != nil && answer == "" {
		fmt.Fprintln(os.Stderr)
		return errors.New("cancelled")
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return errors.New("cancelled")
}

// recordedSubnet is the subnet the data dir's daemon ran with, or given
// when the data dir does not say.
func recordedSubnet(dir, given string) (netip.Prefix, error) {
	s := given
	if b, err := os.ReadFile(filepath.Join(dir, subnetFile)); err == nil {
		s = strings.TrimSpace(string(b))
	} else if !errors.Is(err, fs.ErrNotExist) {
		return netip.Prefix{}, err
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("subnet %q: %w", s, err)
	}
	return p, nil
}
