package test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Example_sandboxes is the life of a sandbox from Go, against a real daemon:
// create one with env, labels, an idle timeout and a network policy, find it
// by its labels, put it to sleep and wake it with its processes, and delete
// it.
func Example_sandboxes() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Health(ctx); err != nil {
		log.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{
		Name:    "box",
		Env:     map[string]string{"GREETING": "hi"},
		Labels:  map[string]string{"owner": "docs", "team": "red"},
		Idle:    "10m",
		Network: &api.NetworkPolicy{Egress: api.EgressNone, Allow: []string{"192.0.2.0/24"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "box") // in case the example fails half-way
	fmt.Println(sb.Name, sb.State, sb.Template, sb.Idle, sb.Labels, sb.Network.Egress, sb.Network.Allow)

	sbs, err := c.ListSandboxes(ctx, client.ListOptions{Labels: map[string]string{"team": "red"}})
	if err != nil {
		log.Fatal(err)
	}
	for _, sb := range sbs {
		fmt.Println("labelled team=red:", sb.Name)
	}

	// A private sandbox's URL opens with its access token.
	at, err := c.AccessToken(ctx, "box")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("access token:", at.URL == sb.URL, at.AccessToken != "")

	// A process started before the sandbox sleeps is still there once it
	// wakes: sleep keeps memory, not only disk.
	out, _, _, err := c.Output(ctx, "box", "sh", "-c", `sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/pid; echo "$GREETING"`)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(out))
	slept, err := c.Sleep(ctx, "box")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(slept.State)
	woke, err := c.Wake(ctx, "box")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(woke.State)
	out, _, code, err := c.Output(ctx, "box", "sh", "-c", `[ -d /proc/$(cat /tmp/pid) ] && echo "sleep 1000 still runs"`)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(out))
	fmt.Println("exit", code)

	if err := c.DeleteSandbox(ctx, "box"); err != nil {
		log.Fatal(err)
	}
	_, err = c.GetSandbox(ctx, "box")
	fmt.Println("after delete, not found:", errors.Is(err, api.ErrNotFound))
	// Output:
	// box running busybox 10m map[owner:docs team:red] none [192.0.2.0/24]
	// labelled team=red: box
	// access token: true true
	// hi
	// sleeping
	// running
	// sleep 1000 still runs
	// exit 0
	// after delete, not found: true
}

// Example_templates lists the templates a sandbox can be made from; the
// default is the one a create without a template or an image gets.
func Example_templates() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	tpls, err := c.Templates(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range tpls {
		fmt.Println(t.Name, "default:", t.Default)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "plain"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, sb.ID)
	fmt.Println(sb.Name, "is made from", sb.Template)
	// Output:
	// base default: false
	// busybox default: true
	// plain is made from busybox
}
