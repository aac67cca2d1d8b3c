package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Example_checkpointTemplates keeps checkpoints as templates, against a real
// daemon: a disk-only one (sandboxes of it boot fresh on its files) and a
// memory one (sandboxes of it start with its processes running, like
// forks); a template outlives its sandbox; it moves to another daemon as
// one archive, and a damaged archive is refused.
func Example_checkpointTemplates() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "prep"}); err != nil {
		log.Fatal(err)
	}
	// Prepared once: a file on disk, and a process in memory.
	if _, _, _, err := c.Output(ctx, "prep", "sh", "-c", "echo ready > /home/loam/state; setsid sleep 4000 >/dev/null 2>&1 </dev/null &"); err != nil {
		log.Fatal(err)
	}
	// Until the background sleep runs.
	for {
		if _, _, code, err := c.Output(ctx, "prep", "sh", "-c", "ps -o args | grep -qx 'sleep 4000'"); err != nil {
			log.Fatal(err)
		} else if code == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	disk, err := c.CreateCheckpoint(ctx, "prep", api.CreateCheckpoint{Memory: new(bool)})
	if err != nil {
		log.Fatal(err)
	}
	mem, err := c.CreateCheckpoint(ctx, "prep", api.CreateCheckpoint{})
	if err != nil {
		log.Fatal(err)
	}
	for name, cp := range map[string]string{"prep-disk": disk.ID, "prep-warm": mem.ID} {
		tpl, err := c.CreateTemplate(ctx, name, "prep", cp)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(tpl.Name, tpl.Kind, "memory:", tpl.Memory)
	}
	// The templates outlive their sandbox.
	if err := c.DeleteSandbox(ctx, "prep"); err != nil {
		log.Fatal(err)
	}

	for _, tpl := range []string{"prep-disk", "prep-warm"} {
		name := "from-" + tpl
		if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: name, Template: tpl}); err != nil {
			log.Fatal(err)
		}
		out, _, _, err := c.Output(ctx, name, "sh", "-c", "cat /home/loam/state; ps -o args | grep -qx 'sleep 4000' && echo sleep runs || echo booted fresh")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: %s\n", name, strings.Join(strings.Fields(string(out)), " "))
		if err := c.DeleteSandbox(ctx, name); err != nil {
			log.Fatal(err)
		}
	}

	// Export, and import (here into the same daemon, under another name).
	var archive bytes.Buffer
	if _, err := c.ExportTemplate(ctx, "prep-disk", &archive); err != nil {
		log.Fatal(err)
	}
	if _, err := c.ImportTemplate(ctx, "prep-copy", bytes.NewReader(archive.Bytes())); err != nil {
		log.Fatal(err)
	}
	damaged := bytes.Clone(archive.Bytes())
	damaged[len(damaged)/2] ^= 0xff
	_, err = c.ImportTemplate(ctx, "prep-bad", bytes.NewReader(damaged))
	fmt.Println("damaged archive refused:", errors.Is(err, api.ErrInvalid))

	for _, tpl := range []string{"prep-disk", "prep-warm", "prep-copy"} {
		if err := c.DeleteTemplate(ctx, tpl); err != nil {
			log.Fatal(err)
		}
	}
	// Unordered output:
	// prep-disk checkpoint memory: false
	// prep-warm checkpoint memory: true
	// from-prep-disk: ready booted fresh
	// from-prep-warm: ready sleep runs
	// damaged archive refused: true
}
