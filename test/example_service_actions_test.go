package test

import (
	"context"
	"fmt"
	"io"
	"log"
	"strings"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Example_serviceActions stops, starts and restarts a service from Go,
// against a real daemon, following its logs (which run on across its runs)
// to see each run begin.
func Example_serviceActions() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "workers"}); err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "workers")

	// started waits until the service's logs hold n lines "start ticker":
	// a start returns once the service is started, not once its command
	// has run.
	started := func(n int) {
		fctx, stop := context.WithCancel(ctx)
		defer stop()
		logs := &onOutput{w: io.Discard, when: strings.Repeat("start ticker\n", n), do: stop}
		if err := c.ServiceLogs(fctx, "workers", "ticker", client.ServiceLogsOptions{Stdout: logs, Follow: true}); err != nil {
			log.Fatal(err)
		}
		st, err := c.GetService(ctx, "workers", "ticker")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("run", n, st.State)
	}

	if _, err := c.PutService(ctx, "workers", api.Service{
		Name: "ticker",
		Cmd:  []string{"sh", "-c", `echo "start $WHAT"; while :; do sleep 1; done`},
		Env:  map[string]string{"WHAT": "ticker"},
	}); err != nil {
		log.Fatal(err)
	}
	started(1)
	st, err := c.StopService(ctx, "workers", "ticker")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stopped:", st.State, "exit", *st.ExitCode) // 128+SIGTERM
	if _, err := c.StartService(ctx, "workers", "ticker"); err != nil {
		log.Fatal(err)
	}
	started(2)
	if _, err := c.RestartService(ctx, "workers", "ticker"); err != nil {
		log.Fatal(err)
	}
	started(3)
	// Output:
	// run 1 running
	// stopped: stopped exit 143
	// run 2 running
	// run 3 running
}
