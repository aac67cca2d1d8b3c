package test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Example_network sets a sandbox's network policy from Go, against a real
// daemon: a sandbox made with no egress but one allowed prefix is opened
// to everything but one denied prefix, while it runs. A sandbox shows its
// policy; a fork takes its source's.
func Example_network() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{
		Name:    "walled",
		Network: &api.NetworkPolicy{Egress: api.EgressNone, Allow: []string{"192.0.2.0/24"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "walled")
	fmt.Println(sb.Name, sb.Network.Egress, "allow", sb.Network.Allow, "deny", sb.Network.Deny)

	sb, err = c.SetNetwork(ctx, "walled", api.NetworkPolicy{Egress: api.EgressAll, Deny: []string{"198.51.100.0/24"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sb.Name, sb.State, sb.Network.Egress, "allow", sb.Network.Allow, "deny", sb.Network.Deny)

	got, err := c.GetSandbox(ctx, "walled")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("get:", got.Network.Egress, got.Network.Deny)

	_, err = c.SetNetwork(ctx, "walled", api.NetworkPolicy{Egress: "some"})
	fmt.Println("egress \"some\" is invalid:", errors.Is(err, api.ErrInvalid))

	// A fork takes its source's policy unless it gives its own.
	cp, err := c.CreateCheckpoint(ctx, "walled", api.CreateCheckpoint{Comment: "open"})
	if err != nil {
		log.Fatal(err)
	}
	fork, err := c.Fork(ctx, "walled", cp.ID, "walled-2")
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, fork.ID)
	fmt.Println(fork.Name, fork.Network.Egress, fork.Network.Deny)
	// Output:
	// walled none allow [192.0.2.0/24] deny []
	// walled running all allow [] deny [198.51.100.0/24]
	// get: all [198.51.100.0/24]
	// egress "some" is invalid: true
	// walled-2 all [198.51.100.0/24]
}
