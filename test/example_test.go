package test

import (
	"context"
	"fmt"
	"log"
	"os"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Example_checkpoints is the seed's Go example, run against a real daemon:
// take a checkpoint, restore it, fork it.
func Example_checkpoints() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "scratch"}); err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "scratch")

	cp, err := c.CreateCheckpoint(ctx, "scratch", api.CreateCheckpoint{Comment: "before upgrade"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(cp.ID, cp.Memory, cp.Comment)
	_, err = c.RestoreCheckpoint(ctx, "scratch", cp.ID)
	if err != nil {
		log.Fatal(err)
	}
	fork, err := c.Fork(ctx, "scratch", cp.ID, "scratch-2")
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, fork.ID)
	fmt.Println(fork.Name, fork.State, fork.From.Sandbox, fork.From.Checkpoint)

	code, err := c.Exec(ctx, "scratch-2", client.ExecOptions{
		Cmd:    []string{"sh", "-c", "echo hello from $LOAM_SANDBOX"},
		Stdout: os.Stdout,
	})
	if err != nil || code != 0 {
		log.Fatal(code, err)
	}
	if err := c.DeleteCheckpoint(ctx, "scratch", cp.ID); err != nil {
		log.Fatal(err)
	}
	cps, err := c.ListCheckpoints(ctx, "scratch")
	if err != nil {
		log.Fatal(err)
	}
	for _, cp := range cps {
		fmt.Println(cp.ID, cp.Auto, cp.Comment)
	}
	// Output:
	// v1 true before upgrade
	// scratch-2 running scratch v1
	// hello from scratch-2
	// auto-1 true before restoring v1
}
