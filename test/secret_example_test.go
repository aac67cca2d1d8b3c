package test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Example_secrets is the Go example of secrets, run against a real daemon:
// store one, give it to a sandbox as env and as a file, and see that the
// sandbox shows which secret it has, never the value.
func Example_secrets() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.PutSecret(ctx, "example-token", "t0ps3cret"); err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSecret(ctx, "example-token", true)
	secrets, err := c.ListSecrets(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range secrets {
		fmt.Println("secret", s.Name) // names and times, never values
	}

	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{
		Name:        "vault",
		Secrets:     map[string]string{"TOKEN": "example-token"},
		SecretFiles: map[string]string{"/run/secrets/token": "example-token"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "vault")
	fmt.Println(sb.Secrets, sb.SecretFiles)

	out, _, _, err := c.Output(ctx, "vault", "sh", "-c", `echo "$TOKEN"; cat /run/secrets/token; echo; stat -c '%a %U' /run/secrets/token`)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(out))

	// In use: deleting it is a conflict unless forced.
	err = c.DeleteSecret(ctx, "example-token", false)
	fmt.Println(errors.Is(err, api.ErrConflict))
	// Output:
	// secret example-token
	// map[TOKEN:example-token] map[/run/secrets/token:example-token]
	// t0ps3cret
	// t0ps3cret
	// 400 loam
	// true
}
