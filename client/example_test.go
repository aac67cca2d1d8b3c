package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// These examples need a loam daemon (LOAM_API_URL and LOAM_TOKEN, or the
// local daemon's files), so they are compiled but not run by go test here.
// The end-to-end tests (package test) run examples of every call of the
// client against a real daemon, each checked against its output:
// Example_sandboxes, Example_templates, Example_checkpoints (these lines),
// Example_checkpointKinds, Example_exec, Example_sessions,
// Example_sessionsResume, Example_services, Example_serviceActions,
// Example_files, Example_filesTree, Example_ports, Example_secrets and
// Example_network. TestEveryRouteHasAClientCall checks that the client has a
// call for every route of the API.

func Example() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{
		Name:   "scratch",
		Labels: map[string]string{"owner": "docs"},
	})
	if err != nil {
		log.Fatal(err)
	}
	stdout, _, code, err := c.Output(ctx, sb.Name, "sh", "-c", "echo hello from $(hostname)")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s (exit %d)", stdout, code)
}

// Take a checkpoint, roll back to it, and start a second sandbox from it.
func ExampleClient_CreateCheckpoint() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}

	cp, err := c.CreateCheckpoint(ctx, "scratch", api.CreateCheckpoint{Comment: "before upgrade"})
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.RestoreCheckpoint(ctx, "scratch", cp.ID)
	if err != nil {
		log.Fatal(err)
	}
	fork, err := c.Fork(ctx, "scratch", cp.ID, "scratch-2")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(fork.Name, fork.State)
}

// A disk-only checkpoint doesn't pause the sandbox; restoring it boots fresh.
func ExampleClient_CreateCheckpoint_diskOnly() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	memory := false
	cp, err := c.CreateCheckpoint(ctx, "scratch", api.CreateCheckpoint{Comment: "disk only", Memory: &memory})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(cp.ID, cp.Memory)
}

// A fork has its own env and labels; its template, image and resources come
// from the checkpoint.
func ExampleClient_ForkWith() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	fork, err := c.ForkWith(ctx, "scratch", "v1", api.CreateSandbox{
		Name:   "scratch-2",
		Labels: map[string]string{"owner": "docs"},
		Env:    map[string]string{"STAGE": "test"},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(fork.Name, fork.From.Checkpoint)
}

// Many forks of one checkpoint at once, named scratch-1 … scratch-3; each
// has its sandbox or its own error.
func ExampleClient_ForkMany() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	list, err := c.ForkMany(ctx, "scratch", "v1", api.CreateSandbox{Name: "scratch", Count: 3})
	if err != nil {
		log.Fatal(err) // none was made
	}
	for _, f := range list.Forks {
		if f.Error != nil {
			fmt.Println(f.Name, f.Error)
			continue
		}
		fmt.Println(f.Sandbox.Name, f.Sandbox.State)
	}
}

func ExampleClient_ListCheckpoints() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	cps, err := c.ListCheckpoints(ctx, "scratch")
	if err != nil {
		log.Fatal(err)
	}
	for _, cp := range cps {
		fmt.Println(cp.ID, cp.Memory, cp.Auto, cp.Comment)
	}
}

// API errors match the sentinels in package api whatever their message.
func ExampleClient_GetCheckpoint() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.GetCheckpoint(ctx, "scratch", "v99")
	if errors.Is(err, api.ErrNotFound) {
		fmt.Println("no checkpoint v99")
	}
}

// Exec streams a command's stdin, stdout and stderr and returns its exit status.
func ExampleClient_Exec() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	code, err := c.Exec(ctx, "scratch", client.ExecOptions{
		Cmd:    []string{"sh", "-c", "cat /home/loam/state.txt; pgrep -a python3"},
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	})
	switch {
	case errors.Is(err, client.ErrStreamEnded):
		log.Fatal("the sandbox was checkpointed or restored while the command ran")
	case err != nil:
		log.Fatal(err)
	}
	fmt.Println("exit", code)
}

func ExampleClient_ListSandboxes() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	sbs, err := c.ListSandboxes(ctx, client.ListOptions{Labels: map[string]string{"owner": "docs"}})
	if err != nil {
		log.Fatal(err)
	}
	for _, sb := range sbs {
		fmt.Println(sb.Name, sb.State, sb.URL)
	}
}
