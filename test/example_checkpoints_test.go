package test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Example_checkpointKinds takes both kinds of checkpoint from Go, against a
// real daemon: a memory checkpoint brings processes back running where
// they were, a disk-only one brings back the disk on a fresh boot. Then it
// forks the memory checkpoint into a sandbox with its own env and labels.
func Example_checkpointKinds() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "journal"}); err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "journal")
	// show prints the state file and whether the background sleep runs
	// (looked for by its command line: a fresh boot may reuse its pid).
	show := func(sandbox string) {
		out, _, _, err := c.Output(ctx, sandbox, "sh", "-c", `cat state.txt
			if grep -qs '[s]leep.1000' /proc/[0-9]*/cmdline; then echo "sleep runs"; else echo "no sleep"; fi`)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Print(sandbox, ": ", string(out))
	}
	if _, _, _, err := c.Output(ctx, "journal", "sh", "-c", "echo v1 > state.txt; sleep 1000 >/dev/null 2>&1 &"); err != nil {
		log.Fatal(err)
	}

	mem, err := c.CreateCheckpoint(ctx, "journal", api.CreateCheckpoint{Comment: "v1, sleeping"})
	if err != nil {
		log.Fatal(err)
	}
	diskOnly := false
	disk, err := c.CreateCheckpoint(ctx, "journal", api.CreateCheckpoint{Comment: "v1, disk", Memory: &diskOnly})
	if err != nil {
		log.Fatal(err)
	}
	got, err := c.GetCheckpoint(ctx, "journal", disk.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(mem.ID, mem.Memory, "|", got.ID, got.Memory, got.Comment)

	if _, _, _, err := c.Output(ctx, "journal", "sh", "-c", "echo v2 > state.txt"); err != nil {
		log.Fatal(err)
	}
	show("journal")
	sb, err := c.RestoreCheckpoint(ctx, "journal", disk.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("restored", disk.ID, sb.State)
	show("journal")
	if _, err := c.RestoreCheckpoint(ctx, "journal", mem.ID); err != nil {
		log.Fatal(err)
	}
	fmt.Println("restored", mem.ID)
	show("journal")

	// Each restore kept the state before it as an automatic checkpoint.
	cps, err := c.ListCheckpoints(ctx, "journal")
	if err != nil {
		log.Fatal(err)
	}
	for _, cp := range cps {
		fmt.Println(cp.ID, cp.Memory, cp.Auto, cp.Comment)
	}

	// A fork is a new sandbox with the checkpoint's processes and disk, and
	// its own env and labels. Its template comes from the checkpoint.
	fork, err := c.ForkWith(ctx, "journal", mem.ID, api.CreateSandbox{
		Name:   "journal-2",
		Env:    map[string]string{"STAGE": "test"},
		Labels: map[string]string{"forked": "yes"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, fork.ID)
	fmt.Println(fork.Name, fork.State, fork.Template, fork.Labels, fork.From.Sandbox, fork.From.Checkpoint)
	show("journal-2")
	out, _, _, err := c.Output(ctx, "journal-2", "sh", "-c", "echo STAGE=$STAGE")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(out))
	_, err = c.ForkWith(ctx, "journal", mem.ID, api.CreateSandbox{Template: "base"})
	fmt.Println("fork with a template is invalid:", errors.Is(err, api.ErrInvalid))

	if err := c.DeleteCheckpoint(ctx, "journal", disk.ID); err != nil {
		log.Fatal(err)
	}
	_, err = c.GetCheckpoint(ctx, "journal", disk.ID)
	fmt.Println(disk.ID, "deleted:", errors.Is(err, api.ErrNotFound))
	// Output:
	// v1 true | v2 false v1, disk
	// journal: v2
	// sleep runs
	// restored v2 running
	// journal: v1
	// no sleep
	// restored v1
	// journal: v1
	// sleep runs
	// v1 true false v1, sleeping
	// v2 false false v1, disk
	// auto-1 true true before restoring v2
	// auto-2 true true before restoring v1
	// journal-2 running busybox map[forked:yes] journal v1
	// journal-2: v1
	// sleep runs
	// STAGE=test
	// fork with a template is invalid: true
	// v2 deleted: true
}
