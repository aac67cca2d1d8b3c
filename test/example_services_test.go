package test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Example_services runs the service calls of the Go client against a real
// daemon: a service given at create, one defined later that is restarted
// on failure, its logs, stop, start and delete.
func Example_services() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{
		Name:     "services",
		Services: []api.Service{{Name: "web", Cmd: []string{"sh", "-c", "while :; do sleep 1; done"}}},
	}); err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "services")

	// A service that fails is restarted, with a growing backoff.
	if _, err := c.PutService(ctx, "services", api.Service{
		Name:    "flaky",
		Cmd:     []string{"sh", "-c", "echo trying; exit 1"},
		Restart: api.RestartOnFailure,
	}); err != nil {
		log.Fatal(err)
	}
	for {
		s, err := c.GetService(ctx, "services", "flaky")
		if err != nil {
			log.Fatal(err)
		}
		// Two restarts: at least two runs have ended, each logging.
		if s.Restarts >= 2 && s.State == api.ServiceBackoff {
			fmt.Println("flaky exited", *s.ExitCode, "and was restarted")
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Stop it; its logs hold the output of every run.
	if _, err := c.StopService(ctx, "services", "flaky"); err != nil {
		log.Fatal(err)
	}
	var logs strings.Builder
	if err := c.ServiceLogs(ctx, "services", "flaky", client.ServiceLogsOptions{Stdout: &logs}); err != nil {
		log.Fatal(err)
	}
	fmt.Println("runs logged:", strings.Count(logs.String(), "trying\n") >= 2)

	list, err := c.ListServices(ctx, "services")
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range list {
		fmt.Println(s.Name, s.State)
	}
	if err := c.DeleteService(ctx, "services", "flaky"); err != nil {
		log.Fatal(err)
	}
	// Output:
	// flaky exited 1 and was restarted
	// runs logged: true
	// flaky stopped
	// web running
}
